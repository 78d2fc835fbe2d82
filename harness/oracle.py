"""The oracle: pure functions that judge observed token streams against references.

Request outcomes, from best to worst: OK, TRUNCATED, DUPLICATE(k at i),
LOSS(k at i), DIVERGED(at i), ERROR.  Cell outcomes add UNSUPPORTED and
TIMEOUT (and ERROR for infrastructure failures); a cell that ran takes the
worst outcome of its requests.

A stream is decomposed into **fault events** (:class:`FaultEvent`): between
two events the stream follows the reference shifted by the offset the events
so far add up to (a loss of k moves it k tokens on, a duplicate of k moves it
k back).  One event is the single-fault verdict of old (``LOSS(1 at 6)``);
several, e.g. one #42043 loss per keep + clear_cache pause, read
``LOSS(1 at 6; 1 at 18)`` or, mixed, ``LOSS(1 at 6); DUPLICATE(2 at 18)``.
What no sequence of shifts explains is DIVERGED at the first token that
breaks it (after the events that do explain the stream up to there).

The decomposition relies on references without repeated tokens (what a
bigram-cycle model produces): then each observed token has one place in the
reference, the events are forced and the decomposition is unique.  Two rules
decide what a shift is believed on:

* a shift is confirmed by the tokens that follow it: a run of ONE token
  between an event and an event of the opposite kind, or between an event
  and the point where the stream stops being explainable, is as much one
  wrong token (DIVERGED) as two shifts, and is read as DIVERGED at the
  event (a single misplaced token is never "LOSS then DUPLICATE");
  back-to-back events of one kind (two losses one token apart) are shifts;
* among explanations the fewest events win, then, event by event, the
  smallest shift, loss before duplicate (what single-fault verdicts always
  did).  With merely no *adjacent* repeats, a periodic reference can make a
  loss of k >= 2 look like a shorter truncation; a loss of one token is still
  found.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class Outcome(enum.Enum):
    OK = "OK"
    TRUNCATED = "TRUNCATED"
    DUPLICATE = "DUPLICATE"
    LOSS = "LOSS"
    DIVERGED = "DIVERGED"
    # vLLM's own code raised while a scenario drove it (e.g. the scheduler's ``assert
    # request.num_output_placeholders >= 0``, PR #46066): a finding about vLLM, unlike ERROR (the harness,
    # the environment or the machine failed).
    CRASH = "CRASH"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    UNSUPPORTED = "UNSUPPORTED"
    BUILD_FAILED = "BUILD-FAILED"  # the vLLM environment could not be built
    FLAKY = "FLAKY"  # --repeat N: the runs of one cell disagree (fractions in CellResult.repeats)

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def is_infra(self) -> bool:
        """No token streams to judge: never GOOD or BAD in a bisect."""
        return self in (Outcome.UNSUPPORTED, Outcome.BUILD_FAILED, Outcome.ERROR, Outcome.TIMEOUT)

    @property
    def is_token_fault(self) -> bool:
        """A wrong token stream (what the harness hunts), as opposed to infrastructure."""
        return self in (Outcome.LOSS, Outcome.DUPLICATE, Outcome.DIVERGED, Outcome.TRUNCATED)

    @property
    def is_finding(self) -> bool:
        """Something wrong with vLLM: a token fault, or vLLM's own code raising (CRASH); BAD in a bisect."""
        return self.is_token_fault or self is Outcome.CRASH

    @property
    def is_retryable(self) -> bool:
        """An infrastructure failure worth another attempt (``--retry-infra``): the engine crashed or hung for a
        reason outside vLLM.  A finding never is; neither is UNSUPPORTED (it would say the same again) nor
        BUILD-FAILED (the env build is cached and deterministic)."""
        return self in (Outcome.ERROR, Outcome.TIMEOUT)


_RANK = {
    Outcome.OK: 0,
    Outcome.TRUNCATED: 1,
    Outcome.DUPLICATE: 2,
    Outcome.LOSS: 3,
    Outcome.DIVERGED: 4,
    Outcome.CRASH: 5,
    Outcome.FLAKY: 6,
    Outcome.UNSUPPORTED: 7,
    Outcome.BUILD_FAILED: 8,
    Outcome.ERROR: 9,
    Outcome.TIMEOUT: 10,
}
SHIFTS = (Outcome.LOSS, Outcome.DUPLICATE)  # the kinds of fault event, in the order they are tried


