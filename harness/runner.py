"""Run one engine config in its own process group and turn its events into cell results.

The engine runs ``python -m repro.cell`` inside the vLLM env, started with
``start_new_session=True`` so the engine core and worker processes it spawns
share one process group that is killed when the run ends, however it ends.  A
crash is ERROR and a hang TIMEOUT for exactly the cells of that engine whose
scenario had not reported yet; cells already reported keep their results.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.envs import VllmEnv
from harness.matrix import Cell, EngineKey
from harness.oracle import Outcome, cell_verdict
from harness.results import CellResult, infra_result, judged_result

REPRO_PKG = Path(__file__).resolve().parent.parent / "repro"
SPEC_SCHEMA_VERSION = 1  # must match repro.cell.SCHEMA_VERSION

EventHook = Callable[[EngineKey, dict[str, Any]], None]


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


def stage_repro(dst: Path) -> Path:
    """Copy the ``repro`` package and a dist-info declaring its vLLM plugin into ``dst``.

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
    return dst


def scenario_seed(scenario_id: str) -> int:
    # Stable across runs and processes (unlike hash()).
    return sum((i + 1) * ord(c) for i, c in enumerate(scenario_id)) % 10_000


def engine_spec(engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig) -> dict[str, Any]:
    """The JSON spec ``repro.cell`` reads for this engine and its cells."""
    return {
        "schema_version": SPEC_SCHEMA_VERSION,
        "engine_id": engine.id,
        "engine": {
            "executor": engine.executor,
            "async_scheduling": engine.async_on,
            "tensor_parallel_size": engine.tp,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "model_runner": engine.model_runner,
            "batch_invariant": engine.batch_invariant,
        },
        "model": {"kind": "bigram-cycle", "params": cfg.model_params},
        "model_cache": str(cfg.model_cache.resolve()),
        "scenario_timeout": cfg.scenario_timeout,
        "scenarios": [scenario_entry(c, cfg, rep) for rep in range(1, cfg.repeat + 1) for c in cells],
    }


def repeat_id(scenario_id: str, rep: int) -> str:
    """Scenario id of run ``rep`` (1-based) of a cell: the first run keeps the plain id."""
    return scenario_id if rep == 1 else f"{scenario_id}#{rep}"


def weight_transfer(cell: Cell, cfg: RunConfig) -> str:
    """How a weight-sync cell swaps weights: ``auto`` means NCCL when a GPU is left over for the trainer."""
    if cfg.weight_transfer != "auto":
        return cfg.weight_transfer
    return "nccl" if cfg.platform == "cuda" and cfg.n_gpus > cell.tp else "reload"


def scenario_entry(cell: Cell, cfg: RunConfig, rep: int = 1) -> dict[str, Any]:
    """The spec entry ``repro.cell`` runs for ``cell`` (run ``rep`` of ``cfg.repeat``)."""
    params: dict[str, Any] = {**cfg.scenario_params, "clear_cache": cell.clear_cache}
    if cell.scenario == "pause":
        name = cell.mode
    else:
        name = cell.scenario.replace("-", "_")
        params.update(mode=cell.mode, weight_transfer=weight_transfer(cell, cfg))
        if cfg.weight_sync_fresh_check:
            params["fresh_engine_check"] = True
    # Repeats keep the seed: a repeat reruns the same cell, only timing differs.
    return {"id": repeat_id(cell.scenario_id, rep), "scenario": name, "params": params,
            "seed": scenario_seed(cell.scenario_id)}


