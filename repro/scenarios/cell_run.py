"""One cell on a running engine: does the engine run it as labelled, and its scenario's result event.

A cell is an engine config and a scenario.  ``repro.engine.main`` starts the
engine and reads back its *effective* settings (``probe_engine``,
``effective_settings``: a cell labelled async must really run the
AsyncScheduler); ``run_cell`` runs one scenario on it and emits its
``scenario`` event (described in ``repro.core.wire``).
"""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from repro.core import crash
from repro.scenarios import RUNNERS, SCENARIOS
from repro.scenarios.runs import run_with_reference
from repro.scenarios.sampling import TableModel, logit_table, sampling_kwargs
from repro.scenarios.structured import structured_refusal
from repro.scenarios.vocab import EngineContext, Plan, ScenarioTimeout, ScenarioUnsupported
from repro.settings import declared as settings
from repro.settings.read_back import Evidence, runner_generation

__all__ = ["effective_settings", "probe_engine", "read_view", "refused_setting", "run_cell", "runner_generation"]

Emit = Callable[..., None]  # emit(kind, **fields): one event, checked against repro.core.wire
# The settings the engine event's ``effective`` names on its own (reports and the pairing read them).
READERS = {name: reader for name in ("async_scheduling", "executor", "model_runner", "batch_invariant")
           if (reader := settings.SETTINGS[name].reader) is not None}


async def probe_engine(llm: Any) -> dict[str, Any]:
    """What the front end, the engine core and every worker say they run (the shim's utilities)."""
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


async def read_view(llm: Any) -> tuple[dict[str, Any] | None, str]:
    """The engine core's settings view (``repro.settings.core_view``), or None and why it could not be read."""
    try:
        return dict(await llm.engine_core.call_utility_async("repro_settings")), ""
    except Exception as exc:
        return None, repr(exc)[:300]


def effective_settings(requested: dict[str, Any], probe: dict[str, Any], view: dict[str, Any] | None = None,
                       kwargs: dict[str, Any] | None = None, sources: dict[str, str] | None = None,
                       view_error: str = "") -> tuple[dict[str, Any], str | None]:
    """The engine's effective settings, and why the cell cannot claim what it asked for (None: it can).

    ``requested``: the cell's engine axes (and ``engine_args``); ``kwargs``: every engine argument the engine was
    started with (default: ``requested["engine_args"]``), ``sources`` says who asked for each; ``view``: the engine
    core's settings view.  Every setting is read back as ``repro.settings.declared`` declares it; ``settings`` holds the
    table (requested, effective, where read, status), and the first difference is the reason."""
    axes = {"model_runner": "v1", "batch_invariant": False,
            **{k: v for k, v in requested.items() if k != "engine_args"}}
    args = (requested.get("engine_args") or {}) if kwargs is None else kwargs
    evidence = Evidence(probe, view, view_error or ("" if view is not None else "not asked"))
    rows = settings.settings_table(settings.asked_settings(axes, args, sources or {}), evidence)
    read = {name: reader(evidence) for name, reader in READERS.items()}
    eff = {"async_scheduling": read["async_scheduling"].value,
           "async_parts": read["async_scheduling"].detail["async_parts"],
           "executor_class": read["executor"].value, "model_runner": read["model_runner"].value,
           "model_runner_classes": list(read["model_runner"].detail["model_runner_classes"]),
           "batch_invariant": read["batch_invariant"].value, "settings": rows}
    return eff, settings.mismatch(rows)


def _build_plan(sc: dict[str, Any], vocab: int) -> Plan:
    name = sc["scenario"]
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; valid: {sorted(SCENARIOS)}")
    return SCENARIOS[name](sc["id"], sc.get("params", {}), vocab, int(sc.get("seed", 0)))