@dataclass(frozen=True)
class FaultEvent:
    """One shift of an observed stream against its reference: ``k`` tokens lost (LOSS: the stream resumes k
    tokens further on) or repeated (DUPLICATE: the k tokens before are emitted again) at observed index ``at``."""

    kind: Outcome  # Outcome.LOSS or Outcome.DUPLICATE
    k: int
    at: int

    def __post_init__(self) -> None:
        if self.kind not in SHIFTS or self.k < 1 or self.at < 0:
            raise ValueError(f"not a fault event: {self.kind.value}({self.k} at {self.at})")

    @property
    def shift(self) -> int:
        """How far on in the reference the stream is after this event (negative: back)."""
        return self.k if self.kind is Outcome.LOSS else -self.k

    @property
    def label(self) -> str:
        return f"{self.kind.value}({self.k} at {self.at})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "k": self.k, "at": self.at}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FaultEvent:
        return cls(Outcome(d["kind"]), int(d["k"]), int(d["at"]))


def events_label(events: Sequence[FaultEvent], with_index: bool = True) -> str:
    """``LOSS(1 at 6; 1 at 18)`` when every event is of one kind, else ``LOSS(1 at 6); DUPLICATE(2 at 18)``;
    without the index: ``LOSS(1; 1)``, ``LOSS(1); DUPLICATE(2)``."""
    def one(e: FaultEvent) -> str:
        return f"{e.k} at {e.at}" if with_index else str(e.k)

    if len({e.kind for e in events}) == 1:
        return f"{events[0].kind.value}({'; '.join(one(e) for e in events)})"
    return "; ".join(f"{e.kind.value}({one(e)})" for e in events)


@dataclass(frozen=True)
class StreamVerdict:
    outcome: Outcome
    at: int | None = None  # index in the observed stream where it deviates (DIVERGED: where no shift explains it)
    k: int | None = None  # tokens lost or duplicated (one fault event; None when there are several)
    detail: str = ""
    events: tuple[FaultEvent, ...] = ()  # the shifts that explain the stream (up to ``at`` when DIVERGED)

    @property
    def label(self) -> str:
        o = self.outcome.value
        if self.outcome in SHIFTS:
            return events_label(self.events) if self.events else f"{o}({self.k} at {self.at})"
        if self.outcome is Outcome.DIVERGED or (self.outcome is Outcome.TRUNCATED and self.at is not None):
            head = f"{events_label(self.events)}; " if self.events else ""
            return f"{head}{o}(at {self.at})"
        return o

    @property
    def short(self) -> str:
        """The label without indices (what a cell counts): ``LOSS(1)``, ``LOSS(1; 1)``, ``LOSS(1); DIVERGED``."""
        if self.outcome in SHIFTS:
            return events_label(self.events, with_index=False) if self.events else f"{self.outcome.value}({self.k})"
        if self.events:
            return f"{events_label(self.events, with_index=False)}; {self.outcome.value}"
        return self.outcome.value


def classify_stream(
    reference: Sequence[int],
    observed: Sequence[int],
    expected_len: int | None = None,
    prefix_ok: bool = False,
    max_shift: int = 8,
) -> StreamVerdict:
    """Judge ``observed`` against ``reference`` (which may be longer than needed).

    ``expected_len``: tokens a complete stream has (max_tokens); a shorter
    stream that matches is TRUNCATED unless ``prefix_ok`` (aborted requests).
    ``max_shift``: the most tokens one event may lose or repeat.
    """
    n = len(observed)
    i = next((j for j in range(min(n, len(reference))) if observed[j] != reference[j]), None)
    if i is None:
        if n > len(reference):
            return StreamVerdict(Outcome.DIVERGED, len(reference), detail="longer than the reference")
        if expected_len is not None and n < expected_len and not prefix_ok:
            return StreamVerdict(Outcome.TRUNCATED, n, detail=f"{n} of {expected_len} tokens")
        return StreamVerdict(Outcome.OK)
    fit = _Aligner(reference, observed, max_shift).solve(i, 0, None)
    assert fit is not None  # unconstrained: at worst DIVERGED at i
    return _verdict(reference, observed, fit)


