"""What a stalled scheduler looked like: the state a STALL's reason quotes.

On the scheduler tier the harness owns every step, so a request vLLM could run that gets no token for many
steps while nothing else progresses is vLLM's doing (outcome STALL, a finding), not a hung process (TIMEOUT).
vllm#42043's drained reset on 0.21.0 is one: the reset drops the request's last token and it never finishes.
The reason names the step and the scheduler's own bookkeeping of every unfinished request, so a reader sees
why it never ran again (e.g. ``num_output_placeholders`` left at 1 with nothing in flight).

Pure: reads attributes of whatever scheduler object it is given (a fake one in the unit tests).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Request attributes quoted per request, in this order (absent ones are left out: older releases lack some).
_FIELDS = ("num_computed_tokens", "num_tokens", "num_prompt_tokens", "num_output_placeholders")
_SHORT = {"num_computed_tokens": "computed", "num_tokens": "tokens", "num_prompt_tokens": "prompt",
          "num_output_placeholders": "placeholders"}


def _ids(queue: Any) -> list[str]:
    """The request ids of a scheduler queue (a list, a deque or vLLM's RequestQueue); [] when unreadable."""
    try:
        items: Iterable[Any] = list(queue or ())
    except TypeError:
        return []
    return [str(getattr(r, "request_id", r)) for r in items]


def scheduler_state(sched: Any, step: int, in_flight: int) -> dict[str, Any]:
    """The scheduler's state at ``step``: waiting and running ids, frames in flight, and per unfinished request
    its status and token counts (``num_computed_tokens``, ``num_output_placeholders``, ...)."""
    requests: dict[str, dict[str, Any]] = {}
    for rid, req in dict(getattr(sched, "requests", None) or {}).items():
        row: dict[str, Any] = {"status": str(getattr(getattr(req, "status", None), "name", None)
                                             or getattr(req, "status", "?"))}
        for name in _FIELDS:
            value = getattr(req, name, None)
            if isinstance(value, int):
                row[name] = value
        requests[str(rid)] = row
    return {"step": step, "in_flight": in_flight, "waiting": _ids(getattr(sched, "waiting", None)),
            "running": _ids(getattr(sched, "running", None)), "requests": requests}


def state_text(state: dict[str, Any]) -> str:
    """``step 70, 0 frames in flight; waiting [], running [r0]; r0 RUNNING computed 6 tokens 7 prompt 3
    placeholders 1``."""
    parts = [f"step {state['step']}, {state['in_flight']} frame(s) in flight",
             f"waiting [{', '.join(state['waiting'])}], running [{', '.join(state['running'])}]"]
    for rid, row in state["requests"].items():
        counts = " ".join(f"{_SHORT[k]} {row[k]}" for k in _FIELDS if k in row)
        parts.append(f"{rid} {row['status']} {counts}".rstrip())
    return "; ".join(parts)
