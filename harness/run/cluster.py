"""The Ray backend (``--cluster ray[:ADDRESS]``): one Ray task per engine config.

:class:`RayBackend` is a ``harness.run.context.Backend``: ``harness.run.execute``
runs the same matrix loop on it as on the local backend; what changes is
where an engine runs:

* Each engine config is one Ray task asking for ``num_cpus=1`` and
  ``num_gpus=tp`` (0 on CPU).  The task builds or reuses the vLLM env *on its
  node* (``ensure_env``, that node's cache) and calls ``run_engine`` there, so
  no shared file system is needed.  The ``harness`` and ``repro`` packages
  travel as the job's ``working_dir``; a node needs only Python, Ray and the
  harness's own dependencies (rich, packaging, uv).
* Results stream: the task pushes every engine event and every cell result to
  a small mailbox actor the moment ``run_engine`` reports it; the driver
  drains it and appends each result to the ``ResultsLog`` at once.
* Isolation is kept: inside the task the engine still runs in its own process
  group with the engine timeout (``run_engine``).  A task that dies (worker
  killed, node lost, OOM) makes every cell of that engine not yet reported
  ERROR with the Ray error; the other tasks go on.  Because a killed worker
  cannot run its ``finally``, each task starts a *reaper*: a tiny process in
  its own session holding the read end of a pipe from the worker.  EOF without
  "done" means the worker died, and the reaper kills the engine's process
  group.
* Ctrl-C or an error in the driver cancels every task (``ray.cancel`` raises
  KeyboardInterrupt inside it, so ``run_engine``'s ``finally`` kills the
  engine), force-cancels what does not end within a grace period (the reapers
  clean up), and shuts down a Ray the run started itself.  Ctrl-C and SIGTERM
  are deferred (``harness.run.deferred``): the driver never blocks in Ray for
  more than ``POLL_S`` at a time, acts on the signal between waits, and gives
  ``ray.shutdown`` a bounded time (it can hang: ray-project/ray#44836); a
  Ctrl-C during a grace period or the shutdown cuts it short.

The task's side (what runs on a node: the job, the mailbox, the reaper) is ``harness.run.ray_task``.
Ray is imported lazily: the harness does not depend on it unless ``--cluster``
is used (``pip install 'vllm-repro[cluster]'``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import platform as _platform
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.core.cell import Cell, EngineKey
from harness.core.errors import BadInput, ReproError
from harness.core.events import StartEvent
from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe
from harness.run.context import (
    BackendReport,
    CellSink,
    EngineWork,
    Progress,
    RunContext,
)
from harness.run.deferred import DeferredInterrupts, call_bounded, join_bounded
from harness.run.engine_process import kill_engine_group
from harness.run.ray_task import ENGINE_FILES, EngineJob, Mailbox, run_engine_job
from harness.verdicts.results import CellResult, infra_result

INSTALL_HINT = "pip install 'vllm-repro[cluster]'"
CLUSTER_FORMS = ("ray", "ray:auto", "ray:HOST:PORT")
# Small: the object store only carries event dicts and cell results.
LOCAL_OBJECT_STORE_BYTES = 128 * 1024**2
CANCEL_GRACE_S = 30.0  # run_engine's kill_group waits up to 10 s per engine
POLL_S = 0.25  # driver: the longest one Ray call blocks before the mailbox is drained and signals are looked at
DRAIN_S = 10.0  # after a cancel: how long the mailbox may take to hand over what the engines last reported
SHUTDOWN_S = 60.0  # ray.shutdown; past this (or on a Ctrl-C meanwhile) the local cluster's processes are killed
SHUTDOWN_KILLED_S = 90.0  # ... and then, how long its shutdown may take to notice they are gone (or a Ctrl-C)

_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class ClusterError(ReproError):
    """The Ray cluster could not be started or reached."""


@dataclass(frozen=True)
class ClusterTarget:
    """Where engine tasks go: ``address`` None starts a local Ray for the run."""

    backend: str
    address: str | None

    @property
    def label(self) -> str:
        return self.address or "local"


def parse_cluster(value: str) -> ClusterTarget:
    """Parse the CLI form ``ray`` (a local Ray for this run), ``ray:auto`` or ``ray:HOST:PORT`` (the GCS address).

    The driver must run on a node of the cluster; Ray Client (``ray://``)
    addresses are refused: untested here, and they need ``ray[client]``.
    """
    forms = ", ".join(CLUSTER_FORMS)
    backend, sep, rest = value.strip().partition(":")
    if backend != "ray":
        raise BadInput(f"unknown cluster backend in --cluster {value!r}; valid forms: {forms}")
    if not sep:
        return ClusterTarget("ray", None)
    if rest == "auto":
        return ClusterTarget("ray", "auto")
    if rest.startswith("ray://"):
        raise BadInput(f"Ray Client addresses are not supported in --cluster {value!r}: run vllm-repro on a node "
                       f"of the cluster and give its GCS address; valid forms: {forms}")
    m = _HOST_PORT.match(rest)
    if not m or not 0 < int(m.group(1)) < 65536:
        raise BadInput(f"bad Ray address in --cluster {value!r}: expected HOST:PORT with a port in 1-65535, "
                       f"or 'auto'; valid forms: {forms}")
    return ClusterTarget("ray", rest)


def import_ray() -> ModuleType:
    """The ``ray`` module, or a ReproError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise BadInput(f"--cluster ray needs Ray in the harness's Python ({sys.executable}): "
                       f"{INSTALL_HINT}") from exc
    return ray


def task_resources(key: EngineKey, platform: str) -> dict[str, float]:
    """What one engine's task asks Ray for: one CPU, and ``tp`` GPUs on CUDA."""
    return {"num_cpus": 1.0, "num_gpus": float(key.tp) if platform == "cuda" else 0.0}


def unplaceable_reason(need: Mapping[str, float], nodes: Sequence[Mapping[str, float]], label: str) -> str | None:
    """Why no node of the cluster can ever run a task needing ``need``, or None if one can.

    Ray would leave such a task pending forever; the cell is UNSUPPORTED instead.
    """
    want = {"CPU": need.get("num_cpus", 0.0), "GPU": need.get("num_gpus", 0.0)}
    want = {k: v for k, v in want.items() if v > 0}
    if any(all(node.get(k, 0.0) >= v for k, v in want.items()) for node in nodes):
        return None
    have = ", ".join(f"{node.get('CPU', 0):g} CPU/{node.get('GPU', 0):g} GPU" for node in nodes) or "no alive node"
    asked = " and ".join(f"{v:g} {k}" for k, v in want.items())
    return f"no node of the Ray cluster ({label}) offers {asked} for one engine (nodes: {have})"


def _stage_packages(dst: Path) -> Path:
    """Copy ``harness`` and ``repro`` side by side into ``dst`` (the job's working_dir).

    ``harness.run.runner`` finds ``repro`` next to ``harness``, so they travel together.
    """
    root = Path(__file__).resolve().parents[2]
    for pkg in ("harness", "repro"):
        shutil.copytree(root / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def connect_failure(address: str | None, exc: BaseException) -> str:
    """The one-line message for a ``ray.init`` that failed, with the likely fix."""
    if address is None:
        return f"cannot start a local Ray: {_ray_error_text(exc)}"
    chain, seen = [], set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(f"{type(e).__name__} {e}")
        e = e.__cause__ or e.__context__
    if any("AuthenticationError" in t or "InvalidAuthToken" in t for t in chain):
        # Ray enables token auth on a cluster started where a token exists,
        # but never for a driver given an explicit address.
        fix = ("the cluster uses token authentication: set RAY_AUTH_MODE=token and make the cluster's token "
               "available here (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)")
    else:
        fix = "check `ray status` on the head node, or use --cluster ray to start a local Ray"
    return f"cannot connect to the Ray cluster at {address}: {_ray_error_text(exc)}; {fix}"


def _ray_error_text(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = " | ".join(lines[:3])
    return f"{type(exc).__name__}: {text[:600]}"


class RayBackend:
    """Every engine config of the matrix as a Ray task; results stream back through a mailbox actor.

    ``address`` None or "" starts a local Ray for this run (shut down at the
    end); anything else is passed to ``ray.init(address=...)`` ("auto",
    "HOST:PORT" of the cluster's GCS).  ``ctx.prebuilt`` maps versions to envs
    that exist at the same path on every node (nothing is built for them).
    The run's meta gets ``cluster``: address, Ray version, nodes, resources and
    where each engine ran.
    """

    def __init__(self, address: str | None) -> None:
        self.address = address or None

    def run(self, engines: Sequence[EngineWork], ctx: RunContext, record: CellSink) -> BackendReport:
        # Absolute: a task's working directory is Ray's copy of the packages, not ours.
        cfg = replace(ctx.cfg, work_dir=ctx.cfg.work_dir.resolve(), model_cache=ctx.cfg.model_cache.resolve())
        run = _RayRun(replace(ctx, cfg=cfg, cache_dir=ctx.cache_dir.resolve()), record,
                      {"backend": "ray", "address": self.address or "local", "started_local": not self.address,
                       "nodes": [], "resources": {}, "tasks": {}})
        if engines:
            _run_on_ray(run, engines, self.address)
        # engine_starts: engines submitted (none for an unplaceable config)
        return BackendReport(run.envs, len(run.cluster["tasks"]), {"cluster": run.cluster})


@dataclass
class _RayRun:
    """The driver's state of one cluster run, filled in as tasks are submitted and report."""

    ctx: RunContext
    record: CellSink
    cluster: dict[str, Any]  # meta: address, nodes, resources, tasks
    envs: dict[str, dict[str, Any]] = field(default_factory=dict)  # env facts per version
    by_id: dict[str, EngineKey] = field(default_factory=dict)
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)  # engine id -> node info and pgid, from its messages
    driver_node: str = ""
    interrupts: DeferredInterrupts = field(default_factory=DeferredInterrupts)
    draining: Any = None  # the mailbox drain asked for and not yet handled: its items must not be lost

    def handle(self, items: list[tuple[str, str, Any]]) -> None:
        """Messages drained from the mailbox: results are recorded, the rest becomes progress."""
        for eid, kind, payload in items:
            key = self.by_id[eid]
            if kind == "result":
                self.record(CellResult.from_dict(payload))
            elif kind == "event":
                if isinstance(payload, StartEvent):
                    self.seen.setdefault(eid, {})["pgid"] = payload.pgid
                self.ctx.event(key, payload)
            elif kind == "node":
                self.seen.setdefault(eid, {}).update(payload)
                self.cluster["tasks"][eid].update(payload)
                self.ctx.say(Progress("engine-start", f"engine {eid} running on {payload['host']}", key))
            elif kind == "env":
                self.ctx.say(Progress("env", f"[{eid}] {payload}", key))


def _run_on_ray(run: _RayRun, engines: Sequence[EngineWork], address: str | None) -> None:
    cfg = run.ctx.cfg
    ray = import_ray()
    if ray.is_initialized():
        raise ClusterError("Ray is already initialised in this process; vllm-repro connects itself: pass the "
                           "cluster as --cluster ray:HOST:PORT and do not call ray.init() before the run")
    run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:8]}"
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    marker = (cfg.work_dir / f".vllm-repro-cluster-{run_id}").resolve()
    marker.write_text(f"{_platform.node()}\n")
    stage = Path(tempfile.mkdtemp(prefix="vllm-repro-ray-pkg-"))
    try:
        with run.interrupts:
            _stage_packages(stage)
            _init_ray(ray, run, stage, address)
            try:
                run.interrupts.check()
                pending = _submit(ray, run, engines, marker, run_id)
                _collect(ray, run, pending)
            finally:
                # Disconnects from a cluster we joined; stops the one we started.
                _shutdown(ray, run.interrupts)
    finally:
        marker.unlink(missing_ok=True)
        shutil.rmtree(stage, ignore_errors=True)