@dataclass(frozen=True)
class _Fit:
    events: tuple[FaultEvent, ...]
    diverged_at: int | None = None  # None: the events explain the whole stream

    def better_than(self, other: _Fit | None) -> bool:
        # Whole explanations first, then the one explaining the longer prefix, then the fewest events;
        # ties keep the earlier candidate (smallest shift, loss before duplicate).
        if other is None:
            return True
        return self._key() < other._key()

    def _key(self) -> tuple[int, int, int]:
        if self.diverged_at is None:
            return (0, 0, len(self.events))
        return (1, -self.diverged_at, len(self.events))


class _Aligner:
    """The search for the best :class:`_Fit` of an observed stream (see the module docstring for the rules)."""

    def __init__(self, reference: Sequence[int], observed: Sequence[int], max_shift: int) -> None:
        self.ref, self.obs, self.max_shift = list(reference), list(observed), max_shift
        self.memo: dict[tuple[int, int, Outcome | None], _Fit | None] = {}

    def run_end(self, i: int, off: int) -> int:
        """The first index from ``i`` where the stream stops following the reference shifted by ``off``
        (``len(observed)``, or where the reference runs out: the rest is past what it can check)."""
        n, m = len(self.obs), len(self.ref)
        while i < n and i + off < m and self.obs[i] == self.ref[i + off]:
            i += 1
        return n if i + off >= m else i

    def solve(self, i: int, off: int, need: Outcome | None) -> _Fit | None:
        """Best fit of ``observed[i:]`` with an event at ``i`` (a mismatch at offset ``off``).  ``need``: the
        previous event's kind when only one token followed it: then the event here must be of that kind."""
        key = (i, off, need)
        if key not in self.memo:
            self.memo[key] = self._solve(i, off, need)
        return self.memo[key]

    def _solve(self, i: int, off: int, need: Outcome | None) -> _Fit | None:
        best: _Fit | None = None
        for d in range(1, self.max_shift + 1):
            for kind in SHIFTS:
                if need is not None and kind is not need:
                    continue
                fit = self._after(FaultEvent(kind, d, i), off)
                if fit is not None and fit.better_than(best):
                    best = fit
        if best is None and need is None:
            return _Fit((), diverged_at=i)
        return best

    def _after(self, ev: FaultEvent, off: int) -> _Fit | None:
        """The fit that starts with ``ev``, or None when ``ev`` cannot start one."""
        new, i = off + ev.shift, ev.at
        if not 0 <= i + new < len(self.ref) or self.obs[i] != self.ref[i + new]:
            return None
        end = self.run_end(i, new)
        if end == len(self.obs):
            return _Fit((ev,))
        # One token of run confirms only an event of the same kind after it (see the module docstring).
        rest = self.solve(end, new, ev.kind if end - i == 1 else None)
        if rest is None:
            return None
        return _Fit((ev, *rest.events), rest.diverged_at)


def _verdict(reference: Sequence[int], observed: Sequence[int], fit: _Fit) -> StreamVerdict:
    events = fit.events
    if fit.diverged_at is not None:
        x = fit.diverged_at
        return StreamVerdict(Outcome.DIVERGED, x, detail=_expected_got(reference, observed, x, _offset(events)),
                             events=events)
    first = events[0]
    if len(events) == 1:
        return StreamVerdict(first.kind, first.at, first.k, _expected_got(reference, observed, first.at, 0), events)
    detail = "; ".join(f"at {e.at}: {_expected_got(reference, observed, e.at, _offset(events[:n]))}"
                       for n, e in enumerate(events))
    worst = max((e.kind for e in events), key=lambda o: o.rank)
    return StreamVerdict(worst, first.at, None, detail, events)


def _offset(events: Sequence[FaultEvent]) -> int:
    return sum(e.shift for e in events)


