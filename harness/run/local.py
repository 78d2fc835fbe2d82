"""The local backend: the engines of the matrix on this machine, ``ctx.capacity.jobs`` at a time (on the CPU
platform ``ctx.capacity.scenarios`` of them in their scenarios, the others starting up: harness.run.turns).

Environments are built ``ctx.build_jobs`` at a time in the background; an engine starts as soon as its
version's env is ready and a job (and on cuda, GPU slots) is free, in plan order, so a slow env build or a
failed engine never holds up the others.  With one job this is the sequential run of before.
"""

from __future__ import annotations

import queue as queues
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from harness.core.cell import EngineKey
from harness.core.errors import EnvBuildError
from harness.core.events import EngineEvent, Event
from harness.core.oracle import Outcome
from harness.envbuild.envs import VllmEnv, ensure_env
from harness.run.context import BackendReport, CellSink, EngineWork, Progress, RunContext, env_facts
from harness.run.cores import BIND_VAR, bind_env, pipeline_pool
from harness.run.runner import run_engine
from harness.run.slots import Capacity, Slots, engine_start, runs_alone
from harness.run.spec import weight_transfer
from harness.run.turns import ScenarioTurns
from harness.verdicts.results import CellResult, infra_result


class LocalBackend:
    """Engines run here, side by side up to the run's capacity."""

    def run(self, engines: Sequence[EngineWork], ctx: RunContext, record: CellSink) -> BackendReport:
        versions = list(dict.fromkeys(key.version for key, _ in engines))
        pool = ThreadPoolExecutor(max_workers=max(1, ctx.build_jobs), thread_name_prefix="env-build")
        builds: dict[str, Future[VllmEnv]] = {
            # Recipes here, in the caller's thread: a bad one is the caller's error, not a build failure.
            v: pool.submit(ensure_env, ctx.recipe(v), ctx.cache_dir, lambda m: ctx.say(Progress("env", m)))
            for v in versions if v not in ctx.prebuilt
        }
        run = _LocalRun(ctx, record, builds)
        try:
            run.all(list(engines))
        finally:
            for f in builds.values():
                f.cancel()
            pool.shutdown(wait=True)
        return BackendReport({v: run.envs[v] for v in versions if v in run.envs}, len(engines))


