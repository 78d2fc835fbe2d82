"""The reset RL frameworks write by hand: keep pause without clear_cache, explicit reset, resume.

``pause_generation(mode="keep", clear_cache=False)`` freezes the running
requests with nothing in flight; then the client calls
``reset_prefix_cache(reset_running_requests=True)`` itself (to drop KV computed
with the old weights), then ``resume_generation()``.  That is the sequence
keep + clear_cache performs inside the engine, so on an async engine it meets
vLLM #42043 the same way: the reset force-preempts the frozen requests and marks
each to discard an output frame that is not in flight, and the first
post-resume token is lost (PR #42117, in 0.22.0, discards as many returning
frames as placeholders were in flight: 0 after the keep pause).  Requests
submitted during the pause start after resume and must be unaffected.  The
variant with a weight swap between pause and reset is the weight-sync flow
with ``explicit_reset`` (``repro.scenarios.rlhf_weight_sync``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from repro.scenarios._common import SinglePauseParams, single_pause_plan
from repro.scenarios.runs import check_reset_api, reset_action, run_with_reference
from repro.scenarios.vocab import EngineContext, Plan

MODE = "keep"


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """The requests and the pause; the reset is attached by :func:`run`."""
    p = SinglePauseParams.from_dict(params)
    if p.clear_cache:
        raise ValueError("manual_reset pauses with clear_cache=False: the reset is the client's explicit call")
    return single_pause_plan(sid, MODE, p, vocab_size, seed, "during")


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Play ``sc`` on ``llm``: pause (keep, no clear), reset running requests, resume; the scenario event's data."""
    plan = build(sc["id"], sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    check_reset_api(llm)
    (pause,) = plan.pauses
    plan = Plan(plan.requests, [dataclasses.replace(pause, action=reset_action(llm))])
    return await run_with_reference(llm, plan, ctx.perm, sc["id"], timeout)