def engine_env(engine: EngineKey, cfg: RunConfig, pythonpath: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
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
    if engine.executor in ("ray-v1", "ray-v2"):
        env["VLLM_USE_RAY_V2_EXECUTOR_BACKEND"] = "1" if engine.executor == "ray-v2" else "0"
    # Both always explicit: 0.22+ picks the V2 runner by itself for some models
    # (0.32 by default), and a variable left in the caller's shell must not
    # change what a cell labelled v1 / not batch-invariant runs.
    env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if engine.model_runner == "v2" else "0"
    env["VLLM_BATCH_INVARIANT"] = "1" if engine.batch_invariant else "0"
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
    """Reads complete new lines from the engine's event file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.buf = ""

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.pos)
            chunk = f.read()
            self.pos = f.tell()
        self.buf += chunk
        *lines, self.buf = self.buf.split("\n")
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    out.append({"event": "corrupt", "line": line[:200]})
        return out


def engine_info(ev: dict[str, Any]) -> dict[str, Any]:
    """The facts of an ``engine`` event kept in every cell result."""
    keep = ("vllm_version", "torch_version", "python", "platform", "platform_class", "device_name", "model",
            "requested", "effective", "startup_s", "probe")
    return {k: ev.get(k) for k in keep}


def log_tail(path: Path, n: int = 8) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(ln.strip()[:200] for ln in lines[-n:])


ResultHook = Callable[[CellResult], None]


def run_engine(
    env: VllmEnv, engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig, on_event: EventHook | None = None,
    on_result: ResultHook | None = None,
) -> list[CellResult]:
    """Start one engine for ``cells`` and return one result per cell, whatever happens to the engine.

    ``on_result`` gets each cell's result as soon as it is known (all its
    ``cfg.repeat`` runs folded into one), so a caller can log it before the
    engine's other scenarios finish.
    """
    from harness.repeat import aggregate

    # Absolute: the engine runs with cwd=wd and PYTHONPATH pointing into it.
    wd = (cfg.work_dir / "engines" / engine.id).resolve()
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    stage = stage_repro(wd / "pkg")
    spec_path, events_path, log_path = wd / "spec.json", wd / "events.jsonl", wd / "engine.log"
    spec_path.write_text(json.dumps(engine_spec(engine, cells, cfg), indent=2))
    by_scenario = {repeat_id(c.scenario_id, rep): c for c in cells for rep in range(1, cfg.repeat + 1)}
    runs: dict[Cell, list[CellResult]] = {c: [] for c in cells}
    results: dict[Cell, CellResult] = {}
    info: dict[str, Any] | None = None
    fatal: str | None = None
    refused: str | None = None  # the engine cannot run these cells as labelled (e.g. injection not applied)
    tail = EventTail(events_path)
    t0 = time.monotonic()
    timed_out = False
    # --repeat N runs every scenario N times on this engine: its budget grows with it.
    limit = cfg.engine_timeout * max(1, cfg.repeat)

    def done(cell: CellResult) -> None:
        results[cell.cell] = cell
        if on_result is not None:
            on_result(cell)

    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            [str(env.python), "-m", "repro.cell", str(spec_path), str(events_path)],
            cwd=wd, env=engine_env(engine, cfg, stage), stdout=logf, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    finished = True
                except subprocess.TimeoutExpired:
                    finished = False
                for ev in tail.read():
                    kind = ev.get("event")
                    if kind == "engine":
                        info = engine_info(ev)
                        refused = injection_problem(info, cfg.inject)
                        if refused:
                            finished = True  # nothing this engine reports can count
                    elif kind == "scenario" and ev.get("id") in by_scenario and not refused:
                        cell = by_scenario[ev["id"]]
                        runs[cell].append(scenario_result(cell, ev, info))
                        if len(runs[cell]) == cfg.repeat:
                            done(aggregate(runs[cell]))
                    elif kind == "fatal":
                        fatal = ev.get("reason")
                    if on_event is not None:
                        on_event(engine, ev)
                if finished:
                    break
                if time.monotonic() - t0 > limit:
                    timed_out = True
                    break
        finally:
            # Whatever happened, nothing of this engine outlives the run.
            kill_group(proc.pid)
            proc.wait()
    rc = proc.returncode
    for c in cells:
        if c in results:
            continue
        if refused:
            res = infra_result(c, Outcome.UNSUPPORTED, refused, info)
        elif timed_out:
            res = infra_result(c, Outcome.TIMEOUT,
                               f"engine {engine.id} exceeded its {limit:.0f}s limit "
                               f"before this scenario finished; log: {log_path}", info)
        else:
            why = fatal or f"engine process exited with code {rc}"
            res = infra_result(c, Outcome.ERROR,
                               f"{why} before this scenario reported; last log lines: {log_tail(log_path)}", info)
        if runs[c]:
            # Some repeats ran: keep them, the missing runs count as this outcome.
            res = aggregate([*runs[c], *[res] * (cfg.repeat - len(runs[c]))])
        done(res)
    return [results[c] for c in cells]


def injection_problem(info: dict[str, Any] | None, requested: tuple[str, ...]) -> str | None:
    """Why an engine's cells cannot count when faults were injected on request, or None.

    The engine core must report every requested fault as applied; a version
    whose code the injector does not recognise is not silently run un-injected.
    """
    if not requested:
        return None
    probe = (info or {}).get("probe") or {}
    # The engine core's probe carries it (the scheduler lives there).
    inj = (probe.get("core") or {}).get("inject", probe.get("inject"))
    if not isinstance(inj, dict):
        return f"fault injection {','.join(requested)} requested but the engine did not report it applied"
    applied = inj.get("applied") or {}
    missing = [f for f in requested if f not in applied]
    if missing:
        why = inj.get("error") or inj.get("reasons") or "no reason given"
        return f"fault injection {','.join(missing)} could not be applied on this vLLM: {why}"
    return None


def scenario_result(cell: Cell, ev: dict[str, Any], info: dict[str, Any] | None) -> CellResult:
    """A ``scenario`` event judged into a cell result (infrastructure outcomes keep their reason)."""
    status = ev.get("status")
    if status == "ran":
        verdict = cell_verdict(ev["records"])
        return judged_result(cell, verdict, ev["records"], info, ev.get("duration_s"))
    if status == "unsupported":
        return infra_result(cell, Outcome.UNSUPPORTED, ev.get("reason", "unsupported"), info)
    if status == "timeout":
        return infra_result(cell, Outcome.TIMEOUT, ev.get("reason", "timeout"), info)
    return infra_result(cell, Outcome.ERROR, ev.get("reason", f"scenario status {status!r}"), info)
