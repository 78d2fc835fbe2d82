"""vllm#51476: requests that arrive during an abort/wait pause are served by the weights loaded after it.

``pause_generation(mode="abort"|"wait")`` is a generation boundary: what was in flight is handed back (aborted or
finished) before the pause returns, and a caller pauses there to swap weights.  A request that *arrives* while
paused was admitted under the old weights and, up to vLLM 0.32, silently queued (at AsyncLLM's own pause gate up to
0.16.0, in the scheduler's waiting queue from the release that moved the pause into the engine core; PR #51487's
description quotes ``Scheduler.get_num_unfinished_requests`` hiding it), so it is served by the new weights and
nobody is told.  vLLM 0.33.0's engine core refuses such an add with a retryable error instead
(``EngineCore._reject_add_while_paused``, "Generation is paused. Please retry after it resumes.",
vllm/v1/engine/core.py:1796-1816 in the 0.33.0 wheel, read; open PR #51488 proposes the same, PR #51487 closed).

The flow: weights A, ``num_requests`` requests at start, ``pause_generation(mode, clear_cache)`` once each has
``pause_after`` tokens, then ``late_requests`` more submitted and **held by the paused engine before the swap**
(the driver waits until the engine core reports them, or they wait at the 0.16.0 front-end gate, or vLLM refused
them), then weights B reloaded in place, resume.  A and B are bigram-cycle checkpoints whose cycles differ at every
token (``repro.models.deterministic.swap_partner``), so a stream says which weights served it.

Judged per request:

* a request admitted while paused (no refusal) must be served as it was admitted, under A: its reference is the
  engine's own no-pause stream under A, and a stream that follows B instead is ``DIVERGED(at 0)`` (the bug);
* a request vLLM refused while paused is retried by the driver after the resume (as vLLM asks), so it is admitted
  under B: its reference is B's stream (``repro.models.deterministic.expected_continuation`` on B's cycle);
* a request running at the pause ran under A only (wait: finished; abort: an aborted prefix).

Each late record also says which weights served it (``paused_admission``), and the scenario's precondition is that
every late request met the paused engine before the swap.  Weights A are restored (and checked) afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from repro.models.deterministic import build_checkpoint, expected_continuation, load_perm, swap_partner
from repro.scenarios._profile import precondition
from repro.scenarios.rlhf_weight_sync import _restore_a
from repro.scenarios.runs import check_pause_api, run_plan, run_reference
from repro.scenarios.vocab import (
    REFERENCE_MARGIN,
    EngineContext,
    PauseSpec,
    Plan,
    RequestSpec,
    ScenarioFailed,
    ScenarioUnsupported,
    make_prompts,
    params_from_dict,
)
from repro.scenarios.weight_transfer import reload_transfer

MODES = ("wait", "abort")
# The record-id suffix of the requests that arrive while paused: the ones the known-bug row expects the fault in
# (harness.core.scenarios fault_records).
LATE = "-late"


@dataclass(frozen=True)
class PausedAdmissionParams:
    mode: str = "wait"
    clear_cache: bool = True
    num_requests: int = 4
    late_requests: int = 2
    prompt_len: int = 6
    max_tokens: int = 24
    pause_after: int = 8

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"paused_admission mode {self.mode!r}: a boundary pause is one of {', '.join(MODES)}")
        if self.pause_after >= self.max_tokens:
            raise ValueError(f"pause_after={self.pause_after} must be below max_tokens={self.max_tokens}")
        if self.late_requests < 1:
            raise ValueError("late_requests must be at least 1: they are what the scenario checks")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PausedAdmissionParams:
        return params_from_dict(cls, data, "paused_admission parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """The requests and the pause; the swap is attached by :func:`run`."""
    p = PausedAdmissionParams.from_dict(params)
    prompts = make_prompts(p.num_requests + p.late_requests, p.prompt_len, vocab_size, seed)
    reqs = [RequestSpec(f"{sid}-r{i:02d}", prompts[i], p.max_tokens) for i in range(p.num_requests)]
    reqs += [RequestSpec(f"{sid}-x{i:02d}{LATE}", prompts[p.num_requests + i], p.max_tokens, ("during", 0))
             for i in range(p.late_requests)]
    return Plan(reqs, [PauseSpec(p.mode, p.clear_cache, p.pause_after, admit_before_action=True)])


def served_by(observed: list[int], stream_a: list[int], stream_b: list[int]) -> str:
    """"A", "B", "none" (no token) or "neither": which weights' greedy stream ``observed`` is a prefix of."""
    if not observed:
        return "none"
    for name, stream in (("A", stream_a), ("B", stream_b)):
        if observed == stream[:len(observed)]:
            return name
    return "neither"


