"""Engine process: ``python -m repro.engine SPEC.json OUT.jsonl`` inside a vLLM environment.

Starts one ``AsyncLLM`` for the engine config in SPEC, runs every scenario of
the spec on it (``repro.cell``), and appends one JSON line per event to OUT
(flushed and fsynced, so a crash loses nothing already measured):

* ``start``: pid and process group, so the harness can kill the whole group;
* ``engine``: vLLM/torch versions, platform, device, requested and
  *effective* settings (read back from the front-end config, the engine
  core's scheduler and executor, and every worker's model runner);
* ``scenario``: one per scenario: status ``ran`` with per-request records, or
  ``unsupported``/``timeout``/``error`` with the reason;
* ``fatal`` (the process is ending on an error) or ``done``.

The spec and every event are checked against ``repro.wire``, the description
the harness reads with.  Talks to the harness only through these files (and,
for an interactive spec, scenario lines on stdin); imports only the standard
library, numpy, and vLLM.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from repro import crash
from repro.cell import effective_settings, probe_engine, refused_setting, run_cell
from repro.models import BigramCycleSpec, build_checkpoint, load_perm
from repro.rootcause import root_causes
from repro.scenarios import pauses
from repro.scenarios.base import MAX_MODEL_LEN, EngineContext, ScenarioUnsupported, check_pause_api
from repro.wire import STOP, ScenarioSpec, Spec, WireError, check_event


class Emitter:
    """Appends events to OUT, each checked against ``repro.wire`` before it is written."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives for the run

    def __call__(self, event: str, **data: Any) -> None:
        ev = {"event": event, "t": time.time(), **data}
        check_event(ev, strict=True)
        self.f.write(json.dumps(ev) + "\n")
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


def needs_nccl_weight_transfer(spec: Spec) -> bool:
    """Whether a scenario of ``spec`` syncs weights over NCCL (the engine must be started for it)."""
    return any(sc.scenario == "weight_sync" and sc.params.get("weight_transfer") == "nccl" for sc in spec.scenarios)


def _weight_transfer_config(spec: Spec) -> Any:
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


def _engine_args(spec: Spec, model_dir: Path, weight_transfer: Any = None) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    eng = spec.engine
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "skip_tokenizer_init": True,
        "dtype": "float32",
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": 32,
        # Small batches keep the CPU warm-up short (it runs dummy batches up to this size).
        "max_num_batched_tokens": 256,
        "enforce_eager": True,
        "seed": 0,
        "async_scheduling": eng.async_scheduling,
        "tensor_parallel_size": eng.tensor_parallel_size,
        "distributed_executor_backend": "ray" if eng.executor.startswith("ray") else eng.executor,
        "disable_log_stats": True,
    }
    if eng.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = eng.gpu_memory_utilization
    if weight_transfer is not None:
        # vLLM versions with WeightTransferConfig take it as an engine argument.
        kwargs["weight_transfer_config"] = weight_transfer
    # A copy: vLLM writes into nested arguments (SpeculativeConfig adds its target ModelConfig to the
    # speculative_config dict), and the spec's own values must stay what the engine reports it asked for.
    kwargs.update(copy.deepcopy(eng.extra))
    return AsyncEngineArgs(**kwargs)


def _requested(spec: Spec) -> dict[str, Any]:
    eng = spec.engine
    out = {"async_scheduling": eng.async_scheduling, "executor": eng.executor,
           "model_runner": eng.model_runner, "batch_invariant": eng.batch_invariant}
    if eng.extra:
        # Further engine arguments the engine was started with (a fixed KV cache when engines share a GPU):
        # every report says what really ran.
        out["engine_args"] = copy.deepcopy(eng.extra)
    return out


def _refuse_all(spec: Spec, emit: Emitter, info: dict[str, Any], why: str) -> None:
    """The engine cannot run this spec as labelled: say why once, and for every scenario."""
    emit("engine", **info, requested=_requested(spec), effective=None, probe=None, startup_s=None,
         unsupported_reason=why, started=False)
    for sc in spec.scenarios:
        emit("scenario", id=sc.id, status="unsupported", reason=why)


