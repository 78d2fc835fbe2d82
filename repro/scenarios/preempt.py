"""KV-pressure preemption: more long requests at once than the engine's tiny KV cache holds.

Runs on the ``tiny-kv`` engine profile (``harness.core.profiles.PROFILES``: 8 KV blocks of 32 tokens, one
of them vLLM's null block).  Every request needs two blocks by its end, so eight at once need sixteen: vLLM's
scheduler preempts running requests (frees their blocks, recomputes them later from prompt + output so far)
to let the others grow.  With async scheduling a preempted request may have an output frame in flight when
it is preempted; vLLM must neither deliver that stale frame twice nor lose it (the
``num_output_placeholders`` underflow on the KV-pressure preemption path: PR #47900, closed unmerged; fixed by
PR #48245 in 0.27.0).  Every request must end with
exactly its reference stream.

Reference: each request run **alone** on the same engine (one request fits the cache, so nothing is
preempted; checked: a preemption during the control run is an ERROR), which must also follow the bigram
cycle.  Evidence: the engine core counts every ``Scheduler._preempt_request`` (``repro.patches.counters``); the count
per request goes into its record (``preemptions``) and the scenario's events, and a run that provoked no
preemption states a failed precondition (the cell is UNSUPPORTED, never OK).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from repro.scenarios._profile import (
    attach_references,
    engine_counters,
    need_counter,
    per_request,
    precondition,
    solo_control,
)
from repro.scenarios.runs import run_plan
from repro.scenarios.vocab import EngineContext, Plan, RequestSpec, make_prompts, params_from_dict


@dataclass(frozen=True)
class PreemptParams:
    num_requests: int = 8  # all submitted at once
    prompt_len: int = 8
    max_tokens: int = 48

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreemptParams:
        return params_from_dict(cls, data, "preempt parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    p = PreemptParams.from_dict(params)
    prompts = make_prompts(p.num_requests, p.prompt_len, vocab_size, seed)
    return Plan([RequestSpec(f"{sid}-r{i:02d}", prompts[i], p.max_tokens) for i in range(p.num_requests)], [])


def cache_facts(llm: Any) -> dict[str, Any]:
    """The KV cache the engine reports: blocks and block size (what made the pressure)."""
    cache = llm.vllm_config.cache_config
    return {"num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
            "num_gpu_blocks_override": getattr(cache, "num_gpu_blocks_override", None),
            "block_size": getattr(cache, "block_size", None)}


def preemption_precondition(by_request: dict[str, int], cache: dict[str, Any]) -> dict[str, Any]:
    """Met when at least one request was preempted; the evidence is the count per request."""
    total = sum(by_request.values())
    hit = sum(1 for n in by_request.values() if n)
    return precondition(
        total > 0, f"{total} preemption(s) in {hit}/{len(by_request)} requests",
        f"precondition not met: no request was preempted (KV cache {cache}); the cell tested no preemption",
        {"preemptions": total, "requests_preempted": hit, "cache": cache})


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Solo control, then every request at once under KV pressure; counts preemptions in both."""
    t0 = time.monotonic()
    plan = build(sc["id"], sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    need_counter(await engine_counters(llm), "preemptions")
    refs, control = await solo_control(llm, plan, timeout, sc["id"], quiet="preemptions")
    before = await engine_counters(llm)
    records, events = await run_plan(llm, plan, timeout)
    after = await engine_counters(llm)
    by_request = per_request(before, after, "preemptions", [r.rid for r in plan.requests])
    for rec in records:
        rec["preemptions"] = by_request[rec["rid"]]
    attach_references(records, refs, ctx.perm)
    cache = cache_facts(llm)
    events += [control, {"event": "preemptions", "total": sum(by_request.values()), "by_request": by_request,
                         "cache": cache}]
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3),
            "precondition": preemption_precondition(by_request, cache)}
