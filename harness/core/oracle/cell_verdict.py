"""A cell judged: the worst of its requests' verdicts, with counts and the label its summary starts with."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from harness.core.oracle.ambiguity import NONDETERMINISM_HINT
from harness.core.oracle.outcome import SHIFTS, Outcome
from harness.core.oracle.requests import RequestVerdict, classify_request
from harness.core.oracle.sampled import group_faults, is_sampled, reference_model_error
from harness.core.oracle.streams import StreamVerdict
from harness.core.recorded_streams import StreamRecord


@dataclass(frozen=True)
class CellVerdict:
    outcome: Outcome
    summary: str  # e.g. "LOSS(1) in 8/10 requests (8/8 running at pause)"
    counts: dict[str, int] = field(default_factory=dict)
    requests: tuple[RequestVerdict, ...] = ()
    reason: str | None = None
    label: str = ""  # the summary's head: "LOSS(1)", "LOSS(1,2)", "OK"; "" = the outcome

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.outcome.value)


def _doubt(r: RequestVerdict) -> RequestVerdict:
    """A DIVERGED request of an engine found nondeterministic: AMBIGUOUS (numerics, not the scheduler, may
    explain it); an exact shift stays what it is."""
    if r.outcome is not Outcome.DIVERGED:
        return r
    v = StreamVerdict(Outcome.AMBIGUOUS, r.verdict.at, detail=f"{r.verdict.label}: {NONDETERMINISM_HINT}")
    return replace(r, verdict=v)


def cell_verdict(records: Sequence[StreamRecord]) -> CellVerdict:
    """Worst request outcome, with counts, for a cell whose scenario ran."""
    reqs = tuple(classify_request(r) for r in records)
    if not reqs:
        return CellVerdict(Outcome.ERROR, "no requests recorded", reason="scenario produced no requests")
    model = _model_error(records)
    if model is not None:
        return CellVerdict(Outcome.ERROR, "model check failed", requests=reqs, reason=model)
    splits = [r for r in reqs if r.reference_split is not None]
    if splits:
        reqs = tuple(_doubt(r) for r in reqs)
    reqs = _group_broken(reqs, group_faults(records))
    worst = max(reqs, key=lambda r: r.outcome.rank)
    counts = Counter(r.verdict.short for r in reqs)
    refused = _refused(records)
    if worst.outcome is Outcome.OK:
        return CellVerdict(Outcome.OK, f"OK {len(reqs)}/{len(reqs)}{refused}", dict(sorted(counts.items())), reqs)
    label, summary = _fault_summary(reqs, worst.outcome)
    summary += refused
    reason = None
    if worst.outcome is Outcome.ERROR:
        bad = [r for r in reqs if r.outcome is Outcome.ERROR]
        reason = f"{len(bad)} request(s) failed; first: {worst.rid}: {worst.verdict.detail}"
    elif worst.outcome is Outcome.AMBIGUOUS:
        reason = f"{worst.rid}: {worst.verdict.detail}"
    if splits:
        reason = (f"{reason}; " if reason else "") + (
            f"the no-pause references of {len(splits)}/{len(reqs)} requests differ between batch compositions "
            f"(first at index {min(r.reference_split or 0 for r in splits)}): {NONDETERMINISM_HINT}")
    return CellVerdict(worst.outcome, summary, dict(sorted(counts.items())), reqs, reason, label)


def _model_error(records: Sequence[StreamRecord]) -> str | None:
    """Why the engine does not run the model the oracle assumes, or None."""
    for r in records:
        if not r.reference_matches_model and r.stale_kv is not None:
            return ("the engine's stream for the stale-kv scenario's warm request under weights A is not the "
                    "context-cell model's: stale KV would not be visible")
        if not r.reference_matches_model:
            return (f"the engine's no-pause stream for {r.rid} does not follow the bigram cycle; "
                    "token loss would not be visible")
        if is_sampled(r) and (why := reference_model_error(r)) is not None:
            return why
    return None


def _group_broken(reqs: tuple[RequestVerdict, ...], faults: dict[str, str]) -> tuple[RequestVerdict, ...]:
    """Children of a broken group (harness.core.oracle.sampled.group_faults) are GROUP-BROKEN, the more specific
    reading (a duplicated child also diverges from its own reference), their own stream's label kept in the detail;
    a request that failed (ERROR) stays so."""
    out = []
    for r in reqs:
        why = faults.get(r.rid)
        if why is not None and r.outcome is not Outcome.ERROR:
            said = f": {r.verdict.detail}" if r.verdict.detail else ""
            own = "" if r.outcome is Outcome.OK else f" (this child's stream: {r.verdict.label}{said})"
            r = replace(r, verdict=StreamVerdict(Outcome.GROUP_BROKEN, r.verdict.at, detail=why + own))
        out.append(r)
    return tuple(out)


def _refused(records: Sequence[StreamRecord]) -> str:
    """"; 2 refused while paused, retried after resume": vLLM 0.33's abort and wait pauses refuse new requests
    (``RetryableRequestError``) where earlier releases queued them; the driver retries them, as vLLM asks."""
    n = sum(bool(r.raw.get("rejected_while_paused")) for r in records)
    return f"; {n} refused while paused, retried after resume" if n else ""


def _fault_summary(reqs: tuple[RequestVerdict, ...], outcome: Outcome) -> tuple[str, str]:
    """(label, summary) of a cell whose worst request outcome is ``outcome``: "LOSS(1)", "LOSS(1) in 8/10 requests
    (8/8 running at pause)"; AMBIGUOUS requests beside a finding are counted after it."""
    bad = [r for r in reqs if r.outcome is outcome]
    running = [r for r in reqs if r.running_at_pause]
    label = _cell_label(outcome, bad)
    summary = f"{label} in {len(bad)}/{len(reqs)} requests"
    if running:
        summary += f" ({len([r for r in bad if r.running_at_pause])}/{len(running)} running at pause)"
    ambiguous = sum(r.outcome is Outcome.AMBIGUOUS for r in reqs)
    if ambiguous and outcome is not Outcome.AMBIGUOUS:
        summary += f"; {ambiguous} AMBIGUOUS"
    return label, summary


def _cell_label(worst: Outcome, bad: list[RequestVerdict]) -> str:
    """The head of a faulty cell's summary, so the count always matches the label: ``LOSS(1)`` in 8/10,
    ``LOSS(1,2)`` when single losses differ in size; with several events in a request, each distinct shape
    (``LOSS(1; 1)``, or ``LOSS(1) | LOSS(1; 1)`` when some requests saw one pause and some two)."""
    if worst in SHIFTS and any(len(r.verdict.events) > 1 for r in bad):
        return " | ".join(sorted({r.verdict.short for r in bad}, key=lambda s: (s.count(";"), s)))
    ks = sorted({r.verdict.k for r in bad if r.verdict.k is not None})
    return worst.value + (f"({','.join(map(str, ks))})" if ks else "")