def _shutdown(ray: ModuleType, interrupts: DeferredInterrupts) -> None:
    """``ray.shutdown``, bounded: it can block for good (ray-project/ray#44836: with a GCS that does not answer,
    it waits in a gRPC call without a deadline, where no Ctrl-C reaches it), and the run must still end."""
    node = getattr(ray._private.worker, "_global_node", None)  # the local cluster this run started, if any
    stopping = call_bounded(ray.shutdown, SHUTDOWN_S, interrupts, "vllm-repro-ray-shutdown")
    if not stopping.is_alive():
        return
    # Its atexit hook would wait for the lock the stuck call holds, and the interpreter would never exit.
    atexit.unregister(ray.shutdown)
    # What its shutdown would have stopped: the GCS, the raylet (its workers exit with it; their reapers then
    # kill any engine left), the dashboard and monitors.
    for infos in list(getattr(node, "all_processes", {}).values()):
        for info in infos:
            with contextlib.suppress(OSError, AttributeError):
                info.process.kill()
    # With its peers gone, the call it waited in fails and its shutdown ends: let it, or the interpreter's
    # exit would tear Ray's core down under that thread (a crash at exit instead of the run's exit status).
    # Not always at once: Ray's core retries the lost GCS for up to gcs_rpc_server_reconnect_timeout_s (60 s).
    join_bounded(stopping, SHUTDOWN_KILLED_S, interrupts)


