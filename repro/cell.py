"""Cell runner: ``python -m repro.cell SPEC.json OUT.jsonl`` inside a vLLM environment.

Starts one ``AsyncLLM`` for the engine config in SPEC, runs every scenario of
the spec on it, and appends one JSON line per event to OUT (flushed and
fsynced, so a crash loses nothing already measured):

* ``start``: pid and process group, so the harness can kill the whole group;
* ``engine``: vLLM/torch versions, platform, device, requested and
  *effective* settings (read back from the front-end config, the engine
  core's scheduler and executor, and every worker's model runner);
* ``scenario``: one per scenario: status ``ran`` with per-request records, or
  ``unsupported``/``error`` with the reason;
* ``done``.

Talks to the harness only through these files; imports only the standard
library, numpy, and vLLM.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from repro.models import BigramCycleSpec, build_checkpoint, expected_continuation, load_perm
from repro.scenarios import RUNNERS, SCENARIOS
from repro.scenarios.base import (
    EngineContext,
    Plan,
    ScenarioTimeout,
    ScenarioUnsupported,
    check_pause_api,
    run_plan,
    run_reference,
)

SCHEMA_VERSION = 1

# Executor axis value -> class name vLLM must really construct.
EXPECTED_EXECUTOR = {
    "mp": "MultiprocExecutor",
    "uni": "UniProcExecutor",
    "ray-v1": "RayDistributedExecutor",
    "ray-v2": "RayExecutorV2",
}


class Emitter:
    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives for the run

    def __call__(self, event: str, **data: Any) -> None:
        self.f.write(json.dumps({"event": event, "t": time.time(), **data}) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())


def _device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def needs_nccl_weight_transfer(spec: dict[str, Any]) -> bool:
    """Whether a scenario of ``spec`` syncs weights over NCCL (the engine must be started for it)."""
    return any(
        sc.get("scenario") == "weight_sync" and (sc.get("params") or {}).get("weight_transfer") == "nccl"
        for sc in spec.get("scenarios", [])
    )


def _weight_transfer_config(spec: dict[str, Any]) -> Any:
    """WeightTransferConfig(backend="nccl") where a scenario needs it and this vLLM/platform has it, else None.

    Set only then: upstream's example starts the engine with it, and the
    worker builds its NCCL transfer engine from it at start-up.  Where it is
    missing the scenario itself reports UNSUPPORTED with the reason.
    """
    if not needs_nccl_weight_transfer(spec):
        return None
    try:
        import torch
        from vllm.config import WeightTransferConfig
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return WeightTransferConfig(backend="nccl")


def _engine_args(spec: dict[str, Any], model_dir: Path, weight_transfer: Any = None) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    eng = spec["engine"]
    executor = eng["executor"]
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "skip_tokenizer_init": True,
        "dtype": eng.get("dtype", "float32"),
        "max_model_len": eng.get("max_model_len", 256),
        "max_num_seqs": eng.get("max_num_seqs", 32),
        # Small batches keep the CPU warm-up short (it runs dummy batches up to this size).
        "max_num_batched_tokens": eng.get("max_num_batched_tokens", 256),
        "enforce_eager": True,
        "seed": eng.get("seed", 0),
        "async_scheduling": bool(eng["async_scheduling"]),
        "tensor_parallel_size": eng.get("tensor_parallel_size", 1),
        "distributed_executor_backend": "ray" if executor.startswith("ray") else executor,
        "disable_log_stats": True,
    }
    if eng.get("gpu_memory_utilization") is not None:
        kwargs["gpu_memory_utilization"] = eng["gpu_memory_utilization"]
    if weight_transfer is not None:
        # vLLM versions with WeightTransferConfig take it as an engine argument.
        kwargs["weight_transfer_config"] = weight_transfer
    kwargs.update(eng.get("extra", {}))
    return AsyncEngineArgs(**kwargs)


async def _probe(llm: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "frontend_async_scheduling": llm.vllm_config.scheduler_config.async_scheduling,
    }
    try:
        out["core"] = await llm.engine_core.call_utility_async("repro_probe")
    except Exception as exc:
        out["core_error"] = repr(exc)
    try:
        out["workers"] = await llm.collective_rpc("repro_worker_probe")
    except Exception as exc:
        out["workers_error"] = repr(exc)
    return out


def effective_settings(requested: dict[str, Any], probe: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Effective async/executor from the probe, and why the cell cannot claim what it asked for."""
    core = probe.get("core") or {}
    workers = probe.get("workers") or []
    parts = {
        "frontend": probe.get("frontend_async_scheduling"),
        "core_config": core.get("async_scheduling"),
        "core_scheduler_async": (core.get("scheduler_class") or "").endswith("AsyncScheduler")
        if core else None,
        "workers": [w.get("use_async_scheduling") for w in workers] if workers else None,
    }
    known = [v for k, v in parts.items() if k != "workers" and v is not None]
    known += parts["workers"] or []
    if not known:
        eff_async: bool | None = None
    elif all(v is True for v in known):
        eff_async = True
    elif all(v is False for v in known):
        eff_async = False
    else:
        eff_async = None  # inconsistent across processes
    executor_class = (core.get("executor_class") or "").rsplit(".", 1)[-1] or None
    runners = {runner_generation(w.get("model_runner_class")) for w in workers}
    eff_runner = next(iter(runners)) if len(runners) == 1 else None
    # A worker that never loaded vLLM's batch-invariant module (None) did not switch it on.
    invariant = [w.get("batch_invariant") is True for w in workers]
    eff_invariant = (all(invariant) if all(invariant) or not any(invariant) else None) if workers else None
    eff = {"async_scheduling": eff_async, "async_parts": parts, "executor_class": executor_class,
           "model_runner": eff_runner,
           "model_runner_classes": sorted({str(w["model_runner_class"]) for w in workers
                                           if w.get("model_runner_class")}),
           "batch_invariant": eff_invariant}
    reason = None
    want_exec = EXPECTED_EXECUTOR.get(requested["executor"])
    want_runner = requested.get("model_runner", "v1")
    want_invariant = bool(requested.get("batch_invariant", False))
    if executor_class and want_exec and executor_class != want_exec:
        reason = f"asked for executor {requested['executor']} ({want_exec}) but vLLM built {executor_class}"
    elif eff_async is None:
        reason = f"could not establish effective async_scheduling: {parts}"
    elif eff_async != requested["async_scheduling"]:
        reason = (
            f"asked for async_scheduling={requested['async_scheduling']} but it is effectively "
            f"{eff_async} ({parts})"
        )
    elif (eff_runner != "v2") if want_runner == "v2" else ("v2" in runners):
        # Only a confirmed v2 counts as v2; v1 is refused only when a worker is seen running v2.
        reason = (f"asked for model runner {want_runner} (VLLM_USE_V2_MODEL_RUNNER) but the workers run "
                  f"{', '.join(eff['model_runner_classes']) or 'an unknown runner (no worker probe)'}")
    elif want_invariant is not eff_invariant and (want_invariant or workers):
        reason = (f"asked for VLLM_BATCH_INVARIANT={int(want_invariant)} but the workers' batch-invariant "
                  f"mode is {'mixed' if eff_invariant is None else eff_invariant}")
    return eff, reason


