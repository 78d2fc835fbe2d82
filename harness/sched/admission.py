"""The ``max-seqs-admission`` scheduler-tier cells' oracle beyond the streams (repro/sched/admission.py plays
them; vllm#45257, open, fix proposed in open PR #45366).

The streams are judged as every scenario's are (each request's one token its solo reference), the precondition
(every add before the first step, more requests than ``max_num_seqs``, a step's budget and the KV cache hold
``max_num_seqs`` whole requests) through ``harness.run.scenario_results.with_precondition``.  One rule more:
``max_num_seqs`` is "the maximum number of sequences to be processed in a single iteration"
(vllm/config/scheduler.py), so while a request waits with room in the budget and the cache, every frame must
schedule ``max_num_seqs`` requests.  Since every request was added before the first frame (the precondition), a
request waits at frame ``f`` exactly when its first frame is later than ``f``, so the records (each stream's
frames) and the event's frame count are all the rule needs.  A frame that scheduled fewer while one waited is an
admission stall: STALL (the scheduler made no progress on a request it could run, for that step), the frames and
counts in the reason.  It overrides an OK or an unmet precondition, as a wrong stream does; where the precondition
is unmet the rule is not applied (the counts would not prove anything).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from harness.core.events import ScenarioEvent
from harness.core.oracle import Outcome
from harness.verdicts.results import CellResult


def underfilled(frames: int, first_frames: Mapping[str, int | None], scheduled: Mapping[int, int],
                cap: int) -> list[tuple[int, int, int]]:
    """``(frame, scheduled, waiting)`` for each frame of ``range(frames)`` that scheduled fewer than ``cap``
    requests while a request whose first frame came later (or never came) waited."""
    out = []
    for f in range(frames):
        waiting = sum(1 for first in first_frames.values() if first is None or first > f)
        n = scheduled.get(f, 0)
        if waiting and n < cap:
            out.append((f, n, waiting))
    return out


def admission_fault(ev: ScenarioEvent) -> str | None:
    """Why a frame of ``ev`` scheduled fewer than ``max_num_seqs`` requests while one waited, or None (also when
    the scenario did not run or its precondition is unmet)."""
    pre = ev.precondition
    if ev.status != "ran" or pre is None or not pre.met:
        return None
    setup: Mapping[str, Any] = ev.raw.get("setup") or {}
    cap, frames = int(setup.get("max_num_seqs", 0)), int(ev.raw.get("frames") or 0)
    first: dict[str, int | None] = {}
    scheduled: dict[int, int] = {}
    for rec in ev.raw.get("records") or ():
        idx = [int(fr["frame"]) for fr in rec.get("frames") or ()]
        first[str(rec["rid"])] = min(idx, default=None)
        for f in set(idx):
            scheduled[f] = scheduled.get(f, 0) + 1
    bad = underfilled(frames, first, scheduled, cap)
    if not bad:
        return None
    shown = ", ".join(f"frame {f}: {n} scheduled, {w} waiting" for f, n, w in bad[:4])
    more = f" (+{len(bad) - 4} more)" if len(bad) > 4 else ""
    return (f"{len(bad)} of {frames} frame(s) scheduled fewer than max_num_seqs={cap} requests while requests "
            f"waited with room in the step budget and the KV cache ({shown}{more}): requests whose last token "
            f"was in flight held the slots")


def with_admission_check(res: CellResult, ev: ScenarioEvent) -> CellResult:
    """``res`` with the admission rule applied: an underfilled frame is STALL unless the streams' own finding is
    worse; a full run says so in the summary."""
    why = admission_fault(ev)
    if why is None:
        if res.outcome is Outcome.OK:
            return replace(res, summary=f"{res.summary}; every frame full while requests waited "
                                        f"({ev.raw.get('frames')} frames)")
        return res
    if res.outcome.is_finding and res.outcome.rank >= Outcome.STALL.rank:
        return replace(res, summary=f"{res.summary}; {why}")
    return replace(res, outcome=Outcome.STALL, summary=f"STALL: {why}", reason=why, label=Outcome.STALL.value)
