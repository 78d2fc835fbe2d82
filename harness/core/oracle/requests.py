"""One request judged: its stream against its reference (or both references), where a pause fault would strike,
and what the verdict records (:class:`RequestVerdict`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.core.oracle.ambiguity import NONDETERMINISM_HINT, reference_split, shift_ambiguity, stale_ambiguity
from harness.core.oracle.outcome import Outcome
from harness.core.oracle.sampled import (
    is_sampled,
    logprob_only_verdict,
    logprob_verdict,
    shift_start_by_logprobs,
    with_logprob_evidence,
)
from harness.core.oracle.stale_kv import stale_kv_verdict
from harness.core.oracle.streams import StreamVerdict, classify_stream
from harness.core.recorded_streams import StreamRecord


@dataclass(frozen=True)
class RequestVerdict:
    rid: str
    verdict: StreamVerdict
    running_at_pause: bool  # frozen or in flight when the first pause happened
    pause_index: int | None  # tokens received before resume (keep) / before the pause ended
    first_post_resume: dict[str, int | None] | None  # {"index", "expected", "observed"}
    reference_split: int | None = None  # where the two no-pause references differ (nondeterminism)

    @property
    def outcome(self) -> Outcome:
        return self.verdict.outcome

    def to_dict(self) -> dict[str, Any]:
        out = {
            "rid": self.rid,
            "outcome": self.outcome.value,
            "label": self.verdict.label,
            "at": self.verdict.at,
            "k": self.verdict.k,
            "detail": self.verdict.detail,
            "events": [e.to_dict() for e in self.verdict.events],
            "running_at_pause": self.running_at_pause,
            "pause_index": self.pause_index,
            "first_post_resume": self.first_post_resume,
        }
        if self.reference_split is not None:
            out["reference_split"] = self.reference_split
        return out


def critical_points(record: StreamRecord) -> list[int]:
    """Where a pause fault would strike this request: its index at each keep pause that froze it, or 0 when
    it was submitted during or after a pause (its first token is post-resume)."""
    frozen = [p.client_tokens for p in record.pauses if p.frozen and p.client_tokens is not None]
    # A reset with no pause (reset-inflight) preempts the request where it stands: a fault would strike there.
    frozen += [i.client_tokens for i in record.interrupts if i.op == "reset" and i.client_tokens is not None]
    if frozen:
        return sorted(frozen)
    return [] if record.submitted_at_start else [0]


def _aborted(record: StreamRecord) -> bool:
    """Aborted by a pause in abort mode or by an in-flight abort naming it: the stream may end early."""
    return any(p.mode == "abort" for p in record.pauses) or any(
        i.op == "abort" and i.target for i in record.interrupts)


def _stream_verdict(record: StreamRecord, reference: Sequence[int], points: Sequence[int]) -> StreamVerdict:
    obs = record.observed
    aborted = _aborted(record)
    v = classify_stream(reference, obs, expected_len=record.max_tokens, prefix_ok=aborted)
    short = len(obs) < record.max_tokens
    if v.outcome is Outcome.OK and aborted and short and record.finish_reason != "abort":
        return StreamVerdict(Outcome.TRUNCATED, len(obs),
                             detail=f"ended with finish_reason {record.finish_reason!r}, not 'abort'")
    why = shift_ambiguity(reference, obs, v, points) or stale_ambiguity(record, v)
    return StreamVerdict(Outcome.AMBIGUOUS, v.at, detail=why) if why else _stale_note(record, v)


def _stale_note(record: StreamRecord, v: StreamVerdict) -> StreamVerdict:
    """``v``, its detail saying so when it diverges at a weight swap with the old weights' token."""
    if record.stale is None or v.outcome is not Outcome.DIVERGED:
        return v
    at, token = record.stale
    if v.at != at or at >= len(record.observed) or record.observed[at] != token:
        return v
    return replace(v, detail=f"{v.detail}: the weights before the swap give {token} there (a stale frame)")


def _judge(record: StreamRecord, points: Sequence[int], split: int | None) -> StreamVerdict:
    """The stream's verdict against its reference, or against both when the engine's two references differ."""
    first = _stream_verdict(record, record.reference, points)
    if split is None or record.reference_repeat is None:
        return first
    second = _stream_verdict(record, record.reference_repeat, points)
    ok = next((v for v in (first, second) if v.outcome is Outcome.OK), None)
    if ok is not None:
        return ok  # the stream is one of the engine's own no-pause runs
    if first.label == second.label and first.outcome is not Outcome.DIVERGED:
        return first
    return StreamVerdict(Outcome.AMBIGUOUS, first.at, detail=(
        f"{first.label} against the reference, {second.label} against the one batched as the paused run "
        f"(they differ from index {split}): {NONDETERMINISM_HINT}"))


def _judge_sampled(record: StreamRecord, points: Sequence[int], split: int | None) -> StreamVerdict:
    """A sampled request (harness.core.oracle.sampled): against its seeded no-pause reference where the engine's two
    references agree, then its logprobs against the model's table; by logprobs and length alone where they differ."""
    if split is not None:
        return logprob_only_verdict(record, split, _aborted(record))
    v = _judge(record, points, None)
    lp = logprob_verdict(record)
    if v.outcome is not Outcome.OK and lp is not None and v.at is not None and (lp.at or 0) < v.at:
        moved = shift_start_by_logprobs(record, v, lp.at or 0)
        if moved is not None:
            return with_logprob_evidence(record, moved)
        # A logprob fault before the stream's own (a token its grammar masks, then the request ended: vLLM
        # terminates a request whose grammar rejects a token) is the first fault: named first, the stream's after.
        return StreamVerdict(lp.outcome, lp.at, detail=f"{lp.detail}; then {v.label}: {v.detail}")
    if v.outcome is not Outcome.OK:
        return with_logprob_evidence(record, v)
    return lp or v


def classify_request(record: StreamRecord) -> RequestVerdict:
    """Judge one request record written by ``repro.scenarios.cell_run``."""
    ref, obs = record.reference, record.observed
    # In-flight operations (a reset or an abort with no pause) count as the pause does: the request ran
    # through one (and, aborted by one, may end early: _aborted).
    running = bool(record.pauses or record.interrupts)
    pause_index = (record.pauses or record.interrupts)[0].client_tokens if running else None
    points = critical_points(record)
    fpr: dict[str, int | None] | None = None
    if points:
        fpr = {"index": points[0], "expected": _at(ref, points[0]), "observed": _at(obs, points[0])}
    split = reference_split(record)
    judge = _judge_sampled if is_sampled(record) else _judge
    v = StreamVerdict(Outcome.ERROR, detail=record.error) if record.error else judge(record, points, split)
    v = stale_kv_verdict(record, v)
    return RequestVerdict(record.rid, v, running, pause_index, fpr, split)


def _at(seq: Sequence[int], i: int) -> int | None:
    return seq[i] if 0 <= i < len(seq) else None