# Runners that build their requests or reference from the bigram-cycle model's cycle (``ctx.perm``); the
# weight-sync runner says why itself, in its own words, the plan's runs with any model, and the stale-kv ones need
# the context-cell model (repro.scenarios.stale_kv says so).
BIGRAM_RUNNERS = frozenset(r for r in RUNNERS if r not in ("weight_sync", "plan") and not r.startswith("stale_kv_"))


async def run_scenario(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    params = dict(sc.get("params") or {})
    request = str(params.pop("request", "greedy"))  # the cell's request axis (repro.scenarios.sampling)
    sc = {**sc, "params": params}
    plan = _build_plan(sc, ctx.vocab)  # validates the parameters of every scenario
    if request != "greedy":
        return await _run_sampled(llm, sc, plan, request, ctx, timeout)
    if ctx.perm is None and sc["scenario"] in BIGRAM_RUNNERS:
        raise ScenarioUnsupported(
            f"the {sc['scenario']} scenario builds its requests or its reference from the bigram-cycle model's "
            f"cycle; with the {ctx.model_kind} model it cannot (run it with --model bigram-cycle, the default)")
    if sc["scenario"] in RUNNERS:
        # Scenarios that change the engine (weight sync) drive it themselves.
        return await RUNNERS[sc["scenario"]](llm, sc, ctx, timeout)
    return await run_with_reference(llm, plan, ctx.perm, sc["id"], timeout)


async def _run_sampled(llm: Any, sc: dict[str, Any], plan: Plan, request: str, ctx: EngineContext,
                       timeout: float) -> dict[str, Any]:
    """``plan`` with every request of kind ``request``, judged against the model's logprob table."""
    if sc["scenario"] in RUNNERS or ctx.perm is None:
        raise ScenarioUnsupported(
            f"{request} requests are realised by the keep, wait and abort pause scenarios on the bigram-cycle model "
            f"only so far (this is {sc['scenario']} on {ctx.model_kind})")
    if request == "structured":
        raise ScenarioUnsupported(await structured_refusal(llm, plan.requests[0].prompt, f"{sc['id']}-probe"))
    # Penalties show in the returned logprobs only as processed ones (repro.scenarios.sampling); the engine profile
    # of a penalties cell sets it, and an engine that returns raw ones cannot judge it.
    mode = str(getattr(llm.vllm_config.model_config, "logprobs_mode", "raw_logprobs"))
    if request == "penalties" and mode != "processed_logprobs":
        raise ScenarioUnsupported(f"penalties requests are judged by processed logprobs; this engine returns {mode}")
    seed = int(sc.get("seed", 0))
    plan.requests = [replace(r, sampling=sampling_kwargs(request, i, seed)) for i, r in enumerate(plan.requests)]
    table = TableModel(logit_table(ctx.model_dir), processed=mode == "processed_logprobs")
    return await run_with_reference(llm, plan, ctx.perm, sc["id"], timeout, table=table)


# Engine arguments of a profile (harness.core.scenarios.PROFILES) that vLLM's start-up may refuse, and words
# its refusal uses: CPU's ``ValueError: Sleep mode is not supported on current platform.``; a speculative method
# this version lacks, or async scheduling refused with it ("only supported with EAGLE/MTP/Draft Model/NGram GPU
# kind of speculative decoding").
PROFILE_REFUSALS: dict[str, tuple[str, ...]] = {
    "enable_sleep_mode": ("sleep mode",),
    "speculative_config": ("specul", "ngram", "draft"),
    # vLLM < 0.34.0: AsyncEngineArgs has no such field; CUDA/ROCm only (vllm/config/vllm.py:3208-3263).
    "enable_extensible_kv_cache": ("extensible",),
}


def vllm_message(exc: BaseException) -> str:
    """vLLM's own words in ``exc``: a pydantic ValidationError (vLLM's config classes, 0.2x) wraps them as
    ``1 validation error for ModelConfig / Value error, <message> [type=...]``; its ``errors()`` hold them."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            msgs = [str(e.get("msg", "")) for e in errors()]
        except Exception:
            msgs = []
        if any(msgs):
            return "; ".join(m for m in msgs if m)[:300]
    text = str(exc)
    return (text.splitlines() or [text])[0][:300]


def refused_setting(requested: dict[str, Any], exc: BaseException,
                    causes: Sequence[Sequence[str]] = ()) -> str | None:
    """The reason when vLLM's start-up refused an optional engine setting we asked for, else None.

    e.g. 0.22 without Triton: ``ValueError: VLLM_USE_V2_MODEL_RUNNER requires Triton.``, 0.21's
    ``VLLM_USE_V2_MODEL_RUNNER does not yet support: ...``, an attention backend refused with
    ``batch invariance not supported``, or a profile's engine argument (:data:`PROFILE_REFUSALS`), refused
    in ``exc`` itself or in a vLLM process's traceback that ``causes`` holds (``repro.core.rootcause``: a worker
    that raised while starting, its root cause only in the log).  Any other start-up failure stays an error.
    """
    text = f"{type(exc).__name__}: {exc}"
    first = (text.splitlines() or [text])[0][:300]
    args = requested.get("engine_args") or {}
    for arg, words in PROFILE_REFUSALS.items():
        if arg not in args:
            continue
        if any(w in text.lower() for w in words):
            return f"vLLM refused {arg}={args[arg]!r}: {type(exc).__name__}: {vllm_message(exc)}"
        for tb in reversed(causes):
            frames = [ln.strip() for ln in tb[:-1] if any(w in ln.lower() for w in words)]
            if frames and tb:
                return f"vLLM could not start with {arg}={args[arg]!r}: {tb[-1][:300]} (raised at `{frames[-1]}`)"
    if requested.get("model_runner") == "v2" and "V2_MODEL_RUNNER" in text:
        return f"vLLM refused model runner v2: {first}"
    if requested.get("batch_invariant") and ("batch invariance" in text.lower() or "BATCH_INVARIANT" in text):
        return f"vLLM refused VLLM_BATCH_INVARIANT=1: {first}"
    return None


async def run_cell(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float, unsupported: str | None,
                   emit: Emit) -> None:
    """Run one scenario and emit its result event; only a dead engine propagates.

    When the engine core died of an exception while the scenario ran, the event is its crash report
    (``repro.core.crash``): status ``crash`` when vLLM's own code raised, else ``error``, whatever the scenario
    itself saw (request errors, EngineDeadError, a wait that timed out).
    """
    if unsupported is not None:
        emit("scenario", id=sc["id"], status="unsupported", reason=unsupported)
        return
    fields = await _scenario_fields(llm, sc, ctx, timeout)
    report = crash.claim_report(os.environ.get(crash.ENV_CRASH_FILE))
    if report is not None:
        fields = crash.scenario_fields(report)
    elif fields["status"] == "ran":
        fields["probe_after"] = await probe_engine(llm)
    emit("scenario", id=sc["id"], **fields)
    if fields["status"] != "ran" and getattr(llm, "errored", False):
        raise RuntimeError(f"engine is dead ({fields['reason']}); the remaining scenarios cannot run")


async def _scenario_fields(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """The scenario event's fields as the scenario saw it: ran (with its records), unsupported, timeout or error."""
    try:
        return {"status": "ran", **await run_scenario(llm, sc, ctx, timeout)}
    except ScenarioUnsupported as exc:
        return {"status": "unsupported", "reason": str(exc)}
    except ScenarioTimeout as exc:
        # A timeout usually strikes while paused: resume so the next scenario
        # does not inherit a paused engine (its requests were cancelled).
        recovered = True
        try:
            await asyncio.wait_for(llm.resume_generation(), timeout)
        except Exception:
            recovered = False
        return {"status": "timeout", "reason": str(exc), "engine_recovered": recovered}
    except Exception as exc:
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
