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

Any other model's reference may repeat itself (random weights fall into
loops), so every verdict is checked for what the streams can prove
(:func:`shift_ambiguity`): a stream that fits two readings at once (no fault
and a lost token, or a lost and a repeated token) is AMBIGUOUS with the
reason, never OK or LOSS.  Such a model's reference is the engine's own
no-pause run, recorded twice with different batching (``reference_repeat``);
when the two differ, the engine's numerics depend on batch composition and
a stream that matches neither is AMBIGUOUS too (:func:`reference_split`).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any


class Outcome(enum.Enum):
    OK = "OK"
    # The streams cannot tell: the reference repeats where a shift would show, or the engine's no-pause
    # reference changes with batch composition.  No verdict either way (SKIP in a bisect, UNKNOWN for a
    # workaround), but not an infrastructure failure: the cell ran.
    AMBIGUOUS = "AMBIGUOUS"
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


_RANK = {o: i for i, o in enumerate((
    Outcome.OK, Outcome.AMBIGUOUS, Outcome.TRUNCATED, Outcome.DUPLICATE, Outcome.LOSS, Outcome.DIVERGED,
    Outcome.CRASH, Outcome.FLAKY, Outcome.UNSUPPORTED, Outcome.BUILD_FAILED, Outcome.ERROR, Outcome.TIMEOUT))}
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


# --------------------------------------------------------------------------- what the streams can prove


def _apply(reference: Sequence[int], events: Sequence[FaultEvent], n: int) -> list[int] | None:
    """The ``n`` tokens a stream shows when ``events`` shift it against ``reference`` (None: past either end)."""
    evs = sorted(events, key=lambda e: e.at)
    out: list[int] = []
    off = k = 0
    for i in range(n):
        while k < len(evs) and evs[k].at == i:
            off, k = off + evs[k].shift, k + 1
        if not 0 <= i + off < len(reference):
            return None
        out.append(reference[i + off])
    return out


def _reading(events: Sequence[FaultEvent]) -> str:
    return events_label(sorted(events, key=lambda e: e.at), with_index=False) if events else "OK"


def _variants(base: tuple[FaultEvent, ...], points: Iterable[int], max_shift: int) -> list[list[FaultEvent]]:
    """Readings near ``base``: itself, one event fewer, one more at a point, one moved, resized or turned."""
    shapes = [(kind, d) for d in range(1, max_shift + 1) for kind in SHIFTS]
    out = [list(base)] + [[*base[:i], *base[i + 1:]] for i in range(len(base))]
    taken = {e.at for e in base}
    out += [[*base, FaultEvent(kind, d, p)] for p in points if p not in taken for kind, d in shapes]
    for i, e in enumerate(base):
        out += [[*base[:i], FaultEvent(kind, d, at), *base[i + 1:]]
                for at in range(max(0, e.at - max_shift), e.at + 1) for kind, d in shapes]
    return out


def readings(reference: Sequence[int], observed: Sequence[int], base: Sequence[FaultEvent], points: Iterable[int],
             max_shift: int = 8) -> set[str]:
    """Every reading near ``base`` (see :func:`_variants`) that ``observed`` fits exactly, spelled as
    StreamVerdict.short spells it ("OK", "LOSS(1)", "LOSS(1; 1)", ...)."""
    obs = list(observed)
    return {_reading(evs) for evs in _variants(tuple(base), points, max_shift)
            if _apply(reference, evs, len(obs)) == obs}


def explanations(reference: Sequence[int], observed: Sequence[int], points: Iterable[int],
                 max_shift: int = 8) -> set[str]:
    """Every reading of ``observed`` it fits exactly: "OK", or one fault event "LOSS(d)" / "DUPLICATE(d)" at one
    of ``points``."""
    return readings(reference, observed, (), points, max_shift)


def shift_ambiguity(reference: Sequence[int], observed: Sequence[int], verdict: StreamVerdict,
                    critical: Sequence[int], max_shift: int = 8) -> str | None:
    """Why ``verdict`` (OK, or shifts) is not proven by the streams, or None when it is.

    ``critical``: where a fault would strike (the pause indices of a frozen request, 0 for one submitted
    during or after a pause).  The verdict proves nothing when another reading near it fits the stream as
    well: a lost or repeated token at a critical index that would have left the stream unchanged (the
    reference repeats itself from there on), or another shift in place of one of its own (a period-2 loop:
    losing one token is repeating one).  A shift whose index alone is uncertain (inside a run of one token)
    still proves its kind and size.
    """
    if verdict.outcome not in (Outcome.OK, *SHIFTS):
        return None
    base = verdict.events if verdict.outcome in SHIFTS else ()
    if verdict.outcome in SHIFTS and not base:  # a verdict built by hand, without its events
        base = (FaultEvent(verdict.outcome, verdict.k or 1, verdict.at or 0),)
    points = {c for c in critical if 0 <= c < len(observed)}
    if not points and not base:
        return None
    fits = readings(reference, observed, base, sorted(points), max_shift)
    if len(fits) < 2:
        return None
    at = min(points | {e.at for e in base})
    window = " ".join(str(t) for t in reference[max(0, at - 2): at + 6])
    return (f"the stream fits {_readings(fits)} alike: the reference repeats itself where a shift would show "
            f"(from index {at}: {window} …), so the shift cannot be told")


