"""N-gram speculative decoding with async scheduling: without a pause (``spec_ngram``) and with a keep pause
(``spec_ngram_pause``, clear_cache true or false).

Runs on the ``spec-ngram`` engine profile: ``speculative_config={"method": "ngram_gpu",
"num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}`` (ngram_gpu is the n-gram
proposer vLLM 0.21+ allows with async scheduling; no draft model).  Every prompt holds its own continuation,
``[a, perm(a), perm²(a), ..., perm^(L-1)(a), a]`` (L = ``copy_len``, by default half of ``max_tokens``): once
a request has produced ``perm(a)``, the proposer finds its last two tokens in the prompt and drafts the next
three, which the bigram-cycle model accepts; where the prompt's copy ends the draft (``a, perm(a), ...``) is
rejected, and past it nothing matches (a stream never repeats a token).  Drafts accepted, drafts rejected and
plain decoding all happen in every request, and greedy verification must give exactly the model's own stream.

With a pause (keep, once every running request has ``pause_after`` tokens, inside the accepted stretch):
``clear_cache=True`` force-preempts requests with draft tokens in flight (the ``num_output_placeholders``
path of PR #46066); ``False`` is a plain freeze.  Requests submitted during the pause start after resume.

Reference: each request alone on the same engine (still speculating, with nothing batched beside it and no
pause), which must follow the bigram cycle; a speculative-decoding fault that shows even alone therefore
fails that model check (ERROR, with the streams), it is not hidden.  Evidence: the engine core counts drafted
and accepted tokens per request (``repro.patches.counters``, from ``Scheduler.make_spec_decoding_stats``); a run with
no accepted draft states a failed precondition (UNSUPPORTED, never OK).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from repro.models.deterministic import expected_continuation
from repro.scenarios._profile import (
    attach_references,
    engine_counters,
    need_counter,
    per_request,
    precondition,
    solo_control,
)
from repro.scenarios.runs import run_plan
from repro.scenarios.vocab import EngineContext, PauseSpec, Plan, RequestSpec, params_from_dict


@dataclass(frozen=True)
class SpecParams:
    num_requests: int = 8
    copy_len: int = 0  # tokens of its own continuation each prompt holds; 0: half of max_tokens
    max_tokens: int = 48

    def __post_init__(self) -> None:
        if not 3 <= self.copy < self.max_tokens:
            raise ValueError(f"copy_len={self.copy} must be in [3, max_tokens={self.max_tokens}): drafts must "
                             "be accepted first and rejected where the copy ends")

    @property
    def copy(self) -> int:
        return self.copy_len or self.max_tokens // 2

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecParams:
        return params_from_dict(cls, data, "spec_ngram parameters")


@dataclass(frozen=True)
class SpecPauseParams(SpecParams):
    mode: str = "keep"
    clear_cache: bool = True
    extra_requests: int = 2  # submitted during the pause
    pause_after: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode != "keep":
            raise ValueError(f"spec_ngram_pause mode {self.mode!r}: it pauses in keep mode only")
        if self.pause_after >= self.max_tokens:
            raise ValueError(f"pause_after={self.pause_after} must be below max_tokens={self.max_tokens}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecPauseParams:
        return params_from_dict(cls, data, "spec_ngram_pause parameters")


def self_copy_prompts(n: int, copy_len: int, perm: list[int], seed: int) -> list[list[int]]:
    """``n`` prompts ``walk(a, copy_len) + [a]`` with distinct start tokens ``a`` (ids 2.., clear of BOS/EOS)."""
    starts = random.Random(seed).sample(range(2, len(perm)), n)
    return [[a, *expected_continuation(perm, a, copy_len - 1), a] for a in starts]


def build_with(sid: str, p: SpecParams, perm: list[int], seed: int) -> Plan:
    extra = p.extra_requests if isinstance(p, SpecPauseParams) else 0
    prompts = self_copy_prompts(p.num_requests + extra, p.copy, perm, seed)
    reqs = [RequestSpec(f"{sid}-r{i:02d}", prompts[i], p.max_tokens) for i in range(p.num_requests)]
    reqs += [RequestSpec(f"{sid}-x{i:02d}", prompts[p.num_requests + i], p.max_tokens, ("during", 0))
             for i in range(extra)]
    pauses = [PauseSpec(p.mode, p.clear_cache, p.pause_after)] if isinstance(p, SpecPauseParams) else []
    return Plan(reqs, pauses)


def _stand_in_cycle(vocab_size: int) -> list[int]:
    return [*range(1, vocab_size), 0]


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """The no-pause plan, for parameter checks: its prompts follow a stand-in cycle (t -> t+1), since only the
    engine knows its checkpoint's; :func:`run` builds the real one with :func:`build_with`."""
    return build_with(sid, SpecParams.from_dict(params), _stand_in_cycle(vocab_size), seed)


def build_pause(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """Like :func:`build`, with the keep pause."""
    return build_with(sid, SpecPauseParams.from_dict(params), _stand_in_cycle(vocab_size), seed)


def draft_precondition(drafted: dict[str, int], accepted: dict[str, int]) -> dict[str, Any]:
    """Met when some draft token was accepted; the evidence is drafted/accepted per request."""
    d, a = sum(drafted.values()), sum(accepted.values())
    return precondition(a > 0, f"{a}/{d} draft tokens accepted",
                        f"precondition not met: {d} draft tokens proposed, {a} accepted: nothing was speculated",
                        {"drafted": d, "accepted": a, "drafted_by_request": drafted,
                         "accepted_by_request": accepted})


async def run_spec(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float, pause: bool) -> dict[str, Any]:
    t0 = time.monotonic()
    cls = SpecPauseParams if pause else SpecParams
    plan = build_with(sc["id"], cls.from_dict(sc.get("params", {})), ctx.perm, int(sc.get("seed", 0)))
    need_counter(await engine_counters(llm), "drafted")
    refs, control = await solo_control(llm, plan, timeout, sc["id"])
    before = await engine_counters(llm)
    records, events = await run_plan(llm, plan, timeout)
    after = await engine_counters(llm)
    rids = [r.rid for r in plan.requests]
    drafted, accepted = (per_request(before, after, name, rids) for name in ("drafted", "accepted"))
    for rec in records:
        rec["spec"] = {"drafted": drafted[rec["rid"]], "accepted": accepted[rec["rid"]]}
    attach_references(records, refs, ctx.perm)
    events += [control, {"event": "spec_decode", "drafted": drafted, "accepted": accepted,
                         "speculative_config": str(llm.vllm_config.speculative_config)}]
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3),
            "precondition": draft_precondition(drafted, accepted)}


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    return await run_spec(llm, sc, ctx, timeout, pause=False)


async def run_pause(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    return await run_spec(llm, sc, ctx, timeout, pause=True)