def runner_generation(model_runner_class: str | None) -> str | None:
    """``v2`` for vLLM's V2 model runners, ``v1`` for the others, None when unknown.

    V2 runners live in packages (``vllm.v1.worker.gpu.model_runner``, 0.32's
    ``vllm.v1.worker.cpu.model_runner``); V1 in ``gpu_model_runner`` / ``cpu_model_runner``.
    """
    if not model_runner_class or model_runner_class == "None":
        return None
    module = model_runner_class.rsplit(".", 1)[0]
    return "v2" if module.startswith(("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")) else "v1"


def _build_plan(sc: dict[str, Any], vocab: int) -> Plan:
    name = sc["scenario"]
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; valid: {sorted(SCENARIOS)}")
    return SCENARIOS[name](sc["id"], sc.get("params", {}), vocab, int(sc.get("seed", 0)))


async def _run_scenario(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    perm = ctx.perm
    plan = _build_plan(sc, len(perm))  # validates the parameters of every scenario
    if sc["scenario"] in RUNNERS:
        # Scenarios that change the engine (weight sync) drive it themselves.
        return await RUNNERS[sc["scenario"]](llm, sc, ctx, timeout)
    t0 = time.monotonic()
    refs = await run_reference(llm, plan, timeout, sc["id"])
    records, events = await run_plan(llm, plan, timeout)
    for rec in records:
        rec["reference"] = refs[rec["rid"]]
        analytic = expected_continuation(perm, rec["prompt"][-1], len(rec["reference"]))
        # The engine's own no-pause run must follow the model's cycle; if it
        # does not, the model (not the scheduler) is at fault.
        rec["reference_matches_model"] = rec["reference"] == analytic
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3)}