async def run_engine(spec: Spec, emit: Emitter) -> None:
    """Start the engine for ``spec`` and run every scenario; emit events as they happen."""
    mspec = BigramCycleSpec.from_dict(spec.model_params)
    model_dir = build_checkpoint(mspec, Path(spec.model_cache))

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
        "model": {"kind": spec.model_kind, "key": mspec.key(), "path": str(model_dir)},
    }
    vocab = len(load_perm(model_dir))
    if all(pauses(sc.scenario, sc.params, vocab) for sc in spec.scenarios):
        try:
            # Decided from the class, before paying for an engine start: versions
            # without keep/wait/abort pause modes cannot run any pausing scenario
            # (the others, a reset or abort with no pause, still can: each pausing
            # scenario then reports UNSUPPORTED itself).
            check_pause_api(AsyncLLM)
        except ScenarioUnsupported as exc:
            _refuse_all(spec, emit, info, str(exc))
            return
    t0 = time.monotonic()
    try:
        llm = AsyncLLM.from_engine_args(_engine_args(spec, model_dir, _weight_transfer_config(spec)))
    except Exception as exc:
        refused = refused_setting(_requested(spec), exc, root_causes())
        if refused is None:
            raise
        _refuse_all(spec, emit, info, refused)
        return
    ctx = EngineContext(
        model_spec=mspec, model_dir=model_dir, perm=load_perm(model_dir), model_cache=Path(spec.model_cache),
        work_dir=Path.cwd(), tensor_parallel_size=spec.engine.tensor_parallel_size,
        start_engine=lambda d: AsyncLLM.from_engine_args(_engine_args(spec, d)),
    )
    try:
        startup = round(time.monotonic() - t0, 3)
        probe = await probe_engine(llm)
        eff, reason = effective_settings(_requested(spec), probe)
        emit("engine", **info, requested=_requested(spec), effective=eff, probe=probe, startup_s=startup,
             unsupported_reason=reason)
        for sc in spec.scenarios:
            await run_cell(llm, sc.to_json(), ctx, spec.scenario_timeout, reason, emit)
        if spec.interactive:
            await _serve_stdin(llm, ctx, spec.scenario_timeout, reason, emit)
    finally:
        llm.shutdown()


async def _serve_stdin(llm: Any, ctx: EngineContext, timeout: float, unsupported: str | None,
                       emit: Emitter) -> None:
    """Session mode (pytest, Hypothesis): scenarios arrive as JSON lines on stdin, one result event each.

    Until EOF or ``repro.wire.STOP``.
    """
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        if not line.strip():
            continue
        doc = json.loads(line)
        if doc == STOP:
            break
        sc = ScenarioSpec.from_json(doc)
        await run_cell(llm, sc.to_json(), ctx, sc.timeout if sc.timeout is not None else timeout, unsupported,
                       emit)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m repro.engine SPEC.json OUT.jsonl", file=sys.stderr)
        return 2
    try:
        spec = Spec.from_json(json.loads(Path(argv[0]).read_text()))
    except WireError as exc:
        print(f"bad spec {argv[0]}: {exc}", file=sys.stderr)
        return 2
    emit = Emitter(Path(argv[1]))
    # Where the engine core reports the exception it dies of (repro.crash); inherited by every vLLM process.
    crash_file = Path(argv[1]).resolve().with_name("engine_core_crash.json")
    os.environ[crash.ENV_CRASH_FILE] = str(crash_file)
    emit("start", pid=os.getpid(), pgid=os.getpgid(0), engine_id=spec.engine_id, python=sys.executable)
    try:
        asyncio.run(run_engine(spec, emit))
    except BaseException as exc:
        reason = f"{type(exc).__name__}: {exc}"
        report = crash.claim_report(crash_file)  # died between scenarios: no scenario claimed it
        if report is not None:
            reason += f"; {crash.scenario_fields(report)['reason']}"
        emit("fatal", reason=reason, traceback=traceback.format_exc())
        return 1
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
