"""What the streams can prove: a verdict that another reading fits as well is AMBIGUOUS, with the reason.

A model whose reference repeats itself (random weights fall into loops) can make a lost token look like none
(:func:`shift_ambiguity`); an engine whose two no-pause references differ with batch composition proves
nothing with a stream that matches neither (:func:`reference_split`, :data:`NONDETERMINISM_HINT`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from harness.core.oracle.outcome import SHIFTS, FaultEvent, Outcome, events_label
from harness.core.oracle.streams import StreamVerdict
from harness.core.recorded_streams import StreamRecord


def _apply(reference: Sequence[int], events: Sequence[FaultEvent], n: int) -> list[int] | None:
    """The ``n`` tokens a stream shows when ``events`` shift it against ``reference`` (None: past either end).

    Segment by segment (a slice per stretch between events): judging a report calls this for every reading of
    every request, so it is the oracle's hot loop.
    """
    out: list[int] = []
    off = i = 0
    for e in sorted(events, key=lambda e: e.at):
        if e.at >= n:
            break
        if e.at > i:
            if not _take(reference, i + off, e.at + off, out):
                return None
            i = e.at
        off += e.shift
    return out if n <= i or _take(reference, i + off, n + off, out) else None


def _take(reference: Sequence[int], lo: int, hi: int, out: list[int]) -> bool:
    if lo < 0 or hi > len(reference):
        return False
    out.extend(reference[lo:hi])
    return True


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


def stale_ambiguity(record: StreamRecord, verdict: StreamVerdict) -> str | None:
    """Why a shift at a weight swap is not proven, or None when it is (or there was no swap).

    The token at the swap index may be what the weights *before* the swap give (a frame computed before it,
    delivered after: vLLM 0.16.0's keep pause returns with one in flight under async scheduling).  The new
    weights' cycle runs through every token, so the stream then continues as that cycle from there, and when
    the old token lies up to ``max_shift`` steps ahead on it the stream also reads as tokens lost there.
    """
    if record.stale is None or verdict.outcome not in SHIFTS or not verdict.events:
        return None
    at, token = record.stale
    if verdict.events[0].at != at or at >= len(record.observed) or record.observed[at] != token:
        return None
    return (f"the stream fits {verdict.label} and a stale token alike: token {at} ({token}) is what the weights "
            "before the swap give there (a frame computed before the swap), and the new weights' cycle runs "
            "through every token, so a stale token reads as a shift")


def _readings(fits: set[str]) -> str:
    """``{"OK", "LOSS(1)", "LOSS(2)", "DUPLICATE(2)"}`` -> ``OK, LOSS(1,2), DUPLICATE(2)``."""
    single = {f for f in fits if f.rstrip(")").split("(")[-1].isdigit() and f.count("(") == 1}
    parts = ["OK"] if "OK" in fits else []
    for kind in (Outcome.LOSS.value, Outcome.DUPLICATE.value):
        sizes = sorted(int(f[len(kind) + 1:-1]) for f in single if f.startswith(kind + "("))
        if sizes:
            parts.append(f"{kind}({','.join(map(str, sizes))})")
    return ", ".join(parts + sorted(fits - single - {"OK"}))


def reference_split(record: StreamRecord) -> int | None:
    """The first index where the engine's two no-pause references of this request differ, or None.

    ``reference_repeat`` is recorded (models whose stream is not known in advance) with the requests batched
    as in the paused run; a difference means the engine's tokens depend on batch composition.
    """
    repeat = record.reference_repeat
    if repeat is None:
        return None
    ref = record.reference
    return next((i for i, (a, b) in enumerate(zip(ref, repeat, strict=False)) if a != b),
                None if len(ref) == len(repeat) else min(len(ref), len(repeat)))


NONDETERMINISM_HINT = ("the engine's no-pause tokens depend on batch composition (numerical nondeterminism), so a "
                       "stream that matches neither reference proves nothing; on GPUs run with --batch-invariant on "
                       "(VLLM_BATCH_INVARIANT=1), or use a model with wider logit margins")

