"""What the engine-profile scenarios (preempt, chunked, sleep, spec-ngram) share: solo control runs, the engine
core's counters, and the precondition each states.

Their engines run with settings of their own (``harness.core.profiles.PROFILES``), so the reference must come
from the same engine *without the event under test*.  The event under test here is usually concurrency itself
(KV pressure, chunks beside decodes, batched drafts), so the control runs every request **alone**: one
request at a time on the same engine, which a tiny KV cache holds, whose prompt is chunked with nothing else
to decode, whose drafts are verified one request per step.  The control must also follow the checkpoint's
bigram cycle (``reference_matches_model``), or the cell is an ERROR (the oracle's model check), never a verdict.

A scenario whose event did not happen (no preemption, no draft, no mixed step, a sleep vLLM did not enter)
says so in its ``precondition``; the harness makes such a cell UNSUPPORTED with that reason unless a stream
is wrong anyway (``harness.run.runner.scenario_result``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from repro.models.deterministic import expected_continuation
from repro.scenarios.runs import run_plan, run_reference, run_unpaused
from repro.scenarios.vocab import (
    REFERENCE_MARGIN,
    EngineContext,
    PauseSpec,
    Plan,
    RequestSpec,
    ScenarioFailed,
    ScenarioUnsupported,
)


async def engine_counters(llm: Any) -> dict[str, Any]:
    """The engine core's counters (``repro.patches.counters``); ScenarioUnsupported when this engine has none."""
    try:
        got = await llm.engine_core.call_utility_async("repro_counters")
    except Exception as exc:
        raise ScenarioUnsupported(f"the engine core cannot report its scheduler counters: {exc!r}") from exc
    return dict(got)


def need_counter(counters: dict[str, Any], name: str) -> None:
    """ScenarioUnsupported when the counter ``name`` could not be installed on this vLLM (no evidence possible)."""
    if name not in (counters.get("requests") or {}):
        problems = "; ".join(counters.get("problems") or []) or "no reason recorded"
        raise ScenarioUnsupported(f"cannot count {name} on this vLLM ({problems}): the scenario could not show "
                                  "that its event happened")


def per_request(before: dict[str, Any], after: dict[str, Any], name: str, rids: list[str]) -> dict[str, int]:
    """How much the counter ``name`` grew between two snapshots, per scenario request id.

    AsyncLLM appends ``-<8 hex>`` to the caller's id (0.2x): an engine id counts for the scenario id it
    starts with.
    """
    old = (before.get("requests") or {}).get(name) or {}
    new = (after.get("requests") or {}).get(name) or {}
    out = dict.fromkeys(rids, 0)
    for internal, n in new.items():
        grown = int(n) - int(old.get(internal, 0))
        for rid in rids:
            if internal == rid or internal.startswith(rid + "-"):
                out[rid] += grown
    return out


def step_delta(before: dict[str, Any], after: dict[str, Any], name: str) -> int:
    return int((after.get("steps") or {}).get(name, 0)) - int((before.get("steps") or {}).get(name, 0))


async def run_solo(llm: Any, plan: Plan, timeout: float, tag: str) -> dict[str, list[int]]:
    """Each request of ``plan`` alone on the engine, one after the other (max_tokens + the reference margin)."""
    out: dict[str, list[int]] = {}
    for r in plan.requests:
        spec = RequestSpec(f"{tag}-solo-{r.rid}", r.prompt, r.max_tokens + REFERENCE_MARGIN)
        (out[r.rid],) = await run_unpaused(llm, [spec], timeout, "solo control")
    return out


async def solo_control(llm: Any, plan: Plan, timeout: float, tag: str, quiet: str | None = None,
                       ) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """The solo control streams, and facts about them; ``quiet``: a counter that must not move meanwhile.

    A control run that shows the event under test (a preemption of a request running alone) is no control:
    ScenarioFailed (ERROR), since the reference would carry the fault.
    """
    t0 = time.monotonic()
    before = await engine_counters(llm)
    refs = await run_solo(llm, plan, timeout, tag)
    after = await engine_counters(llm)
    facts: dict[str, Any] = {"event": "solo_control", "requests": len(refs),
                             "seconds": round(time.monotonic() - t0, 3)}
    if quiet is not None:
        moved = per_request(before, after, quiet, [f"{tag}-solo-{r.rid}" for r in plan.requests])
        facts[quiet] = sum(moved.values())
        if facts[quiet]:
            raise ScenarioFailed(f"the solo control run itself had {facts[quiet]} {quiet}: it is no fault-free "
                                 f"reference ({moved})")
    return refs, facts


def attach_references(records: list[dict[str, Any]], refs: dict[str, list[int]], perm: list[int]) -> None:
    """Each record's reference (its control stream) and whether that follows the checkpoint's cycle."""
    for rec in records:
        rec["reference"] = refs[rec["rid"]]
        analytic = expected_continuation(perm, rec["prompt"][-1], len(rec["reference"]))
        rec["reference_matches_model"] = rec["reference"] == analytic


def precondition(met: bool, what: str, why_not: str, evidence: dict[str, Any]) -> dict[str, Any]:
    """The ``precondition`` of a scenario event: ``what`` happened (shown with the verdict), or why not."""
    return {"met": met, "what": what if met else why_not, "evidence": evidence}


async def run_with_own_pauses(llm: Any, sid: str, plan: Plan, ctx: EngineContext, timeout: float,
                              problem: str | None, pauses: Callable[[Plan], list[PauseSpec]]) -> dict[str, Any]:
    """The shape of the scenarios whose pauses are vLLM calls of their own (sleep, checkpoint): refuse with
    ``problem`` (this vLLM lacks the API), else the plain reference, then ``plan`` with ``pauses(plan)`` in place
    of its pauses, every request checked against the reference."""
    t0 = time.monotonic()
    if problem:
        raise ScenarioUnsupported(problem)
    refs = await run_reference(llm, plan, timeout, sid)
    records, events = await run_plan(llm, Plan(plan.requests, pauses(plan)), timeout)
    attach_references(records, refs, ctx.perm)
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3)}
