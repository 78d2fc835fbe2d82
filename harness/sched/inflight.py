"""The ``inflight-add-abort`` scheduler-tier cells' oracle beyond the streams (repro/sched/inflight.py plays them).

The streams are judged as every scenario's are (an aborted stream a prefix of its reference, every other one
its solo reference exactly; the precondition — each add and abort ran with the batch queue's frames in flight —
through ``harness.run.scenario_results.with_precondition``).  Two rules more, since the harness owns every step:

* **no token after an abort**: the harness calls ``finish_requests`` itself, so any token ``update_from_output``
  delivers for an aborted request afterwards is one vLLM should have dropped (a finished request is skipped,
  vllm/v1/core/sched/scheduler.py:2373-2381 in 0.34.0); a stream past its abort index is DIVERGED there, though
  still a prefix of its reference, which the stream oracle alone would pass;
* **nothing held at the end**: once every stream has finished and no frame is in flight, vLLM's scheduler must
  hold no request (its ``requests`` table, waiting and running queues) and every KV block must be free again;
  anything left is a request vLLM never finished releasing: STALL (its "never finished" class of finding), the
  ids and block counts in the reason.

A finding either way overrides an OK or an unmet precondition, as a wrong stream does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from harness.core.events import ScenarioEvent
from harness.core.oracle import Outcome
from harness.core.recorded_streams import StreamRecord
from harness.verdicts.results import CellResult


def after_abort(record: StreamRecord) -> str | None:
    """Why ``record`` got a token after its abort, or None (not aborted, or nothing after it)."""
    at = next((p.client_tokens for p in record.pauses if p.mode == "abort" and p.client_tokens is not None), None)
    if at is None or len(record.observed) <= at:
        return None
    extra = list(record.observed[at:])
    return f"{record.rid}: {len(extra)} token(s) {extra} delivered after its abort at index {at}"


def leaks(end: Mapping[str, Any] | None) -> list[str]:
    """What the scheduler still held at the end (``end_state`` of the scenario event), as reasons."""
    if not isinstance(end, Mapping):
        return ["no end_state recorded: the scheduler's final state is unknown"]
    out = []
    if end.get("requests") or end.get("waiting") or end.get("running"):
        out.append(f"vLLM's scheduler still holds requests {list(end.get('requests') or [])} (waiting "
                   f"{end.get('waiting')}, running {end.get('running')}) after every stream finished")
    free, usable = end.get("free_blocks"), end.get("usable_blocks")
    if isinstance(free, int) and isinstance(usable, int) and free != usable:
        out.append(f"{usable - free} of {usable} KV-cache blocks never freed")
    return out


def faults(ev: ScenarioEvent) -> list[tuple[Outcome, str]]:
    """The scenario's faults beyond the streams: a token after an abort (DIVERGED), something held at the end
    (STALL)."""
    if ev.status != "ran":
        return []
    found = [(Outcome.DIVERGED, why) for why in (after_abort(r) for r in ev.records) if why]
    return found + [(Outcome.STALL, why) for why in leaks(ev.raw.get("end_state"))]


def with_end_checks(res: CellResult, ev: ScenarioEvent) -> CellResult:
    """``res`` (the streams' verdict and precondition) with :func:`faults` applied: the worst fault becomes the
    outcome unless the streams' own finding is worse; every fault is named in the summary."""
    found = faults(ev)
    if not found:
        end = ev.raw.get("end_state") or {}
        blocks = f" ({end.get('free_blocks')}/{end.get('usable_blocks')} KV blocks free)" \
            if end.get("usable_blocks") is not None else ""
        return replace(res, summary=f"{res.summary}; nothing held at the end{blocks}")
    text = "; ".join(why for _, why in found)
    worst = max((o for o, _ in found), key=lambda o: o.rank)
    if res.outcome.is_finding and res.outcome.rank >= worst.rank:
        return replace(res, summary=f"{res.summary}; {text}")
    summary = f"{worst.value}: {text}"
    return replace(res, outcome=worst, summary=summary, reason=text, label=worst.value)
