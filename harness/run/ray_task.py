"""What runs on a Ray node for one engine config (``harness.run.cluster`` submits it): the task, the mailbox
actor it streams to, the reaper that outlives a killed worker, and the worker-environment fix.

The task builds or reuses the vLLM env *on its node* (``ensure_env``, that node's cache) and calls
``run_engine`` there; every engine event and cell result goes to the mailbox the moment it is reported.
Because a killed worker cannot run its ``finally``, each task starts a reaper: a tiny process in its own
session holding the read end of a pipe from the worker; EOF without "done" means the worker died, and the
reaper kills the engine's process group.
"""

from __future__ import annotations

import contextlib
import os
import platform as _platform
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.core.cell import Cell, EngineKey
from harness.core.errors import EnvBuildError
from harness.core.events import Event, StartEvent
from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe, VllmEnv, default_cache_dir, ensure_env
from harness.run.context import env_facts
from harness.run.runner import run_engine
from harness.run.spec import RunConfig
from harness.verdicts.results import infra_result

ENGINE_FILES = ("spec.json", "events.jsonl", "engine.log")
MAX_SHIPPED_BYTES = 8 * 1024**2  # per engine file copied back from a node without the driver's file system

# Variables a Ray worker sets for itself that must not leak into the engine:
# RAY_* would point the vLLM env's own Ray (a different version, used by the
# ray-v1/ray-v2 executors) at this harness's cluster.
_RAY_WORKER_VARS = ("SPT_NOENV",)
_RAY_BREAKPOINT = "ray.util.rpdb.set_trace"


def engine_environ_changes(worker_env: Mapping[str, str], driver_omp: str | None) -> dict[str, str | None]:
    """Edits (value, or None to delete) that turn a Ray worker's environment into the driver's engine environment.

    Ray sets ``OMP_NUM_THREADS`` to the task's CPU count (1) when it is unset;
    a local engine would not see it, and vLLM's CPU backend
    sizes its OpenMP pool from it, so it is restored to the driver's value.
    """
    changes: dict[str, str | None] = {k: None for k in worker_env if k.startswith("RAY_") or k in _RAY_WORKER_VARS}
    if worker_env.get("PYTHONBREAKPOINT") == _RAY_BREAKPOINT:
        changes["PYTHONBREAKPOINT"] = None
    if worker_env.get("OMP_NUM_THREADS") != driver_omp:
        changes["OMP_NUM_THREADS"] = driver_omp
    return changes


@contextlib.contextmanager
def _environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    # run_engine builds the engine's environment from os.environ.  A Ray worker
    # runs one task at a time, and the old values come back before the next.
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# The reaper runs apart from the harness (python -c): argv[1] is the
# engine's work dir.  Lines on stdin: "pgid N" (from the engine's start event)
# and "done" (the task ended normally; run_engine already killed the engine).
# EOF without "done" means the Ray worker died: kill every registered group and
# every process of this engine (cwd is its work dir and its environment is an
# engine's), which also covers a worker killed before the start event arrived.
REAPER_SOURCE = r"""
import os, select, signal, sys, time
wd = os.path.realpath(sys.argv[1])
groups = set()
# What only a clean exit removes: the engines' ipc folders and the /dev/shm files they made (harness.run.leftovers,
# from argv[2], standard library only), read while they live (on registration, every second, at the EOF).  Without
# it the reaper still kills.
try:
    sys.path.insert(0, sys.argv[2])
    from harness.run.leftovers import Leftovers, ShmSnapshot, pids_in
    shm_before, known = ShmSnapshot.now(), Leftovers()
except Exception:
    pids_in = None
os.write(1, b"ready\n")  # Reaper() waits for it: the engine starts after the snapshot
os.close(1)
def scan():
    global known
    if pids_in is not None and groups:
        known = known | Leftovers.of(pids_in(groups))
buf = b""
while True:
    if not select.select([0], [], [], 1.0)[0]:
        scan()
        continue
    chunk = os.read(0, 4096)
    if not chunk:
        break
    buf += chunk
    *lines, buf = buf.split(b"\n")
    for line in lines:
        word, _, arg = line.decode(errors="replace").partition(" ")
        if word == "done":
            sys.exit(0)
        if word == "pgid":
            groups.add(int(arg))
            scan()
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    try:
        if os.readlink(f"/proc/{entry}/cwd") != wd:
            continue
        with open(f"/proc/{entry}/environ", "rb") as f:
            if b"VLLM_REPRO_CPU_ASYNC=" not in f.read():
                continue
        groups.add(os.getpgid(int(entry)))
    except OSError:
        continue
groups.discard(os.getpgid(0))
scan()
# Removed first, while the engine still runs (its mappings stay valid until it dies): Ray's raylet, the subreaper
# of a dead worker's orphans, kills them and this reaper within 10 s ("Will kill unknown children every 10
# seconds", Ray 2.60), maybe before the engine is gone.
if pids_in is not None:
    known.remove(shm_before)
def alive(g):
    try:
        os.killpg(g, 0)
        return True
    except OSError:
        return False
for g in groups:
    try:
        os.killpg(g, signal.SIGTERM)
    except OSError:
        pass
deadline = time.monotonic() + 5
while time.monotonic() < deadline and any(alive(g) for g in groups):
    time.sleep(0.1)
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
"""


