"""The one engine driver: start an engine config in its own process group, and turn its events into cell results.

:class:`EngineProcess` runs ``python -m repro.engine SPEC OUT`` inside the
vLLM env, started with ``start_new_session=True`` so the engine core and
worker processes it spawns share one process group that is killed when the
run ends, however it ends.  The spec it writes and the events it reads are
checked against ``repro.wire``.  :func:`run_engine` runs a whole engine
config (the matrix, bisect, the Ray task); ``harness.run.session.EngineSession``
drives the same process interactively (pytest, ``plan``).  An engine process
that dies is ERROR and a hang TIMEOUT for exactly the cells of that engine
whose scenario had not reported yet; cells already reported keep their
results.  A scenario under which the engine core died of an exception raised
in vLLM's own code is CRASH (``repro.crash``).  ``--retry-infra N`` runs the
ERROR/TIMEOUT cells again on a fresh engine.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.core.errors import ReproError
from harness.core.oracle import Outcome, cell_verdict
from harness.core.records import Attempt, EngineInfo
from harness.core.scenarios import DEFAULT_PROFILE, PROFILES, pauses
from harness.core.scenarios import scenario as scenario_of
from harness.envbuild.envs import VllmEnv
from harness.plan.matrix import Cell, EngineKey
from harness.run.engine_death import death_reason, log_tail
from harness.run.events import (
    EngineEvent,
    Event,
    FatalEvent,
    Precondition,
    ScenarioEvent,
    SchedEvent,
    parse_line,
)
from harness.run.ports import lease_ports
from harness.sched import cells as sched_tier
from harness.verdicts.repeat import aggregate
from harness.verdicts.results import CellResult, infra_result, judged_result
from repro.engine_axes import engine_env as axes_env
from repro.wire import STOP, EngineSpec, ScenarioSpec, Spec

REPRO_PKG = Path(__file__).resolve().parents[2] / "repro"
ENGINE_MODULE = "repro.engine"  # python -m ENGINE_MODULE SPEC OUT

EventHook = Callable[[EngineKey, Event], None]


@dataclass(frozen=True)
class RunConfig:
    platform: str
    work_dir: Path  # per-engine spec, event log and engine log go under work_dir/engines/
    model_cache: Path
    engine_timeout: float = 900.0  # whole engine process: start-up plus every scenario
    scenario_timeout: float = 120.0  # any single wait inside a scenario
    kv_cache_gib: int = 1
    model_params: dict[str, Any] = field(default_factory=dict)
    scenario_params: dict[str, Any] = field(default_factory=dict)
    gpu_memory_utilization: float | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # Faults re-introduced on purpose (``--inject vllm#42043``): the sensitivity
    # self-test.  Empty unless the user asked; every report states it.
    inject: tuple[str, ...] = ()
    repeat: int = 1  # runs of every cell's scenario on its engine (--repeat)
    # weight-sync scenario: "reload" (in place), "nccl" (a trainer process on a
    # GPU the engine does not use sends the weights), "auto" (nccl when such a GPU exists)
    weight_transfer: str = "reload"
    n_gpus: int = 0  # GPUs visible to engines (cuda)
    # weight-sync: also check the post-swap streams on a fresh engine loaded with B, as upstream's
    # example does (costs an engine start per weight-sync cell; on a GPU the two share its memory)
    weight_sync_fresh_check: bool = False
    # --retry-infra N: run a cell that came out ERROR/TIMEOUT again on a fresh engine, up to N more times
    retry_infra: int = 0
    # The user's engine set-up (harness.plan.engine_args): the model every engine loads (a kind of repro.wire's
    # MODEL_KINDS and its params; the label reports show), the engine arguments on top of the engine's
    # defaults (--preset, --engine-args, --engine-arg; merge_engine_args merges them), and the preset's name.
    model_kind: str = "bigram-cycle"
    model_label: str = "bigram-cycle"
    engine_args: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None

    @property
    def custom_setup(self) -> bool:
        """Whether the run loads another model or passes engine arguments of its own (not the harness's set-up)."""
        return self.model_kind != "bigram-cycle" or bool(self.engine_args)


def stage_repro(dst: Path, distributions: Sequence[str] = ()) -> Path:
    """Copy the ``repro`` package and a dist-info declaring its vLLM plugin into ``dst``, and the files of the named
    pure-Python ``distributions`` of the harness's own environment beside it (see :func:`stage_distribution`).

    ``dst`` goes on PYTHONPATH of the engine process (and so of every process
    vLLM spawns): ``importlib.metadata`` finds the dist-info there, and vLLM
    loads ``repro.shim:register`` as a ``vllm.general_plugins`` entry point.
    Nothing is installed into the cached vLLM env.
    """
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(REPRO_PKG, dst / "repro", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    info = dst / "vllm_repro_plugin-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-repro-plugin\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\nrepro_shim = repro.shim:register\n")
    for name in distributions:
        stage_distribution(name, dst)
    return dst


def stage_distribution(name: str, dst: Path) -> int:
    """Copy the installed files of distribution ``name`` (a pure-Python one: the scheduler-tier fuzzer's
    Hypothesis and its one dependency) from the harness's environment into ``dst``; how many.

    Why copied rather than installed into the vLLM env: an env is cached by its recipe, and an extra package
    would change the key of every env (or mutate a shared one); a copy needs no index (air-gapped nodes too)
    and runs the very version the harness was tested with.  Scripts outside site-packages are left out.
    """
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ReproError(f"{name} is not installed next to vllm-repro, which copies it into the vLLM env "
                         f"(pip install 'vllm-repro' installs it)") from exc
    copied = 0
    for rel in dist.files or ():
        src = Path(str(dist.locate_file(rel)))
        if ".." in rel.parts or "__pycache__" in rel.parts or not src.is_file():
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        copied += 1
    return copied


def scenario_seed(scenario_id: str) -> int:
    # Stable across runs and processes (unlike hash()).
    return sum((i + 1) * ord(c) for i, c in enumerate(scenario_id)) % 10_000


def merge_engine_args(cfg: RunConfig, profile: dict[str, Any] | None = None,
                      scheduling: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one merge point of the engine arguments an engine gets on top of ``repro.engine``'s defaults.

    Later wins: the scheduler's (``scheduling``: a fixed KV cache for engines sharing a GPU), the user's
    (``cfg.engine_args``: preset, files, ``--engine-arg``), then the engine profile's (``profile``: what the
    cell's scenario needs, harness.core.scenarios): a scenario needs its arguments to mean what its id says,
    and a backend states only what it can afford.  (The tiny-kv profile's ``num_gpu_blocks_override`` and a
    shared GPU's ``kv_cache_memory_bytes`` are different keys and compose: vLLM sizes the cache from the
    bytes, then caps the block count at the override.)  The engine reports every argument it got; arguments
    a cell's axes decide never get here (harness.plan.engine_args refuses them).
    """
    return {**(scheduling or {}), **cfg.engine_args, **(profile or {})}


def build_spec(engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig, interactive: bool = False,
               extra: dict[str, Any] | None = None) -> Spec:
    """The spec ``repro.engine`` runs for this engine and its cells (every repeat of every cell).

    ``extra``: the scheduler's further engine arguments (a fixed KV cache for engines sharing a GPU), merged
    with the engine profile's (harness.core.scenarios.PROFILES: what its scenarios need) and the user's by
    :func:`merge_engine_args`.
    """
    engine_args = merge_engine_args(cfg, dict(PROFILES[engine.profile].args), extra)
    return Spec(
        engine_id=engine.id,
        engine=EngineSpec(axes=engine_axes(engine), gpu_memory_utilization=cfg.gpu_memory_utilization,
                          extra=engine_args),
        model_kind=cfg.model_kind,
        model_params=cfg.model_params,
        model_cache=str(cfg.model_cache.resolve()),
        scenario_timeout=cfg.scenario_timeout,
        scenarios=tuple(scenario_spec(c, cfg, rep) for rep in range(1, cfg.repeat + 1) for c in cells),
        interactive=interactive,
    )


def engine_axes(engine: EngineKey) -> dict[str, Any]:
    """The engine axes of ``engine`` by name, as its cell's table names them: what the spec carries and the engine
    side (repro.engine_axes) realises."""
    return {a.name: getattr(engine, a.attr) for a in engine.cell_type.table().engine}


def _sched_spec(engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig) -> dict[str, Any]:
    """The ``repro.sched`` spec of a scheduler-tier engine key: one scenario per cell and repeat."""
    scenarios = [sched_tier.sched_scenario(c, repeat_id(c.scenario_id, rep), scenario_seed(c.scenario_id))
                 for rep in range(1, cfg.repeat + 1) for c in cells]
    return sched_tier.sched_spec(engine, scenarios, str(cfg.model_cache.resolve()), cfg.model_params)


def engine_spec(engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig) -> dict[str, Any]:
    """The JSON form of :func:`build_spec` (what ``spec.json`` holds)."""
    return build_spec(engine, cells, cfg).to_json()


def repeat_id(scenario_id: str, rep: int) -> str:
    """Scenario id of run ``rep`` (1-based) of a cell: the first run keeps the plain id."""
    return scenario_id if rep == 1 else f"{scenario_id}#{rep}"


def weight_transfer(cell: Cell, cfg: RunConfig) -> str:
    """How a weight-sync cell swaps weights: ``auto`` means NCCL when a GPU is left over for the trainer."""
    if cfg.weight_transfer != "auto":
        return cfg.weight_transfer
    return "nccl" if cfg.platform == "cuda" and cfg.n_gpus > cell.tp else "reload"


# Catalogue scenarios played by the engine's weight-sync runner (manual-reset-reload: with the client's own reset).
_WEIGHT_SYNC = {"weight-sync": False, "manual-reset-reload": True}


def scenario_spec(cell: Cell, cfg: RunConfig, rep: int = 1) -> ScenarioSpec:
    """The scenario ``repro.engine`` runs for ``cell`` (run ``rep`` of ``cfg.repeat``)."""
    name, params = _engine_scenario(cell, cfg)
    # Repeats keep the seed: a repeat reruns the same cell, only timing differs.
    return ScenarioSpec(repeat_id(cell.scenario_id, rep), name, params, scenario_seed(cell.scenario_id))


def _engine_scenario(cell: Cell, cfg: RunConfig) -> tuple[str, dict[str, Any]]:
    """The ``repro.scenarios`` name a cell runs as, and its parameters (non-pausing ones take no clear_cache, and
    scenarios without an event at a token count, harness.core.scenarios ``trigger``, no ``pause_after``)."""
    params: dict[str, Any] = dict(cfg.scenario_params)
    shape = scenario_of(cell.scenario)
    if shape is not None and not shape.trigger:
        params.pop("pause_after", None)
    if pauses(cell.scenario):
        params["clear_cache"] = cell.clear_cache
    if cell.scenario == "pause":
        return cell.mode, params
    if cell.scenario in _WEIGHT_SYNC:
        params.update(mode=cell.mode, weight_transfer=weight_transfer(cell, cfg))
        if _WEIGHT_SYNC[cell.scenario]:
            params["explicit_reset"] = True
        if cfg.weight_sync_fresh_check:
            params["fresh_engine_check"] = True
        return "weight_sync", params
    if shape is not None and shape.pauses and shape.profile != DEFAULT_PROFILE:
        params["mode"] = cell.mode  # the profile scenarios that pause (sleep, spec-ngram-pause) take their mode
    return cell.scenario.replace("-", "_"), params


def scenario_entry(cell: Cell, cfg: RunConfig, rep: int = 1) -> dict[str, Any]:
    """The JSON form of :func:`scenario_spec` (a spec entry)."""
    return scenario_spec(cell, cfg, rep).to_json()


def engine_env(engine: EngineKey, cfg: RunConfig, pythonpath: Path,
               ports: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's environment; ``ports`` (its :class:`harness.run.ports.PortLease`'s) replaces a ``VLLM_PORT``
    of the caller's shell, which every engine would share, but not one the run's own ``extra_env`` sets."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(ports or {})
    env.update(
        PYTHONPATH=str(pythonpath),
        PYTHONUNBUFFERED="1",
        VLLM_REPRO_CPU_ASYNC="1" if (cfg.platform == "cpu" and engine.async_on) else "0",
        # No flashinfer wheel in our envs; its sampler is not needed for greedy.
        VLLM_USE_FLASHINFER_SAMPLER="0",
    )
    if cfg.platform == "cpu":
        # Without it vLLM's CPU backend reserves most of the machine's RAM.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.kv_cache_gib)
    # The variables the cell's engine axes decide (Ray v2, model runner, batch invariance): repro.engine_axes.
    env.update(axes_env(engine_axes(engine)))
    # Never inherited: a fault is injected only when this run asked for it.
    env["VLLM_REPRO_INJECT"] = ",".join(cfg.inject)
    env.update(cfg.extra_env)
    return env


def kill_group(pgid: int, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace`` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in ``pgid``."""
    for pid in _pids_in_group(pgid):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return True
    return False


def _pids_in_group(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                pids.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return pids


class EventTail:
    """Reads complete new lines from the engine's event file, each parsed into its typed event
    (:func:`harness.run.events.parse_line`: checked against ``repro.wire``).

    A line that is not JSON, or not an event the wire format describes, comes
    back as a :class:`~harness.run.events.CorruptEvent` carrying the line and, for the latter, the mismatch.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.buf = ""

    def read(self) -> list[Event]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.pos)
            chunk = f.read()
            self.pos = f.tell()
        self.buf += chunk
        *lines, self.buf = self.buf.split("\n")
        return [parse_line(line) for line in lines if line.strip()]


class EngineProcess:
    """One engine process: its work dir (staged package, spec, event file, log), process group and events.

    ``interactive`` keeps its stdin open for scenario lines (``send``);
    ``stop`` asks it to end, then kills its whole process group.
    """

    def __init__(self, env: VllmEnv, engine: EngineKey, cfg: RunConfig, wd: Path, cells: tuple[Cell, ...] = (),
                 interactive: bool = False, extra_env: dict[str, str] | None = None,
                 engine_extra: dict[str, Any] | None = None, spec: dict[str, Any] | None = None,
                 distributions: Sequence[str] = ()) -> None:
        """``spec``: the spec document itself (a scheduler-tier ``plan`` or ``fuzz``) instead of the one ``cells``
        make; ``distributions``: staged beside ``repro`` (:func:`stage_repro`)."""
        # Absolute: the engine runs with cwd=wd and PYTHONPATH pointing into it.
        self.wd = wd.resolve()
        if self.wd.exists():
            shutil.rmtree(self.wd)
        self.wd.mkdir(parents=True)
        stage = stage_repro(self.wd / "pkg", distributions)
        self.spec_path, self.events_path, self.log_path = (self.wd / "spec.json", self.wd / "events.jsonl",
                                                           self.wd / "engine.log")
        doc = spec if spec is not None else (
            _sched_spec(engine, cells, cfg) if engine.tier == "scheduler"
            else build_spec(engine, cells, cfg, interactive, engine_extra).to_json())
        self.spec_path.write_text(json.dumps(doc, indent=2))
        module = sched_tier.MODULE if engine.tier == "scheduler" else ENGINE_MODULE
        self.tail = EventTail(self.events_path)
        # Its own ports until it is stopped: engines started side by side never pick the same one (issue 21).
        self.ports = lease_ports()
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [str(env.python), "-m", module, str(self.spec_path), str(self.events_path)],
                    cwd=self.wd, env={**engine_env(engine, cfg, stage, self.ports.env), **(extra_env or {})},
                    stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.PIPE if interactive else subprocess.DEVNULL, start_new_session=True,
                )
        except BaseException:
            self.ports.release()
            raise

    @property
    def pgid(self) -> int:
        return self.proc.pid

    def events(self) -> list[Event]:
        return self.tail.read()

    def wait(self, timeout: float) -> bool:
        """Whether the process has exited, waiting up to ``timeout`` seconds for it."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def send(self, msg: dict[str, Any]) -> None:
        """One JSON line on the engine's stdin (OSError when the engine is gone)."""
        if self.proc.stdin is None:
            raise BrokenPipeError("the engine was not started interactive")
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def stop(self, polite_s: float = 0.0) -> None:
        """Ask an interactive engine to stop (up to ``polite_s``), then kill its process group."""
        if polite_s and self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.send(STOP)
                self.proc.stdin.close()
                self.proc.wait(timeout=polite_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        # Whatever happened, nothing of this engine outlives the run.
        kill_group(self.proc.pid)
        self.proc.wait()
        self.ports.release()  # only now: a process of its group could still hold one of its ports

    def log_tail(self) -> str:
        return log_tail(self.log_path)




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
) -> list[CellResult]:
    """Start one engine for ``cells`` and return one result per cell, whatever happens to the engine.

    ``on_result`` gets each cell's result as soon as it is known (all its
    ``cfg.repeat`` runs folded into one), so a caller can log it before the
    engine's other scenarios finish.  ``extra_env`` (its GPUs) and ``engine_extra``
    (further engine arguments) come from the backend that schedules it; ``cancel``
    set stops the engine (its process group killed) and raises :class:`Cancelled`.

    ``cfg.retry_infra`` N: a cell that comes out ERROR or TIMEOUT (the engine crashed outside vLLM's code,
    hung, or was killed) runs again on a fresh engine with the others that did, up to N more times; its
    result is the last attempt's and lists every attempt (:class:`harness.core.records.Attempt`).  A finding
    (a token fault, CRASH, FLAKY, a repeat that showed one) and UNSUPPORTED are final at once.
    """
    tries = _Attempts(cells, cfg.retry_infra, on_result)
    if engine.tier == "scheduler" and cfg.custom_setup:
        # No engine to give the model or the arguments to: every cell is UNSUPPORTED, never retried.
        cells_of = _EngineCells(cells, cfg, tries.hook(1, cfg.work_dir / "engines" / engine.id))
        cells_of.refused = SCHED_TIER_SETUP
        cells_of.finish(Outcome.UNSUPPORTED, SCHED_TIER_SETUP)
        return [tries.final[c] for c in cells]
    pending = cells
    for n in range(1, cfg.retry_infra + 2):
        wd = cfg.work_dir / "engines" / engine.id
        _run_attempt(env, engine, pending, cfg, tries.hook(n, wd if n == 1 else wd / f"attempt-{n}"),
                     on_event, extra_env, engine_extra, cancel)
        pending = tries.pending()
        if not pending:
            break
    return [tries.final[c] for c in cells]


def _run_attempt(env: VllmEnv, engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig, hook: _AttemptHook,
                 on_event: EventHook | None, extra_env: dict[str, str] | None, engine_extra: dict[str, Any] | None,
                 cancel: threading.Event | None) -> None:
    """One engine process for ``cells``: every cell's result goes to ``hook``, whatever happens to the engine."""
    cells_of = _EngineCells(cells, cfg, hook)
    # --repeat N runs every scenario N times on this engine: its budget grows with it.
    limit = cfg.engine_timeout * max(1, cfg.repeat)
    proc = EngineProcess(env, engine, cfg, hook.engine_dir, cells, extra_env=extra_env, engine_extra=engine_extra)
    try:
        timed_out = _follow(proc, engine, cells_of, limit, on_event, cancel)
    finally:
        proc.stop()
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
            on_event: EventHook | None, cancel: threading.Event | None = None) -> bool:
    """Hand the engine's events to ``cells_of`` until it exits or is refused; True when it ran past ``limit``."""
    t0 = time.monotonic()
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"engine {engine.id} stopped: the run was interrupted")
        finished = proc.wait(0.5)
        for ev in proc.events():
            finished = cells_of.take(ev) or finished
            if on_event is not None:
                on_event(engine, ev)
        if finished or (cells_of.complete and stops_when_judged(engine)):
            return False
        if time.monotonic() - t0 > limit:
            return True


def stops_when_judged(engine: EngineKey) -> bool:
    """Whether the engine is stopped (its process group killed) as soon as every cell has its result.

    vLLM's own shutdown after the last scenario takes 4-5 s of fixed waits (the executor's worker exit, then the
    engine manager; measured on vllm-cpu 0.32.0) that nothing reported after it can change, paid once per engine.
    Ray executors keep it: their shutdown also stops the Ray cluster this process started, whose daemons are not
    all in the engine's process group.  A scheduler-tier process has no engine to shut down and ends by itself.
    """
    return engine.tier == "engine" and engine.executor not in ("ray-v1", "ray-v2")


class _EngineCells:
    """The cells of one engine run: their runs so far, judged as their ``scenario`` events arrive."""

    def __init__(self, cells: tuple[Cell, ...], cfg: RunConfig, on_result: ResultHook | None) -> None:
        self.cells, self.repeat, self.inject, self.on_result = cells, cfg.repeat, cfg.inject, on_result
        self.by_scenario = {repeat_id(c.scenario_id, rep): c for c in cells for rep in range(1, cfg.repeat + 1)}
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


def injection_problem(info: EngineInfo | None, requested: tuple[str, ...]) -> str | None:
    """Why an engine's cells cannot count when faults were injected on request, or None.

    The engine core must report every requested fault as applied; a version
    whose code the injector does not recognise is not silently run un-injected.
    """
    if not requested:
        return None
    probe = info.probe if info is not None else {}
    # The engine core's probe carries it (the scheduler lives there).
    core = probe.get("core")
    inj = (core if isinstance(core, dict) else {}).get("inject", probe.get("inject"))
    if not isinstance(inj, dict):
        return f"fault injection {','.join(requested)} requested but the engine did not report it applied"
    applied = inj.get("applied") or {}
    missing = [f for f in requested if f not in applied]
    if missing:
        why = inj.get("error") or inj.get("reasons") or "no reason given"
        return f"fault injection {','.join(missing)} could not be applied on this vLLM: {why}"
    return None


def scenario_result(cell: Cell, ev: ScenarioEvent, info: EngineInfo | None) -> CellResult:
    """A ``scenario`` event judged into a cell result (infrastructure outcomes keep their reason)."""
    status = ev.status
    if status == "ran":
        verdict = cell_verdict(ev.records)
        return with_precondition(judged_result(cell, verdict, ev.records, info, ev.duration_s), ev.precondition)
    if status == "unsupported":
        return infra_result(cell, Outcome.UNSUPPORTED, ev.reason or "unsupported", info)
    if status == "timeout":
        return infra_result(cell, Outcome.TIMEOUT, ev.reason or "timeout", info)
    if status == "crash":
        # vLLM's own code raised in the engine core while the scenario drove it (repro.crash): a finding.
        return infra_result(cell, Outcome.CRASH, crash_reason(ev), info)
    return infra_result(cell, Outcome.ERROR, ev.reason or f"scenario status {status!r}", info)


def crash_reason(ev: ScenarioEvent) -> str:
    """A crash event's reason, with the vLLM source line it names when the reason does not quote it already."""
    reason, source = ev.reason or "vLLM raised", ev.vllm_source or ""
    return reason if not source or source in reason else f"{reason} ({source})"


def with_precondition(res: CellResult, pre: Precondition | None) -> CellResult:
    """A judged result and its scenario's precondition (engine-profile scenarios: did the event happen?).

    Met: the summary says what happened ("OK 8/8; 12 preemption(s) in 6/8 requests").  Not met: a cell whose
    streams are all right tested nothing and is UNSUPPORTED with the reason (its records kept); a wrong stream
    stays the finding it is, the unmet precondition added to its summary.
    """
    if pre is None:
        return res
    what = pre.what
    if pre.met:
        return replace(res, summary=f"{res.summary}; {what}" if what else res.summary)
    if res.outcome is Outcome.OK:
        return replace(res, outcome=Outcome.UNSUPPORTED, summary=what, reason=what, label=Outcome.UNSUPPORTED.value)
    return replace(res, summary=f"{res.summary} ({what})")
