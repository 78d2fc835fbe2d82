"""One cell on a running engine: does the engine run it as labelled, and its scenario's result event.

A cell is an engine config and a scenario.  ``repro.engine.main`` starts the
engine and reads back its *effective* settings (``repro.settings.effective``:
a cell labelled async must really run the AsyncScheduler); ``run_cell`` runs one scenario on it and emits its
``scenario`` event (described in ``repro.core.wire``).
"""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from repro.core import crash
from repro.scenarios import RUNNERS, SCENARIOS
from repro.scenarios.runs import run_with_reference
from repro.scenarios.sampling import TableModel, logit_table, sampling_kwargs
from repro.scenarios.seeded_prefill import UNSEEDED, with_chunk_evidence
from repro.scenarios.spec_draft import with_draft_evidence
from repro.scenarios.structured import structured_refusal
from repro.scenarios.vocab import EngineContext, Plan, ScenarioTimeout, ScenarioUnsupported
from repro.settings.effective import probe_engine

__all__ = ["run_cell", "run_scenario"]

Emit = Callable[..., None]  # emit(kind, **fields): one event, checked against repro.core.wire


def _build_plan(sc: dict[str, Any], vocab: int) -> Plan:
    name = sc["scenario"]
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; valid: {sorted(SCENARIOS)}")
    return SCENARIOS[name](sc["id"], sc.get("params", {}), vocab, int(sc.get("seed", 0)))


# Plain-plan scenarios (no runner of their own: every request kind runs through the generic reference-then-plan
# run) whose event is speculative decoding: the engine core's draft counters are their precondition.
DRAFT_COUNTED = frozenset({"spec_draft"})
# Plain-plan scenarios whose event is a chunked prefill: the engine core's prefill-chunk counter is their precondition.
CHUNK_COUNTED = frozenset({"seeded_prefill", "unseeded_prefill"})
# Runners that build their requests or reference from the bigram-cycle model's cycle (``ctx.perm``); the
# weight-sync runner says why itself, in its own words, the plan's runs with any model, and the stale-kv ones
# (native_update_*, sleep_update_*, lora_* too) need the context-cell model (repro.scenarios.stale_kv says so).
BIGRAM_RUNNERS = frozenset(r for r in RUNNERS if r not in ("weight_sync", "plan")
                           and not r.startswith(("stale_kv_", "native_update_", "sleep_update_", "lora_")))


async def run_scenario(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    params = dict(sc.get("params") or {})
    request = str(params.pop("request", "greedy"))  # the cell's request axis (repro.scenarios.sampling)
    sc = {**sc, "params": params}
    plan = _build_plan(sc, ctx.vocab)  # validates the parameters of every scenario
    if sc["scenario"] in DRAFT_COUNTED:  # the plain run, with the drafts its requests saw as its precondition
        return await with_draft_evidence(llm, plan, lambda: _run_plain(llm, sc, plan, request, ctx, timeout))
    if sc["scenario"] in CHUNK_COUNTED:
        return await with_chunk_evidence(llm, plan, lambda: _run_plain(llm, sc, plan, request, ctx, timeout))
    return await _run_plain(llm, sc, plan, request, ctx, timeout)


async def _run_plain(llm: Any, sc: dict[str, Any], plan: Plan, request: str, ctx: EngineContext,
                     timeout: float) -> dict[str, Any]:
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
    # The server door's /v1/completions may lack bad_words and would serve the requests without them
    # (repro.server.http_llm.HttpLLM.require_completion_field): UNSUPPORTED before any request, not a failed one.
    if request == "bad_words" and (require := getattr(llm, "require_completion_field", None)) is not None:
        await require("bad_words")
    if request == "structured" and (why := await structured_refusal(llm, plan.requests[0].prompt,
                                                                      f"{sc['id']}-probe")) is not None:
        raise ScenarioUnsupported(why)
    # Penalties show in the returned logprobs only as processed ones (repro.scenarios.sampling); the engine profile
    # of a penalties cell sets it, and an engine that returns raw ones cannot judge it.
    mode = str(getattr(llm.vllm_config.model_config, "logprobs_mode", "raw_logprobs"))
    if request == "penalties" and mode != "processed_logprobs":
        raise ScenarioUnsupported(f"penalties requests are judged by processed logprobs; this engine returns {mode}")
    seed = int(sc.get("seed", 0))
    plan.requests = [replace(r, sampling=sampling_kwargs(request, i, seed, ctx.perm))
                     for i, r in enumerate(plan.requests)]
    if sc["scenario"] in UNSEEDED:  # the control of a seeded scenario: vLLM keeps no generator of the request's own
        plan.requests = [replace(r, sampling={k: v for k, v in r.sampling.items() if k != "seed"})
                         for r in plan.requests]
    table = TableModel(logit_table(ctx.model_dir), processed=mode == "processed_logprobs")
    return await run_with_reference(llm, plan, ctx.perm, sc["id"], timeout, table=table)


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