class Reaper:
    """Kills an engine's process group if the process that started it dies first (see ``REAPER_SOURCE``)."""

    def __init__(self, work_dir: Path) -> None:
        # Own session: whatever kills the Ray worker's process group spares it.
        self.proc = subprocess.Popen(
            [sys.executable, "-c", REAPER_SOURCE, str(work_dir), str(Path(__file__).resolve().parents[2])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        # Its snapshot of /dev/shm is taken before the engine starts: wait for its "ready" (or its end).
        assert self.proc.stdout is not None
        self.proc.stdout.readline()
        self.proc.stdout.close()

    def watch(self, pgid: int) -> None:
        assert self.proc.stdin is not None
        # A reaper that is gone costs the backstop, never the engine's run.
        with contextlib.suppress(OSError):
            self.proc.stdin.write(f"pgid {pgid}\n".encode())
            self.proc.stdin.flush()

    def stand_down(self) -> None:
        """The engine is gone by the caller's own hand: let the reaper exit without killing."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(b"done\n")
            self.proc.stdin.close()
        self.proc.wait()


@dataclass(frozen=True)
class EngineJob:
    """Everything one Ray task needs to run one engine config on whatever node Ray picks."""

    key: EngineKey
    cells: tuple[Cell, ...]
    cfg: RunConfig
    recipe: EnvRecipe | None  # None when ``env`` is given
    env: VllmEnv | None  # a prebuilt env at the same path on every node
    cache_dir: Path  # the driver's cache; used only where the driver's file system is visible
    marker: Path  # a file in the driver's work dir: its presence means a shared file system
    run_id: str
    driver_omp: str | None


class Mailbox:
    """Actor body: tasks push ``(engine_id, kind, payload)``; the driver drains in arrival order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, Any]] = []

    def put(self, item: tuple[str, str, Any]) -> None:
        self.items.append(item)

    def drain(self) -> list[tuple[str, str, Any]]:
        out, self.items = self.items, []
        return out


def run_engine_job(job: EngineJob, mailbox: Any) -> dict[str, Any]:
    """The Ray task: build/reuse the env on this node, run the engine, stream events and results."""
    import ray

    last: list[Any] = []

    def post(kind: str, payload: Any) -> None:
        # Not waited for: Ray gives a task's CPU to another task while it
        # blocks in ray.get, which would start more engines than the cluster
        # has CPUs.  Calls from one caller run on the actor in order.
        last[:] = [mailbox.put.remote((job.key.id, kind, payload))]

    def flush() -> None:
        # Everything this task posted is in the mailbox before its result is.
        if last:
            ray.get(last[0])

    shared = job.marker.exists()
    cache = job.cache_dir if shared else default_cache_dir()
    cfg = job.cfg if shared else replace(job.cfg, work_dir=cache / "cluster-work" / job.run_id,
                                         model_cache=cache / "models")
    if cfg.platform == "cuda":
        # The engine sees exactly the GPUs Ray gave this task (CUDA_VISIBLE_DEVICES), not the driver's.
        cfg = replace(cfg, n_gpus=len(ray.get_gpu_ids()))
    node = {"node_id": ray.get_runtime_context().get_node_id(), "host": _platform.node(), "shared_fs": shared,
            "worker_pid": os.getpid(), "work_dir": str(cfg.work_dir)}
    post("node", node)
    try:
        env = job.env or ensure_env(job.recipe, cache, lambda m: post("env", m))  # type: ignore[arg-type]
    except (EnvBuildError, OSError) as exc:
        reason = f"environment build failed on {node['host']}: {exc}"
        flush()
        return {"node": node, "env": {"error": str(exc), "host": node["host"]},
                "results": [infra_result(c, Outcome.BUILD_FAILED, reason).to_dict() for c in job.cells]}
    facts = env_facts(env)
    env_info = {"path": facts.pop("path"), "host": node["host"], **facts}  # the key order of earlier reports
    wd = (cfg.work_dir / "engines" / job.key.id).resolve()

    def on_event(_key: EngineKey, ev: Event) -> None:
        if isinstance(ev, StartEvent):
            reaper.watch(ev.pgid)
        post("event", ev)  # the typed event (Ray pickles it)

    reaper = Reaper(wd)
    try:
        with _environ(engine_environ_changes(os.environ, job.driver_omp)):
            results = run_engine(env, job.key, job.cells, cfg, on_event=on_event,
                                 on_result=lambda r: post("result", r.to_dict()))
    finally:
        # Reached on success, on an exception and on ray.cancel's
        # KeyboardInterrupt alike; run_engine's own finally killed the group.
        reaper.stand_down()
    flush()
    return {"node": node, "env": env_info, "results": [r.to_dict() for r in results],
            "files": {} if shared else _engine_files(wd)}


def _engine_files(wd: Path) -> dict[str, str]:
    # The driver cannot read this node's disk: the engine's spec, events and
    # log travel back with the result (the log's tail if it is huge).
    out = {}
    for name in ENGINE_FILES:
        with contextlib.suppress(OSError), open(wd / name, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - MAX_SHIPPED_BYTES))
            out[name] = f.read().decode("utf-8", errors="replace")
    return out