async def run_cell(spec: dict[str, Any], emit: Emitter) -> None:
    """Start the engine for ``spec`` and run every scenario; emit events as they happen."""
    scenarios = spec["scenarios"]
    timeout = float(spec.get("scenario_timeout", 120))
    model = spec["model"]
    if model.get("kind", "bigram-cycle") != "bigram-cycle":
        raise ValueError(f"unknown model kind {model.get('kind')!r}; valid: ['bigram-cycle']")
    mspec = BigramCycleSpec.from_dict(model.get("params", {}))
    model_dir = build_checkpoint(mspec, Path(spec["model_cache"]))
    perm = load_perm(model_dir)

    import torch
    import vllm
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    info = {
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "platform": getattr(current_platform, "device_type", "unknown") or "unknown",
        "platform_class": type(current_platform).__name__,
        "device_name": _device_name(),
        "model": {"kind": "bigram-cycle", "key": mspec.key(), "path": str(model_dir)},
    }
    requested = {"async_scheduling": bool(spec["engine"]["async_scheduling"]),
                 "executor": spec["engine"]["executor"],
                 "model_runner": spec["engine"].get("model_runner", "v1"),
                 "batch_invariant": bool(spec["engine"].get("batch_invariant", False))}
    try:
        # Decided from the class, before paying for an engine start: versions
        # without keep/wait/abort pause modes cannot run any scenario.
        check_pause_api(AsyncLLM)
    except ScenarioUnsupported as exc:
        emit("engine", **info, requested=requested, effective=None, probe=None, startup_s=None,
             unsupported_reason=str(exc), started=False)
        for sc in scenarios:
            emit("scenario", id=sc["id"], status="unsupported", reason=str(exc))
        return
    t0 = time.monotonic()
    try:
        llm = AsyncLLM.from_engine_args(_engine_args(spec, model_dir, _weight_transfer_config(spec)))
    except Exception as exc:
        refused = refused_setting(requested, exc)
        if refused is None:
            raise
        emit("engine", **info, requested=requested, effective=None, probe=None, startup_s=None,
             unsupported_reason=refused, started=False)
        for sc in scenarios:
            emit("scenario", id=sc["id"], status="unsupported", reason=refused)
        return
    ctx = EngineContext(
        model_spec=mspec, model_dir=model_dir, perm=perm, model_cache=Path(spec["model_cache"]),
        work_dir=Path.cwd(), tensor_parallel_size=int(spec["engine"].get("tensor_parallel_size", 1)),
        start_engine=lambda d: AsyncLLM.from_engine_args(_engine_args(spec, d)),
    )
    try:
        startup = round(time.monotonic() - t0, 3)
        probe = await _probe(llm)
        eff, reason = effective_settings(requested, probe)
        emit("engine", **info, requested=requested, effective=eff, probe=probe, startup_s=startup,
             unsupported_reason=reason)
        for sc in scenarios:
            await _one(llm, sc, ctx, timeout, reason, emit)
        if spec.get("interactive"):
            # Session mode (pytest, Hypothesis): more scenarios arrive as JSON
            # lines on stdin, one result event each, until EOF or {"op": "stop"}.
            loop = asyncio.get_running_loop()
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line or not line.strip():
                    if not line:
                        break
                    continue
                sc = json.loads(line)
                if sc.get("op") == "stop":
                    break
                await _one(llm, sc, ctx, float(sc.get("timeout", timeout)), reason, emit)
    finally:
        llm.shutdown()


def refused_setting(requested: dict[str, Any], exc: BaseException) -> str | None:
    """The reason when vLLM's start-up refused an optional engine setting we asked for, else None.

    e.g. 0.22 without Triton: ``ValueError: VLLM_USE_V2_MODEL_RUNNER requires Triton.``, 0.21's
    ``VLLM_USE_V2_MODEL_RUNNER does not yet support: ...``, or an attention backend refused with
    ``batch invariance not supported``.  Any other start-up failure stays an error.
    """
    text = f"{type(exc).__name__}: {exc}"
    first = (text.splitlines() or [text])[0][:300]
    if requested.get("model_runner") == "v2" and "V2_MODEL_RUNNER" in text:
        return f"vLLM refused model runner v2: {first}"
    if requested.get("batch_invariant") and ("batch invariance" in text.lower() or "BATCH_INVARIANT" in text):
        return f"vLLM refused VLLM_BATCH_INVARIANT=1: {first}"
    return None


async def _one(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float, unsupported: str | None,
               emit: Emitter) -> None:
    """Run one scenario and emit its result event; only a dead engine propagates."""
    if unsupported is not None:
        emit("scenario", id=sc["id"], status="unsupported", reason=unsupported)
        return
    try:
        result = await _run_scenario(llm, sc, ctx, timeout)
        after = await _probe(llm)
        emit("scenario", id=sc["id"], status="ran", **result, probe_after=after)
    except ScenarioUnsupported as exc:
        emit("scenario", id=sc["id"], status="unsupported", reason=str(exc))
    except ScenarioTimeout as exc:
        # A timeout usually strikes while paused: resume so the next scenario
        # does not inherit a paused engine (its requests were cancelled).
        recovered = True
        try:
            await asyncio.wait_for(llm.resume_generation(), timeout)
        except Exception:
            recovered = False
        emit("scenario", id=sc["id"], status="timeout", reason=str(exc), engine_recovered=recovered)
    except Exception as exc:
        emit("scenario", id=sc["id"], status="error",
             reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        if getattr(llm, "errored", False):
            raise RuntimeError("engine is dead; the remaining scenarios cannot run") from exc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m repro.cell SPEC.json OUT.jsonl", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    if spec.get("schema_version") != SCHEMA_VERSION:
        print(f"spec schema_version {spec.get('schema_version')!r}; this runner reads {SCHEMA_VERSION}",
              file=sys.stderr)
        return 2
    emit = Emitter(Path(argv[1]))
    emit("start", pid=os.getpid(), pgid=os.getpgid(0), engine_id=spec.get("engine_id"),
         python=sys.executable)
    try:
        asyncio.run(run_cell(spec, emit))
    except BaseException as exc:
        emit("fatal", reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return 1
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
