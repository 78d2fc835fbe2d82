"""Playing a plan on the vLLM under test: the API checks, the paused run and the engine's no-pause
references."""

from __future__ import annotations

import inspect
import time
from typing import Any

from repro.models import expected_continuation
from repro.scenarios.base import (
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
from repro.scenarios.driver import Driver


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
    """Greedy streams of ``requests``, all submitted at once and never paused, in the order given."""
    sp_cls, kind = _vllm_api()
    driver = Driver(llm, Plan(requests=list(requests), pauses=[]), timeout, sp_cls, kind)
    records = await driver.run()
    for rec in records:
        if rec["error"]:
            raise ScenarioFailed(f"{what} request {rec['rid']} failed: {rec['error']}")
    return [rec["observed"] for rec in records]


async def run_reference(llm: Any, plan: Plan, timeout: float, tag: str,
                        staggered: bool = False) -> dict[str, list[int]]:
    """Greedy streams of every request in ``plan`` on the same engine, with no pause.

    All submitted at once; ``staggered``: the requests the plan submits during or after a pause join when
    the others reach its trigger, as they are batched in the paused run.
    """
    name = "ref2" if staggered else "ref"
    reqs = [RequestSpec(f"{tag}-{name}-{r.rid}", r.prompt, r.max_tokens + REFERENCE_MARGIN,
                        r.submit if staggered and submit_kind(r.submit) in ("during", "after") else "start")
            for r in plan.requests]
    if not staggered:
        streams = await run_unpaused(llm, reqs, timeout, "reference")
        return {r.rid: s for r, s in zip(plan.requests, streams, strict=True)}
    pauses = [PauseSpec(STAGGER, False, p.after_tokens) for p in plan.pauses]
    sp_cls, kind = _vllm_api()
    records = await Driver(llm, Plan(reqs, pauses), timeout, sp_cls, kind).run()
    for rec in records:
        if rec["error"]:
            raise ScenarioFailed(f"staggered reference request {rec['rid']} failed: {rec['error']}")
    return {r.rid: rec["observed"] for r, rec in zip(plan.requests, records, strict=True)}


async def run_with_reference(llm: Any, plan: Plan, perm: list[int] | None, sid: str,
                             timeout: float) -> dict[str, Any]:
    """The engine's no-pause reference of every request, then ``plan``: the ``scenario`` event's data.

    Each record carries its ``reference`` and, for the bigram-cycle model (``perm``), whether that follows
    the model's cycle (if it does not, the model, not the scheduler, is at fault).  A model whose stream is
    not known in advance is judged against the engine's own no-pause run, which must not depend on how
    requests are batched: a second reference, batched as the paused run is (the later requests joining once
    the first ones reach the pause), shows when it does (harness.core.oracle).
    """
    check_plan_api(llm, plan)  # before paying for the reference
    t0 = time.monotonic()
    refs = await run_reference(llm, plan, timeout, sid)
    repeat = None if perm is not None else await run_reference(llm, plan, timeout, sid, staggered=True)
    records, events = await run_plan(llm, plan, timeout)
    for rec in records:
        rec["reference"] = refs[rec["rid"]]
        if repeat is not None:
            rec["reference_repeat"] = repeat[rec["rid"]]
        if perm is not None:
            rec["reference_matches_model"] = rec["reference"] == expected_continuation(
                perm, rec["prompt"][-1], len(rec["reference"]))
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3)}