def _readings(fits: set[str]) -> str:
    """``{"OK", "LOSS(1)", "LOSS(2)", "DUPLICATE(2)"}`` -> ``OK, LOSS(1,2), DUPLICATE(2)``."""
    single = {f for f in fits if f.rstrip(")").split("(")[-1].isdigit() and f.count("(") == 1}
    parts = ["OK"] if "OK" in fits else []
    for kind in (Outcome.LOSS.value, Outcome.DUPLICATE.value):
        sizes = sorted(int(f[len(kind) + 1:-1]) for f in single if f.startswith(kind + "("))
        if sizes:
            parts.append(f"{kind}({','.join(map(str, sizes))})")
    return ", ".join(parts + sorted(fits - single - {"OK"}))


def reference_split(record: dict[str, Any]) -> int | None:
    """The first index where the engine's two no-pause references of this request differ, or None.

    ``reference_repeat`` is recorded (models whose stream is not known in advance) with the requests batched
    as in the paused run; a difference means the engine's tokens depend on batch composition.
    """
    repeat = record.get("reference_repeat")
    if repeat is None:
        return None
    ref = record["reference"]
    return next((i for i, (a, b) in enumerate(zip(ref, repeat, strict=False)) if a != b),
                None if len(ref) == len(repeat) else min(len(ref), len(repeat)))


NONDETERMINISM_HINT = ("the engine's no-pause tokens depend on batch composition (numerical nondeterminism), so a "
                       "stream that matches neither reference proves nothing; on GPUs run with --batch-invariant on "
                       "(VLLM_BATCH_INVARIANT=1), or use a model with wider logit margins")


# --------------------------------------------------------------------------- requests


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


def critical_points(record: dict[str, Any]) -> list[int]:
    """Where a pause fault would strike this request: its index at each keep pause that froze it, or 0 when
    it was submitted during or after a pause (its first token is post-resume)."""
    frozen = [int(p["client_tokens"]) for p in record.get("pauses") or [] if p.get("frozen")]
    # A reset with no pause (reset-inflight) preempts the request where it stands: a fault would strike there.
    frozen += [int(i["client_tokens"]) for i in record.get("interrupts") or [] if i.get("op") == "reset"]
    if frozen:
        return sorted(frozen)
    return [0] if record.get("submit") not in ("start", None) else []


def _aborted(record: dict[str, Any]) -> bool:
    """Aborted by a pause in abort mode or by an in-flight abort naming it: the stream may end early."""
    return any(p.get("mode") == "abort" for p in record.get("pauses") or []) or any(
        i.get("op") == "abort" and i.get("target") for i in record.get("interrupts") or [])


def _stream_verdict(record: dict[str, Any], reference: Sequence[int], points: Sequence[int]) -> StreamVerdict:
    obs = record["observed"]
    aborted = _aborted(record)
    v = classify_stream(reference, obs, expected_len=record["max_tokens"], prefix_ok=aborted)
    short = len(obs) < record["max_tokens"]
    if v.outcome is Outcome.OK and aborted and short and record.get("finish_reason") != "abort":
        return StreamVerdict(Outcome.TRUNCATED, len(obs),
                             detail=f"ended with finish_reason {record.get('finish_reason')!r}, not 'abort'")
    why = shift_ambiguity(reference, obs, v, points)
    return StreamVerdict(Outcome.AMBIGUOUS, v.at, detail=why) if why else v


def _judge(record: dict[str, Any], points: Sequence[int], split: int | None) -> StreamVerdict:
    """The stream's verdict against its reference, or against both when the engine's two references differ."""
    first = _stream_verdict(record, record["reference"], points)
    if split is None:
        return first
    second = _stream_verdict(record, record["reference_repeat"], points)
    ok = next((v for v in (first, second) if v.outcome is Outcome.OK), None)
    if ok is not None:
        return ok  # the stream is one of the engine's own no-pause runs
    if first.label == second.label and first.outcome is not Outcome.DIVERGED:
        return first
    return StreamVerdict(Outcome.AMBIGUOUS, first.at, detail=(
        f"{first.label} against the reference, {second.label} against the one batched as the paused run "
        f"(they differ from index {split}): {NONDETERMINISM_HINT}"))


def classify_request(record: dict[str, Any]) -> RequestVerdict:
    """Judge one request record written by ``repro.cell``."""
    ref, obs = record["reference"], record["observed"]
    pauses = record.get("pauses") or []
    # In-flight operations (a reset or an abort with no pause) count as the pause does: the request ran
    # through one (and, aborted by one, may end early: _aborted).
    interrupts = record.get("interrupts") or []
    running = bool(pauses or interrupts)
    pause_index = (pauses or interrupts)[0]["client_tokens"] if running else None
    points = critical_points(record)
    fpr: dict[str, int | None] | None = None
    if points:
        fpr = {"index": points[0], "expected": _at(ref, points[0]), "observed": _at(obs, points[0])}
    split = reference_split(record)
    if record.get("error"):
        v = StreamVerdict(Outcome.ERROR, detail=str(record["error"]))
    else:
        v = _judge(record, points, split)
    return RequestVerdict(record["rid"], v, running, pause_index, fpr, split)


def _at(seq: Sequence[int], i: int) -> int | None:
    return seq[i] if 0 <= i < len(seq) else None


# --------------------------------------------------------------------------- cells


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
    splits = [r for r in reqs if r.reference_split is not None]
    if splits:
        reqs = tuple(_doubt(r) for r in reqs)
    worst = max(reqs, key=lambda r: r.outcome.rank)
    counts = Counter(r.verdict.short for r in reqs)
    if worst.outcome is Outcome.OK:
        return CellVerdict(Outcome.OK, f"OK {len(reqs)}/{len(reqs)}", dict(sorted(counts.items())), reqs)
    label, summary = _fault_summary(reqs, worst.outcome)
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
