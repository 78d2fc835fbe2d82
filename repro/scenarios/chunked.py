"""Chunked prefill beside running decodes: many long prompts against a small step budget.

The shape of vllm#57562 (``AsyncScheduler`` ``num_output_placeholders`` underflow with chunked prefill and
concurrency, no spec decode, no preemption; reported on 0.29.0 as a regression from 0.24.0): runs on the
``chunked`` engine profile (``max_num_batched_tokens=32``, chunked prefill on).  A first wave of requests
with 96-token prompts starts at once, so their prompts are prefilled 32 tokens a step, each while the
earlier ones already decode; once every first-wave request has ``pause_after`` tokens, a second wave of long
prompts arrives and is chunk-prefilled beside the first wave's decodes.  Every stream must equal its
reference; vLLM's own code raising in the engine core ends the engine (the cells left are ERROR/CRASH).

Reference: each request alone on the same engine (its prompt still chunked, with nothing decoding beside it:
checked, the control run has no mixed step).  Evidence: the engine core counts, per scheduler step, prefill
chunks and steps holding a chunk and a decode (``repro.patches.counters``); a run without a mixed step or with an
unchunked prompt states a failed precondition (UNSUPPORTED, never OK).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from repro.scenarios._common import two_wave_plan
from repro.scenarios._profile import (
    attach_references,
    engine_counters,
    need_counter,
    per_request,
    precondition,
    solo_control,
    step_delta,
)
from repro.scenarios.runs import run_plan
from repro.scenarios.vocab import EngineContext, Plan, ScenarioFailed, params_from_dict


@dataclass(frozen=True)
class ChunkedParams:
    num_requests: int = 8  # first wave, submitted at once
    extra_requests: int = 8  # second wave, once the first wave decodes
    prompt_len: int = 96  # three 32-token chunks each
    max_tokens: int = 48
    pause_after: int = 8  # tokens every first-wave request has when the second wave arrives (no pause)

    def __post_init__(self) -> None:
        if not 1 <= self.pause_after < self.max_tokens:
            raise ValueError(f"pause_after={self.pause_after} must be in [1, max_tokens={self.max_tokens}), or the "
                             "second wave meets no decode")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChunkedParams:
        return params_from_dict(cls, data, "chunked parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    p = ChunkedParams.from_dict(params)
    return two_wave_plan(sid, p.num_requests, p.extra_requests, p.prompt_len, p.max_tokens, p.pause_after,
                         vocab_size, seed)


def chunk_precondition(chunks: dict[str, int], mixed: int, budget: Any) -> dict[str, Any]:
    """Met when every prompt was prefilled in two or more chunks and some step mixed a chunk with a decode."""
    unchunked = sorted(rid for rid, n in chunks.items() if n < 2)
    met = mixed > 0 and not unchunked
    why = (f"precondition not met: {mixed} scheduler step(s) held a prefill chunk beside a decode; prompts not "
           f"chunked: {unchunked or 'none'} (max_num_batched_tokens={budget})")
    return precondition(met, f"{mixed} mixed chunk+decode step(s), {sum(chunks.values())} prefill chunks",
                        why, {"mixed_steps": mixed, "prefill_chunks": chunks, "max_num_batched_tokens": budget})


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Solo control, then the two waves; counts chunks and mixed steps of the waves."""
    t0 = time.monotonic()
    plan = build(sc["id"], sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    start = await engine_counters(llm)
    need_counter(start, "prefill_chunks")
    refs, control = await solo_control(llm, plan, timeout, sc["id"])
    before = await engine_counters(llm)
    control["mixed_steps"] = step_delta(start, before, "mixed_steps")
    if control["mixed_steps"]:
        raise ScenarioFailed(f"the solo control run had {control['mixed_steps']} mixed step(s): not solo")
    records, events = await run_plan(llm, plan, timeout)
    after = await engine_counters(llm)
    chunks = per_request(before, after, "prefill_chunks", [r.rid for r in plan.requests])
    for rec in records:
        rec["prefill_chunks"] = chunks[rec["rid"]]
    attach_references(records, refs, ctx.perm)
    mixed = step_delta(before, after, "mixed_steps")
    budget = llm.vllm_config.scheduler_config.max_num_batched_tokens
    events += [control, {"event": "chunks", "mixed_steps": mixed, "steps": step_delta(before, after, "steps"),
                         "prefill_chunks": chunks, "max_num_batched_tokens": budget}]
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3),
            "precondition": chunk_precondition(chunks, mixed, budget)}