class _LocalRun:
    """One run's engines: which wait, which run, on which GPUs."""

    def __init__(self, ctx: RunContext, record: CellSink, builds: dict[str, Future[VllmEnv]]) -> None:
        self.ctx, self.record, self.builds = ctx, record, builds
        self.cap: Capacity = ctx.capacity
        self.slots = Slots(self.cap)
        self.envs: dict[str, dict[str, Any]] = {}
        self.ready: dict[str, VllmEnv] = {}
        # Start-up locks per GPU: held from spawn to "engine ready" where a fixed KV cache is not available.
        self.startup = {g: threading.Lock() for g in self.cap.gpus}
        # Set on Ctrl-C/SIGTERM in the main thread: every engine thread stops its engine at once.
        self.cancel = threading.Event()
        # Fewer engines in their scenarios than engines started (the CPU platform's pipeline).
        self.turns = ScenarioTurns(self.cap.scenarios) if 0 < self.cap.scenarios < self.cap.jobs else None
        # Pipelined on CPU, each engine's OpenMP threads on cores of its own (vLLM's `auto` puts them all on core 0).
        self.cores = pipeline_pool(ctx.cfg.platform, self.cap.jobs, self.turns is not None, ctx.cfg.extra_env)
        self.core_of: dict[Future[None], tuple[int, ...] | None] = {}
        # Pipelined, an engine whose cells are all judged gives its job back before its teardown (vLLM's shutdown,
        # 4-7 s on 2 idle cores, 20-40 s loaded: docs/performance.md), so the next engine starts meanwhile.
        self.futures: dict[str, Future[None]] = {}
        self.judged: queues.SimpleQueue[str] = queues.SimpleQueue()
        self.tearing: set[Future[None]] = set()

    def all(self, queue: list[EngineWork]) -> None:
        running: dict[Future[None], tuple[tuple[str, ...], bool]] = {}
        threads = self.cap.jobs * (2 if self.turns is not None else 1)  # a thread per engine tearing down too
        with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="engine") as pool:
            try:
                self._loop(queue, running, pool)
            except BaseException:
                self.cancel.set()  # the pool's exit then waits only for engines being killed
                raise

    def _loop(self, queue: list[EngineWork], running: dict[Future[None], tuple[tuple[str, ...], bool]],
              pool: ThreadPoolExecutor) -> None:
        while queue or running or self.tearing:
            self._judged(running)
            started = self._start(queue, running, pool, block=False)
            if not started and not running and queue:
                # Nothing runs and nothing could start: wait for the first engine's env to be built.
                self._start(queue, running, pool, block=True)
                continue
            building = [f for v, f in self.builds.items() if v not in self.envs and not f.done()]
            waiting: list[Future[Any]] = [*running, *self.tearing, *building]
            done, _ = wait(waiting, timeout=1.0, return_when=FIRST_COMPLETED)
            for f in done & running.keys():
                self._give(f, running)
                f.result()  # a harness bug in an engine thread surfaces here
            for f in done & self.tearing:
                self.tearing.discard(f)
                f.result()

    def _judged(self, running: dict[Future[None], tuple[tuple[str, ...], bool]]) -> None:
        """The engines whose every cell has its result and that now tear down: their jobs are free again."""
        while not self.judged.empty():
            f = self.futures[self.judged.get()]
            if f in running:
                self._give(f, running)
                self.tearing.add(f)

    def _give(self, f: Future[None], running: dict[Future[None], tuple[tuple[str, ...], bool]]) -> None:
        """An engine's job (GPU slots, core set) is free again: it ended, or it is judged and tears down."""
        self.slots.give(*running.pop(f))
        if self.cores is not None:
            self.cores.give(self.core_of.pop(f, None))

    def _start(self, queue: list[EngineWork], running: dict[Future[None], tuple[tuple[str, ...], bool]],
               pool: ThreadPoolExecutor, block: bool) -> int:
        """Start, in plan order, every queued engine whose env is ready and for which a slot is free."""
        started = 0
        for work in list(queue):
            state = self._env_state(work[0].version, block)
            if state == "failed":
                queue.remove(work)
                self._build_failed(work)
            if state != "ready":
                continue
            alone = runs_alone(work[0]) and self._need(work) > 0
            gpus = self.slots.take(self._need(work), alone)
            if gpus is None:
                continue
            queue.remove(work)
            cores = self.cores.take() if self.cores is not None and work[0].tier == "engine" else None
            f = pool.submit(self._engine, work, gpus, alone, cores)
            running[f], self.futures[work[0].id], self.core_of[f] = (gpus, alone), f, cores
            started += 1
            block = False  # only the first engine's env is waited for
        return started

    def _env_state(self, version: str, block: bool) -> str:
        """``ready``, ``wait`` (still building; with ``block`` waited for) or ``failed``."""
        if version in self.ready:
            return "ready"
        if version in self.envs:
            return "failed"
        build = self.builds.get(version)
        if build is not None and not build.done() and not block:
            return "wait"
        self.ctx.say(Progress("env", f"environment for vLLM {version}"))
        try:
            env = self.ctx.prebuilt[version] if build is None else build.result()
        except (EnvBuildError, OSError) as exc:
            self.envs[version] = {"error": str(exc)}
            return "failed"
        self.ready[version], self.envs[version] = env, env_facts(env)
        return "ready"

    def _build_failed(self, work: EngineWork) -> None:
        why = f"environment build failed: {self.envs[work[0].version]['error']}"
        for c in work[1]:
            self.record(infra_result(c, Outcome.BUILD_FAILED, why))

    def _need(self, work: EngineWork) -> int:
        """GPUs an engine needs: its TP size, and one more for a weight-sync trainer sending over NCCL."""
        key, cells = work
        if self.ctx.cfg.platform != "cuda" or not self.cap.gpus or key.tier == "scheduler":
            return 0  # the scheduler tier runs vLLM's scheduler on the CPU, whatever the platform
        nccl = any(c.scenario == "weight-sync" and weight_transfer(c, self.ctx.cfg) == "nccl" for c in cells)
        return min(key.tp + (1 if nccl else 0), len(self.cap.gpus))

    def _engine(self, work: EngineWork, gpus: tuple[str, ...], alone: bool, cores: tuple[int, ...] | None) -> None:
        key, cells = work
        env = self.ready[key.version]
        start = engine_start(self.cap, gpus, env, alone)
        locks = [self.startup[g] for g in start.startup_locks]
        for lock in locks:
            lock.acquire()
        held = list(locks)

        def on_event(k: EngineKey, ev: Event) -> None:
            if isinstance(ev, EngineEvent):  # ready (or refused): the next engine on these GPUs may start
                while held:
                    held.pop().release()
            self.ctx.event(k, ev)

        where = f" on GPU {','.join(gpus)}{' (alone)' if alone else ''}" if gpus else ""
        bind = bind_env(cores, key.tp)
        if bind:
            where += f" on cores {bind[BIND_VAR]}"
        self.ctx.say(Progress("engine-start", f"engine {key.id}: {len(cells)} scenario(s){where}", key))
        left = {c.id for c in cells}

        def on_result(res: CellResult) -> None:
            self.record(res)
            left.discard(res.id)
            if not left and self.turns is not None:  # every cell final: the rest is the engine's teardown
                self.judged.put(key.id)

        try:
            run_engine(env, key, cells, self.ctx.cfg, on_event=on_event, on_result=on_result,
                       extra_env={"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else (bind or None),
                       engine_extra=start.engine_extra, cancel=self.cancel, turns=self.turns)
        finally:
            while held:
                held.pop().release()