def _expected_got(reference: Sequence[int], observed: Sequence[int], i: int, off: int) -> str:
    j = i + off
    expected = reference[j] if 0 <= j < len(reference) else "a token past the reference"
    return f"expected {expected}, got {observed[i]}"


@dataclass(frozen=True)
class RequestVerdict:
    rid: str
    verdict: StreamVerdict
    running_at_pause: bool  # frozen or in flight when the first pause happened
    pause_index: int | None  # tokens received before resume (keep) / before the pause ended
    first_post_resume: dict[str, int | None] | None  # {"index", "expected", "observed"}

    @property
    def outcome(self) -> Outcome:
        return self.verdict.outcome

    def to_dict(self) -> dict[str, Any]:
        return {
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


def classify_request(record: dict[str, Any]) -> RequestVerdict:
    """Judge one request record written by ``repro.cell``."""
    rid = record["rid"]
    ref, obs = record["reference"], record["observed"]
    pauses = record.get("pauses") or []
    # In-flight operations (a reset or an abort with no pause) count as the pause does: the request ran
    # through one; aborted by one, it may end early.
    interrupts = record.get("interrupts") or []
    running = bool(pauses or interrupts)
    aborted = any(p.get("mode") == "abort" for p in pauses) or any(
        i.get("op") == "abort" and i.get("target") for i in interrupts)
    frozen = [p for p in pauses if p.get("frozen")]
    pause_index = (pauses or interrupts)[0]["client_tokens"] if running else None
    fpr: dict[str, int | None] | None = None
    if frozen:
        idx = frozen[0]["client_tokens"]
        fpr = {"index": idx, "expected": _at(ref, idx), "observed": _at(obs, idx)}
    elif record.get("submit") not in ("start", None):
        # Submitted during the pause or after resume: token 0 is post-resume.
        fpr = {"index": 0, "expected": _at(ref, 0), "observed": _at(obs, 0)}
    if record.get("error"):
        v = StreamVerdict(Outcome.ERROR, detail=str(record["error"]))
    else:
        v = classify_stream(ref, obs, expected_len=record["max_tokens"], prefix_ok=aborted)
        short = len(obs) < record["max_tokens"]
        if v.outcome is Outcome.OK and aborted and short and record.get("finish_reason") != "abort":
            v = StreamVerdict(
                Outcome.TRUNCATED, len(obs),
                detail=f"ended with finish_reason {record.get('finish_reason')!r}, not 'abort'",
            )
    return RequestVerdict(rid, v, running, pause_index, fpr)


def _at(seq: Sequence[int], i: int) -> int | None:
    return seq[i] if 0 <= i < len(seq) else None


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


def cell_verdict(records: list[dict[str, Any]]) -> CellVerdict:
    """Worst request outcome, with counts, for a cell whose scenario ran."""
    reqs = tuple(classify_request(r) for r in records)
    if not reqs:
        return CellVerdict(Outcome.ERROR, "no requests recorded", reason="scenario produced no requests")
    for r in records:
        if not r.get("reference_matches_model", True):
            return CellVerdict(
                Outcome.ERROR,
                "model check failed",
                requests=reqs,
                reason=f"the engine's no-pause stream for {r['rid']} does not follow the bigram cycle; "
                "token loss would not be visible",
            )
    worst = max(reqs, key=lambda r: r.outcome.rank)
    counts = Counter(r.verdict.short for r in reqs)
    bad = [r for r in reqs if r.outcome is worst.outcome]
    reason = None
    label = worst.outcome.value
    if worst.outcome is Outcome.OK:
        summary = f"OK {len(reqs)}/{len(reqs)}"
    else:
        running = [r for r in reqs if r.running_at_pause]
        bad_running = [r for r in bad if r.running_at_pause]
        label = _cell_label(worst.outcome, bad)
        summary = f"{label} in {len(bad)}/{len(reqs)} requests"
        if running:
            summary += f" ({len(bad_running)}/{len(running)} running at pause)"
        if worst.outcome is Outcome.ERROR:
            reason = f"{len(bad)} request(s) failed; first: {worst.rid}: {worst.verdict.detail}"
    return CellVerdict(worst.outcome, summary, dict(sorted(counts.items())), reqs, reason, label)


def _cell_label(worst: Outcome, bad: list[RequestVerdict]) -> str:
    """The head of a faulty cell's summary, so the count always matches the label: ``LOSS(1)`` in 8/10,
    ``LOSS(1,2)`` when single losses differ in size; with several events in a request, each distinct shape
    (``LOSS(1; 1)``, or ``LOSS(1) | LOSS(1; 1)`` when some requests saw one pause and some two)."""
    if worst in SHIFTS and any(len(r.verdict.events) > 1 for r in bad):
        return " | ".join(sorted({r.verdict.short for r in bad}, key=lambda s: (s.count(";"), s)))
    ks = sorted({r.verdict.k for r in bad if r.verdict.k is not None})
    return worst.value + (f"({','.join(map(str, ks))})" if ks else "")


def predicted_stream(reference: Sequence[int], loss_points: Sequence[int], n: int) -> list[int]:
    """The stream a request shows when it loses one token at each observed index in ``loss_points``.

    ``loss_points`` are positions in the *observed* stream (e.g. the pause
    index of each keep+clear_cache pause the request was preempted at); the
    stream is cut to ``n`` tokens.  With no loss points it is ``reference[:n]``.
    """
    points = sorted(loss_points)
    out: list[int] = []
    r = 0
    for i in range(n):
        while points and points[0] == i:
            points.pop(0)
            r += 1
        if r >= len(reference):
            break
        out.append(reference[r])
        r += 1
    return out


def running_pauses(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pauses of a request at which it was running in the engine, in order: what a fault per pause hits.

    The record lists every pause the request was submitted and unfinished at.  Left out: a keep pause whose
    resume found it finished (its last token came before the pause: nothing after it to lose), and a pause
    at which the engine held it queued: for a keep pause with clear_cache (the cache reset preempts every
    *running* request) its preemption count did not go up, otherwise the engine reported it ``WAITING``.
    """
    out = []
    seen = 0
    for p in record.get("pauses") or []:
        count, status = p.get("engine_preemptions"), str(p.get("engine_status") or "")
        if count is not None and p.get("mode") == "keep" and p.get("clear_cache"):
            running, seen = count > seen, max(seen, count)
        else:
            running = not status.startswith("WAITING")
            seen = max(seen, count or 0)
        if running and not (p.get("mode") == "keep" and p.get("frozen") is False):
            out.append(dict(p))
    return out


def preempted_at_keep_clear(record: dict[str, Any]) -> list[int]:
    """Observed indices at which vLLM #42043 drops a token from this request.

    One per keep-mode pause with clear_cache=True at which the cache reset
    force-preempted the request, i.e. it was running: the engine's preemption
    count for it went up at that pause.  A request still queued (never
    scheduled, or not yet rescheduled after an earlier pause) is not touched.
    """
    out = []
    seen = 0
    for p in record.get("pauses") or []:
        count = p.get("engine_preemptions")
        if count is None:
            preempted = "PREEMPTED" in str(p.get("engine_status") or "")
        else:
            preempted, seen = count > seen, max(seen, count)
        if preempted and p.get("mode") == "keep" and p.get("clear_cache"):
            out.append(int(p["client_tokens"]))
    return out


def fit_losses(
    reference: Sequence[int], observed: Sequence[int], n: int, points: Sequence[int]
) -> dict[int, int] | None:
    """How many tokens were lost at each point, if ``observed`` is explained by losses at ``points`` only.

    ``points`` may repeat an index (a request preempted by two keep+clear
    pauses with no token delivered in between).  Each distinct index must have
    lost at least one and at most as many tokens as it appears: back-to-back
    preemptions lose one token, or two when no frame was in flight to absorb
    the second discard.  Returns {index: tokens lost} or None.
    """
    import itertools

    counts = Counter(points)
    idx = sorted(counts)
    for combo in itertools.product(*(range(1, counts[i] + 1) for i in idx)):
        drops = [i for i, k in zip(idx, combo, strict=True) for _ in range(k)]
        if list(observed) == predicted_stream(reference, drops, n):
            return dict(zip(idx, combo, strict=True))
    return None
