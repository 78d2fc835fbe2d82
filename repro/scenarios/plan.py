"""An explicit pause schedule given as JSON: used by property-based tests and for replaying a failure.

params = {
  "requests": [{"rid": "r0", "prompt": [..], "max_tokens": 16, "submit": "start" | ["during", k] | ["after", k]}],
  "pauses": [{"mode": "keep", "clear_cache": true, "after_tokens": 4}]
}
"""

from __future__ import annotations

from typing import Any

from repro.scenarios.base import PAUSE_MODES, PauseSpec, Plan, RequestSpec


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
