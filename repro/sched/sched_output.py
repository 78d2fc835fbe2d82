"""What a ``SchedulerOutput`` says about the requests a frame (re)starts, across the releases it changed shape in:
new requests (``scheduled_new_reqs``) and requests resumed after a preemption (``scheduled_cached_reqs``:
``resumed_req_ids`` on later releases, a ``resumed_from_preemption`` flag per cached request on older ones).

Pure Python (reads attributes; no vLLM import).
"""

from __future__ import annotations

from typing import Any


def resumed_ids(so: Any) -> set[str]:
    """The requests a scheduler output resumes after a preemption."""
    cached = getattr(so, "scheduled_cached_reqs", None)
    resumed = set(getattr(cached, "resumed_req_ids", None) or ())
    if cached is not None and hasattr(cached, "resumed_from_preemption"):  # older releases: flags per id
        resumed |= {r for r, flag in zip(cached.req_ids, cached.resumed_from_preemption, strict=False) if flag}
    return {r for r in resumed if r is not None}


def restarted_ids(so: Any) -> set[str]:
    """Requests a frame sends to the worker as new or resumed (their state starts afresh there).

    Read from the scheduler output; where it says nothing about either, a request that schedules more tokens than
    one decode step (a prefill) counts as restarted.
    """
    if not hasattr(so, "scheduled_new_reqs") and not hasattr(so, "scheduled_cached_reqs"):
        spec = getattr(so, "scheduled_spec_decode_tokens", None) or {}
        return {r for r, n in so.num_scheduled_tokens.items() if n > 1 + len(spec.get(r, ()))}
    new = {getattr(r, "req_id", None) for r in getattr(so, "scheduled_new_reqs", None) or ()}
    return {r for r in new if r is not None} | resumed_ids(so)