def _init_ray(ray: ModuleType, run: _RayRun, stage: Path, address: str | None) -> None:
    init: dict[str, Any] = {"runtime_env": {"working_dir": str(stage)}, "logging_level": logging.WARNING,
                            "log_to_driver": False}
    if address is None:
        # A throwaway single-node cluster: no dashboard, a small object store.
        init.update(object_store_memory=LOCAL_OBJECT_STORE_BYTES, include_dashboard=False)
    else:
        init["address"] = address
    doing = "starting a local cluster" if address is None else f"connecting to {address}"
    run.ctx.say(Progress("env", f"Ray: {doing}"))
    # ray.init installs its own SIGTERM handler; the CLI's (SIGTERM = Ctrl-C,
    # so the cleanup below runs and the run ends "interrupted") must stay.
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**init)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        raise ClusterError(connect_failure(address, exc)) from exc
    finally:
        if sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)


def _describe_cluster(ray: ModuleType, run: _RayRun) -> list[dict[str, float]]:
    """Fill in the cluster's meta and the driver's node; the resources of every alive node."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    run.cluster["ray_version"] = ray.__version__
    run.cluster["nodes"] = [{"node_id": n.get("NodeID"), "host": n.get("NodeManagerHostname"),
                             "address": n.get("NodeManagerAddress"),
                             "resources": {k: v for k, v in (n.get("Resources") or {}).items()
                                           if k in ("CPU", "GPU", "memory", "object_store_memory")}} for n in nodes]
    run.cluster["resources"] = {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
    with contextlib.suppress(Exception):  # unknown node: the mailbox goes wherever Ray puts it
        run.driver_node = ray.get_runtime_context().get_node_id()
    return [n.get("Resources") or {} for n in nodes]


def _submit(ray: ModuleType, run: _RayRun, engines: Sequence[EngineWork], marker: Path,
            run_id: str) -> tuple[Any, dict[Any, EngineWork]]:
    """Start the mailbox and one task per placeable engine config: (mailbox, pending task -> its engine)."""
    ctx = run.ctx
    node_resources = _describe_cluster(ray, run)
    mailbox_opts: dict[str, Any] = {"num_cpus": 0}
    if run.driver_node:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On the driver's node: the mailbox is lost only with the driver's node.
        mailbox_opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(run.driver_node, soft=True)
    mailbox = ray.remote(**mailbox_opts)(Mailbox).remote()
    task = ray.remote(run_engine_job)
    pending: dict[Any, EngineWork] = {}
    recipes: dict[str, EnvRecipe] = {}
    for key, cells in engines:
        need = task_resources(key, ctx.cfg.platform)
        why = unplaceable_reason(need, node_resources, str(run.cluster["address"]))
        if why:
            for c in cells:
                run.record(infra_result(c, Outcome.UNSUPPORTED, why))
            continue
        env = ctx.prebuilt.get(key.version)
        if env is None and key.version not in recipes:
            recipes[key.version] = ctx.recipe(key.version)
        job = EngineJob(key, cells, ctx.cfg, None if env else recipes[key.version], env, ctx.cache_dir, marker,
                        run_id, os.environ.get("OMP_NUM_THREADS"))
        # max_retries=0: a rerun after a crash would hide it and double-log cells.
        pending[task.options(max_retries=0, **need).remote(job, mailbox)] = (key, cells)
        run.by_id[key.id] = key
        run.cluster["tasks"][key.id] = {"resources": need}
        ctx.say(Progress("engine-start", f"engine {key.id}: {len(cells)} scenario(s) submitted as a Ray task "
                         f"({need['num_cpus']:g} CPU, {need['num_gpus']:g} GPU)", key))
    return mailbox, pending


def _collect(ray: ModuleType, run: _RayRun, submitted: tuple[Any, dict[Any, EngineWork]]) -> None:
    """Drain the mailbox and finish tasks until none is pending; cancel what is left on the way out.

    Every Ray call here returns within ``POLL_S``; a Ctrl-C noted meanwhile is acted on between them.
    """
    mailbox, pending = submitted
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            # Drained after the wait: whatever a finished task posted is handled before its return value.
            while not _drain(ray, run, mailbox, POLL_S):
                run.interrupts.check()
                ready = []  # the tasks stay pending until their messages are in
            for ref in ready:
                key, cells = pending.pop(ref)
                _finish(ray, run, ref, key, cells)
            run.interrupts.check()
    finally:
        if pending:
            _cancel(ray, list(pending), run.interrupts)
            # Keep what the cancelled engines managed to report.
            with contextlib.suppress(Exception):
                # The drain in flight (if any), then what the cancelled tasks posted after it.
                for _ in range(2):
                    if not _drain(ray, run, mailbox, DRAIN_S):
                        break
            for key, _ in pending.values():
                _kill_local(run.seen.get(key.id, {}), run.driver_node)


def _drain(ray: ModuleType, run: _RayRun, mailbox: Any, timeout: float) -> bool:
    """Hand the mailbox's messages to the run; False if the mailbox has not answered within ``timeout``.

    A drain not answered yet is kept and waited for next time: the messages it took out of the mailbox exist
    only in its answer.
    """
    if run.draining is None:
        run.draining = mailbox.drain.remote()
    ready, _ = ray.wait([run.draining], num_returns=1, timeout=timeout)
    if not ready:
        return False
    ref, run.draining = run.draining, None
    try:
        items = ray.get(ref)
    except ray.exceptions.RayError as exc:
        raise ClusterError(f"lost the Ray actor that collects results from the engine tasks: "
                           f"{_ray_error_text(exc)}; results so far are in the results log") from exc
    run.handle(items)
    return True


def _finish(ray: ModuleType, run: _RayRun, ref: Any, key: EngineKey, cells: tuple[Cell, ...]) -> None:
    seen = run.seen.get(key.id, {})
    try:
        out = ray.get(ref)
    except ray.exceptions.RayError as exc:
        # The task died (worker killed, node lost, OOM, ...): nothing more will
        # come from it.  Its reaper kills the engine on that node; on this node
        # the driver makes sure too.
        _kill_local(seen, run.driver_node)
        text = _ray_error_text(exc)
        run.cluster["tasks"][key.id]["error"] = text
        where = f" on {seen['host']}" if seen.get("host") else ""
        for c in cells:
            run.record(infra_result(c, Outcome.ERROR, f"Ray task of engine {key.id}{where} failed before this "
                                                      f"scenario reported: {text}"))
        return
    run.envs.setdefault(key.version, out.get("env") or {})
    files = out.get("files") or {}
    if files:
        wd = run.ctx.cfg.work_dir / "engines" / key.id
        wd.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            if name in ENGINE_FILES:
                (wd / name).write_text(text, encoding="utf-8")
        run.cluster["tasks"][key.id]["engine_files"] = str(wd)
    for d in out.get("results") or []:
        run.record(CellResult.from_dict(d))


def _kill_local(seen: dict[str, Any], driver_node: str) -> None:
    if seen.get("node_id") == driver_node and isinstance(seen.get("pgid"), int):
        kill_engine_group(seen["pgid"])


def _cancel(ray: ModuleType, refs: list[Any], interrupts: DeferredInterrupts) -> None:
    # KeyboardInterrupt inside each task: run_engine's finally kills its engine.
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)
    left = refs
    deadline, mark = time.monotonic() + CANCEL_GRACE_S, interrupts.mark()
    # In slices: a Ctrl-C during the grace period (a second one, if a first started this cleanup) ends it.
    while left and time.monotonic() < deadline and not interrupts.since(mark):
        try:
            _, left = ray.wait(left, num_returns=len(left), timeout=POLL_S)
        except Exception:  # Ray itself is failing: force what is left
            break
    for ref in left:
        # Kills the worker; its reaper kills the engine.
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
