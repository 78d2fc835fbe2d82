"""An explicit pause schedule given as JSON: used by property-based tests and for replaying a failure.

params = {
  "requests": [{"rid": "r0", "prompt": [..], "max_tokens": 16, "submit": "start" | ["during", k] | ["after", k]}],
  "pauses": [{"mode": "keep", "clear_cache": true, "after_tokens": 4, "reset": false}]
}

A pause with ``"reset": true`` is the manual reset RL frameworks write (``repro.scenarios.manual_reset``): while
paused, the client calls ``reset_prefix_cache(reset_running_requests=True)`` itself; :func:`run` attaches it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from repro.scenarios.runs import check_reset_api, reset_action, run_with_reference
from repro.scenarios.vocab import PAUSE_MODES, EngineContext, PauseSpec, Plan, RequestSpec


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    pauses = []
    for p in params.get("pauses", []):
        if p["mode"] not in PAUSE_MODES:
            raise ValueError(f"unknown pause mode {p['mode']!r}; valid: {', '.join(PAUSE_MODES)}")
        pauses.append(PauseSpec(p["mode"], bool(p["clear_cache"]), int(p["after_tokens"])))
    requests = []
    for r in params["requests"]:
        submit = r.get("submit", "start")
        if submit != "start":
            kind, k = submit
            if kind not in ("during", "after") or not 0 <= int(k) < len(pauses):
                raise ValueError(f"request {r['rid']}: bad submit {submit!r}")
            submit = (kind, int(k))
        prompt = [int(t) for t in r["prompt"]]
        if not prompt or any(not 0 <= t < vocab_size for t in prompt):
            raise ValueError(f"request {r['rid']}: prompt ids must be in [0, {vocab_size})")
        requests.append(RequestSpec(f"{sid}-{r['rid']}", prompt, int(r["max_tokens"]), submit))
    return Plan(requests, pauses)


def resets(params: dict[str, Any]) -> list[bool]:
    """Per pause, whether the client resets the prefix cache (running requests too) while paused."""
    return [bool(p.get("reset", False)) for p in params.get("pauses", [])]


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Play the plan, with the client's reset attached to each pause that asks for it."""
    params = sc.get("params", {})
    plan = build(sc["id"], params, ctx.vocab, int(sc.get("seed", 0)))
    wanted = resets(params)
    if any(wanted):
        check_reset_api(llm)
        plan = Plan(plan.requests, [dataclasses.replace(p, action=reset_action(llm)) if r else p
                                    for p, r in zip(plan.pauses, wanted, strict=True)])
    return await run_with_reference(llm, plan, ctx.perm, sc["id"], timeout)
