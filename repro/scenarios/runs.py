"""Playing a plan on the vLLM under test: the API checks, the paused run and the engine's no-pause
references."""

from __future__ import annotations

import inspect
import time
from typing import Any

from repro.models.deterministic import expected_continuation
from repro.scenarios.driver import Driver, group_streams
from repro.scenarios.vocab import (
    REFERENCE_MARGIN,
    STAGGER,
    PauseAction,
    PauseSpec,
    Plan,
    RequestSpec,
    ScenarioFailed,
    ScenarioUnsupported,
    submit_kind,
)


def _vllm_api() -> tuple[Any, Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams, RequestOutputKind.DELTA


def check_pause_api(llm: Any) -> None:
    """Raise ScenarioUnsupported when this vLLM (an AsyncLLM or its class) lacks pause modes."""
    fn = getattr(llm, "pause_generation", None)
    if fn is None:
        raise ScenarioUnsupported("AsyncLLM has no pause_generation()")
    params = inspect.signature(fn).parameters
    if "mode" not in params:
        raise ScenarioUnsupported(
            "AsyncLLM.pause_generation() has no mode= argument (keep/wait/abort pause "
            "modes arrived later)"
        )
    if "clear_cache" not in params:
        raise ScenarioUnsupported("AsyncLLM.pause_generation() has no clear_cache= argument")


def check_reset_api(llm: Any) -> None:
    """Raise ScenarioUnsupported when this vLLM cannot reset the prefix cache with requests running."""
    fn = getattr(llm, "reset_prefix_cache", None)
    if fn is None:
        raise ScenarioUnsupported("AsyncLLM has no reset_prefix_cache()")
    params = inspect.signature(fn).parameters
    if "reset_running_requests" not in params:
        raise ScenarioUnsupported(
            f"AsyncLLM.reset_prefix_cache({', '.join(n for n in params if n != 'self')}) takes no "
            "reset_running_requests=: this vLLM cannot preempt running requests to reset the cache"
        )


def reset_action(llm: Any) -> PauseAction:
    """A pause action: ``reset_prefix_cache(reset_running_requests=True)``, as RL frameworks call it by hand.

    Returns the engine's view of every request right before (frames in flight: num_output_placeholders)
    and right after (status, tokens, the discard it was marked for) for the event log: the evidence of
    what the reset did to the frozen requests.
    """
    async def progress() -> dict[str, Any]:
        try:
            return dict(await llm.engine_core.call_utility_async("repro_request_progress"))
        except Exception as exc:
            return {"unavailable": repr(exc)}

    async def act() -> dict[str, Any]:
        before = await progress()
        ok = await llm.reset_prefix_cache(reset_running_requests=True)
        return {"explicit_reset": True, "reset_ok": ok, "before_reset": before, "after_reset": await progress()}

    return act


def check_plan_api(llm: Any, plan: Plan) -> None:
    """Raise ScenarioUnsupported when this vLLM lacks an API ``plan`` uses (pause modes, a running-request reset)."""
    if plan.pauses:
        check_pause_api(llm)
    if any(op.op == "reset" for op in plan.inflight):
        check_reset_api(llm)


async def run_plan(llm: Any, plan: Plan, timeout: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Play ``plan``; return (request records, event log)."""
    check_plan_api(llm, plan)
    sp_cls, kind = _vllm_api()
    driver = Driver(llm, plan, timeout, sp_cls, kind)
    records = await driver.run()
    return records, driver.events


async def run_unpaused(llm: Any, requests: list[RequestSpec], timeout: float, what: str) -> list[list[int]]:
    """Streams of ``requests`` (one per child of an n > 1 request), all submitted at once and never paused."""
    return [rec["observed"] for rec in await _unpaused_records(llm, requests, timeout, what)]


async def _unpaused_records(llm: Any, requests: list[RequestSpec], timeout: float,
                            what: str) -> list[dict[str, Any]]:
    sp_cls, kind = _vllm_api()
    records = await Driver(llm, Plan(requests=list(requests), pauses=[]), timeout, sp_cls, kind).run()
    for rec in records:
        if rec["error"]:
            raise ScenarioFailed(f"{what} request {rec['rid']} failed: {rec['error']}")
    return records


def stream_keys(requests: list[RequestSpec]) -> list[str]:
    """The record ids a plan's requests give, in the driver's order (children of an n > 1 request in turn)."""
    return [s.key for g in group_streams(requests).values() for s in g]


async def run_reference(llm: Any, plan: Plan, timeout: float, tag: str,
                        staggered: bool = False) -> dict[str, list[int]]:
    """The tokens of every stream of ``plan`` (by record id) on the same engine, with no pause
    (:func:`reference_records`)."""
    records = await reference_records(llm, plan, timeout, tag, staggered)
    return {key: rec["observed"] for key, rec in records.items()}


async def reference_records(llm: Any, plan: Plan, timeout: float, tag: str,
                            staggered: bool = False) -> dict[str, dict[str, Any]]:
    """The record of every stream of ``plan`` (by record id) on the same engine, with no pause.

    All submitted at once; ``staggered``: the requests the plan submits during or after a pause join when
    the others reach its trigger, as they are batched in the paused run.  Requests keep their sampling
    parameters (a sampled request its seed).
    """
    name = "ref2" if staggered else "ref"
    reqs = [RequestSpec(f"{tag}-{name}-{r.rid}", r.prompt, r.max_tokens + REFERENCE_MARGIN,
                        r.submit if staggered and submit_kind(r.submit) in ("during", "after") else "start",
                        r.sampling)
            for r in plan.requests]
    if not staggered:
        records = await _unpaused_records(llm, reqs, timeout, "reference")
    else:
        pauses = [PauseSpec(STAGGER, False, p.after_tokens) for p in plan.pauses]
        sp_cls, kind = _vllm_api()
        records = await Driver(llm, Plan(reqs, pauses), timeout, sp_cls, kind).run()
        for rec in records:
            if rec["error"]:
                raise ScenarioFailed(f"staggered reference request {rec['rid']} failed: {rec['error']}")
    return dict(zip(stream_keys(plan.requests), records, strict=True))


async def run_with_reference(llm: Any, plan: Plan, perm: list[int] | None, sid: str,
                             timeout: float, table: Any = None) -> dict[str, Any]:
    """The engine's no-pause reference of every request, then ``plan``: the ``scenario`` event's data.

    Each record carries its ``reference`` and, for the bigram-cycle model (``perm``), whether that follows
    the model's cycle (if it does not, the model, not the scheduler, is at fault).  A model whose stream is
    not known in advance is judged against the engine's own no-pause run, which must not depend on how
    requests are batched: a second reference, batched as the paused run is (the later requests joining once
    the first ones reach the pause), shows when it does (harness.core.oracle).  Sampled requests (``table``: the
    model's logprob table, repro.scenarios.sampling) always get the second reference: it measures whether
    seeded sampling is reproducible run to run and across batch compositions; their records carry the logprob the
    table gives every delivered token on the delivered history (repro.scenarios.sampling.TableModel), for the
    reference and the run.
    """
    check_plan_api(llm, plan)  # before paying for the reference
    t0 = time.monotonic()
    refs = await reference_records(llm, plan, timeout, sid)
    sampled = table is not None
    repeat = None if perm is not None and not sampled else await reference_records(
        llm, plan, timeout, sid, staggered=True)
    records, events = await run_plan(llm, plan, timeout)
    for rec in records:
        rec["reference"] = refs[rec["rid"]]["observed"]
        if repeat is not None:
            rec["reference_repeat"] = repeat[rec["rid"]]["observed"]
        if sampled:
            _sampled_fields(rec, refs[rec["rid"]], table)
        elif perm is not None:
            rec["reference_matches_model"] = rec["reference"] == expected_continuation(
                perm, rec["prompt"][-1], len(rec["reference"]))
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3)}


def _sampled_fields(rec: dict[str, Any], ref: dict[str, Any], table: Any) -> None:
    """A sampled record's logprobs: the reference's as vLLM returned them, and the table's for both streams."""
    rec["reference_logprobs"] = ref.get("logprobs")
    sampling = dict(rec.get("sampling") or {})
    rec["model_logprobs"] = table.logprobs(rec["prompt"], rec["observed"], sampling)
    rec["reference_model_logprobs"] = table.logprobs(rec["prompt"], rec["reference"], sampling)