def judge_late(rec: dict[str, Any], stream_a: list[int], stream_b: list[int]) -> None:
    """Give a late request its reference (A's stream if admitted while paused, B's if refused and retried after the
    resume) and the facts the report shows."""
    refused = list(rec.get("rejected_while_paused") or [])
    rec["reference"] = stream_b if refused else stream_a
    rec["paused_admission"] = {
        "admitted_while_paused": not refused,
        "refusals": len(refused),
        "served_by": served_by(list(rec["observed"]), stream_a, stream_b),
    }


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Play the scenario ``sc`` on ``llm`` (holding A); return the scenario event's data."""
    t0 = time.monotonic()
    p = PausedAdmissionParams.from_dict(sc.get("params", {}))
    if ctx.perm is None:
        raise ScenarioUnsupported(
            f"paused-admission tells which weights served a request from two bigram-cycle checkpoints A and B; with "
            f"the {ctx.model_kind} model there is no checkpoint B whose stream is known (run it with --model "
            "bigram-cycle, the default)")
    sid = sc["id"]
    plan = build(sid, sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    check_pause_api(llm)
    transfer = await reload_transfer(llm)
    spec_b = swap_partner(ctx.model_spec)
    dir_b = build_checkpoint(spec_b, ctx.model_cache)
    perm_a, perm_b = ctx.perm, load_perm(dir_b)
    engine_a = await run_reference(llm, plan, timeout, sid)  # the engine's own no-pause streams under A

    async def swap() -> dict[str, Any]:
        return await transfer.load(dir_b)

    pause = plan.pauses[0]
    try:
        records, events = await run_plan(
            llm, Plan(plan.requests, [PauseSpec(pause.mode, pause.clear_cache, pause.after_tokens, action=swap,
                                                admit_before_action=True)]), timeout)
    finally:
        restore = await _restore_a(llm, transfer, ctx, plan, timeout)
    if not any(e.get("event") == "pause_action" for e in events):
        raise ScenarioFailed("the weights were never swapped (the pause did not happen)")
    for rec in records:
        a = engine_a[rec["rid"]]
        rec["reference_matches_model"] = a == expected_continuation(perm_a, rec["prompt"][-1], len(a))
        if rec["rid"].endswith(LATE):
            judge_late(rec, a, expected_continuation(perm_b, rec["prompt"][-1], p.max_tokens + REFERENCE_MARGIN))
        else:
            rec["reference"] = a
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3),
            "precondition": _precondition(records, events, restore)}


def _precondition(records: list[dict[str, Any]], events: list[dict[str, Any]],
                  restore: dict[str, Any]) -> dict[str, Any]:
    """Met when every late request met the paused engine before the swap (held by it, or refused by it)."""
    late = [r for r in records if r["rid"].endswith(LATE)]
    order = [e.get("event") for e in events]
    arrived = "arrived_while_paused" in order and "pause_action" in order and (
        order.index("arrived_while_paused") < order.index("pause_action"))
    refused = sum(bool(r.get("rejected_while_paused")) for r in late)
    held = next((e.get("held_at_front_end") for e in events if e.get("event") == "arrived_while_paused"), None)
    where = ("held at AsyncLLM's front-end pause gate" if held else
             "refused by the engine" if refused == len(late) else "held by the paused engine")
    evidence = {"late_requests": len(late), "refused_while_paused": refused, "front_end_gate": bool(held),
                "served_by": {r["rid"]: r["paused_admission"]["served_by"] for r in late}, "restore": restore}
    return precondition(arrived, f"{len(late)} request(s) arrived while paused ({where}) before the weights "
                        "were swapped to B",
                        "the late requests were not shown to meet the paused engine before the swap", evidence)

