"""Bisect: a pure search for the boundary in an ordered list of candidates (versions or commits).

The caller supplies ``probe(candidate) -> ProbeResult``; this module only decides
which candidate to probe next.  It does no I/O and prints nothing: progress goes
to an optional ``on_probe(ProbeRecord)`` callback.

``find="fix"`` looks for the first GOOD candidate after BAD ones,
``find="regression"`` for the first BAD candidate after GOOD ones.  The old end
of the list must show the old state and the new end the new state; SKIP
candidates (e.g. UNSUPPORTED cells) are stepped around.

Probe bound: without SKIPs a search over N candidates probes both ends and then
halves the gap between the known old-state index ``lo`` and new-state index
``hi`` (initially N - 1) with each probe, so it makes at most
``2 + ceil(log2(N - 1))`` probes, which is at most ``2 + ceil(log2(N))``.
Every candidate is probed at most once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from harness.core.errors import BadInput, ReproError, bad_choice

FIND_MODES = ("fix", "regression")


class Verdict(enum.Enum):
    GOOD = "GOOD"
    BAD = "BAD"
    SKIP = "SKIP"


@dataclass(frozen=True)
class ProbeResult:
    verdict: Verdict
    detail: str = ""


@dataclass(frozen=True)
class ProbeRecord:
    index: int
    candidate: str
    result: ProbeResult
    step: int


class BisectError(ReproError):
    """The range cannot be bisected: the endpoints do not bracket a boundary, or everything was skipped.

    ``endpoints`` holds the records of the effective endpoints that were found
    (after stepping around SKIPs), ``skipped`` the records of the SKIP
    candidates that explain the failure, ``probes`` every probe made.
    """

    def __init__(
        self,
        message: str,
        *,
        endpoints: tuple[ProbeRecord, ...] = (),
        skipped: tuple[ProbeRecord, ...] = (),
        probes: tuple[ProbeRecord, ...] = (),
    ) -> None:
        super().__init__(message)
        self.endpoints = endpoints
        self.skipped = skipped
        self.probes = probes


def _states(find: str) -> tuple[Verdict, Verdict]:
    # (old state, new state) of a search mode.
    return (Verdict.BAD, Verdict.GOOD) if find == "fix" else (Verdict.GOOD, Verdict.BAD)


def _is(record: ProbeRecord) -> str:
    detail = record.result.detail
    return f"is {record.result.verdict.name}" + (f" ({detail})" if detail else "")


def _outcome(record: ProbeRecord) -> str:
    return f"{record.candidate} {_is(record)}"


def _skip_list(records: Iterable[ProbeRecord]) -> str:
    parts = []
    for r in records:
        parts.append(f"{r.candidate} ({r.result.detail})" if r.result.detail else r.candidate)
    return ", ".join(parts)


def _short(record: ProbeRecord) -> str:
    detail = record.result.detail
    return f"{record.candidate} {record.result.verdict.name}" + (f": {detail}" if detail else "")


@dataclass(frozen=True)
class BisectResult:
    find: str
    first_new: str
    last_old: str
    probes: tuple[ProbeRecord, ...]
    ambiguous: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    noun: str = "release"

    def record(self, candidate: str) -> ProbeRecord | None:
        """The probe record of ``candidate``, or None when it was not probed."""
        return next((r for r in self.probes if r.candidate == candidate), None)

    @property
    def summary(self) -> str:
        """One line, e.g. ``first fixed release: 0.22.0 (0.21.0 BAD: LOSS(1) 8/8; 0.22.0 GOOD: OK 10/10)``."""
        what = "fixed" if self.find == "fix" else "bad"
        old, new = self.record(self.last_old), self.record(self.first_new)
        evidence = "; ".join(_short(r) for r in (old, new) if r is not None)
        text = f"first {what} {self.noun}: {self.first_new} ({evidence})"
        if self.ambiguous:
            text += f"; boundary ambiguous: {', '.join(self.ambiguous)} could not be tested"
        return text


def answer_fields(result: BisectResult | None, error: str | None, probes: Iterable[ProbeRecord],
                  find: str) -> dict[str, object]:
    """The fields every bisect log writes about its answer (``bisect.json``, ``frameworks-bisect.json``)."""
    return {
        "answer": result.summary if result else None,
        "first_new": result.first_new if result else None,
        "last_old": result.last_old if result else None,
        "ambiguous": list(result.ambiguous) if result else [],
        "error": error,
        "warnings": monotone_check(probes, find),
    }


def _validate(candidates: Sequence[str], find: str) -> list[str]:
    if find not in FIND_MODES:
        raise bad_choice("--find mode", find, FIND_MODES)
    if isinstance(candidates, str | bytes):
        raise BadInput(f"candidates must be a sequence of strings, not the single string {candidates!r}")
    items = list(candidates)
    for c in items:
        if not isinstance(c, str):
            raise BadInput(f"candidate {c!r} is of type {type(c).__name__}, not a string")
    if len(items) < 2:
        raise BadInput(f"bisect needs at least 2 candidates, got {len(items)}: {items!r}")
    seen: set[str] = set()
    for c in items:
        if c in seen:
            raise BadInput(f"duplicate candidate {c!r} in {items!r}")
        seen.add(c)
    return items


class _Prober:
    """Probes candidates at most once each, in probe order, and remembers every record."""

    def __init__(self, items: list[str], probe: Callable[[str], ProbeResult],
                 on_probe: Callable[[ProbeRecord], None] | None) -> None:
        self.items, self.probe, self.on_probe = items, probe, on_probe
        self.cache: dict[int, ProbeRecord] = {}
        self.records: list[ProbeRecord] = []

    def run(self, i: int) -> ProbeRecord:
        if i in self.cache:
            return self.cache[i]
        result = self.probe(self.items[i])
        if not isinstance(result, ProbeResult):
            raise TypeError(f"probe({self.items[i]!r}) returned {result!r}, not a ProbeResult")
        rec = ProbeRecord(index=i, candidate=self.items[i], result=result, step=len(self.records) + 1)
        self.cache[i] = rec
        self.records.append(rec)
        if self.on_probe is not None:
            self.on_probe(rec)
        return rec

    def skipped_in(self, lo: int, hi: int) -> tuple[ProbeRecord, ...]:
        """Probed SKIP records with lo <= index < hi, in index order."""
        return tuple(self.cache[i] for i in range(lo, hi)
                     if i in self.cache and self.cache[i].result.verdict is Verdict.SKIP)

    def first_run(self, indices: Iterable[int]) -> ProbeRecord | None:
        """The first of ``indices`` whose probe is not SKIP (stepping inwards from an end), or None."""
        for i in indices:
            rec = self.run(i)
            if rec.result.verdict is not Verdict.SKIP:
                return rec
        return None


def bisect(
    candidates: Sequence[str],
    probe: Callable[[str], ProbeResult],
    find: str = "fix",
    on_probe: Callable[[ProbeRecord], None] | None = None,
    noun: str = "release",
) -> BisectResult:
    """Find the first candidate in the new state (GOOD for ``fix``, BAD for ``regression``).

    ``candidates`` are ordered old to new.  Each candidate is probed at most
    once; ``on_probe`` sees every record in probe order.  SKIP endpoints are
    stepped around inwards.  Raises BadInput for a bad ``find``, fewer than two
    or duplicate candidates, and BisectError when the (effective) endpoints do
    not bracket an old-to-new boundary.  Without SKIPs at most
    ``2 + ceil(log2(len(candidates) - 1))`` probes are made.
    """
    items = _validate(candidates, find)
    old_state, new_state = _states(find)
    n = len(items)
    p = _Prober(items, probe, on_probe)
    old_end = p.first_run(range(n))
    if old_end is None:
        raise BisectError(f"every candidate was skipped: {_skip_list(p.records)}", skipped=tuple(p.records),
                          probes=tuple(p.records))
    new_end = p.first_run(range(n - 1, old_end.index, -1))
    new_end = _check_endpoints(find, noun, old_end, new_end, p.skipped_in(0, old_end.index),
                               p.skipped_in(old_end.index + 1, n), tuple(p.records))
    # Binary search strictly between lo (old state) and hi (new state).
    lo, hi = old_end.index, new_end.index
    while hi - lo > 1:
        pick = _next_probe(lo, hi, p.cache)
        if pick is None:
            break  # every candidate strictly between lo and hi is SKIP
        rec = p.run(pick)
        if rec.result.verdict is old_state:
            lo = pick
        elif rec.result.verdict is new_state:
            hi = pick
    return BisectResult(find=find, first_new=items[hi], last_old=items[lo], probes=tuple(p.records),
                        ambiguous=tuple(r.candidate for r in p.skipped_in(lo + 1, hi)),
                        skipped=tuple(r.candidate for r in p.skipped_in(0, n)), noun=noun)


def _next_probe(lo: int, hi: int, cache: dict[int, ProbeRecord]) -> int | None:
    # The unprobed index nearest the middle of (lo, hi): mid, mid+1, mid-1, mid+2, ...; None if none is left.
    # Every probed index strictly between lo and hi is a SKIP (any other verdict would have moved lo or hi),
    # so "unprobed" means "not known to be skipped".
    mid = (lo + hi) // 2
    for offset in range(hi - lo):
        for i in (mid + offset, mid - offset) if offset else (mid,):
            if lo < i < hi and i not in cache:
                return i
    return None


def _check_endpoints(
    find: str,
    noun: str,
    old_end: ProbeRecord,
    new_end: ProbeRecord | None,
    leading: tuple[ProbeRecord, ...],
    trailing: tuple[ProbeRecord, ...],
    probes: tuple[ProbeRecord, ...],
) -> ProbeRecord:
    # new_end, after checking that old_end has the old state and new_end the new state; else BisectError.
    old_state, new_state = _states(find)
    if new_end is not None and old_end.result.verdict is old_state and new_end.result.verdict is new_state:
        return new_end
    endpoints = (old_end,) if new_end is None else (old_end, new_end)
    message = _ill_posed(find, noun, old_end, new_end, leading, trailing)
    raise BisectError(message, endpoints=endpoints, skipped=leading + trailing, probes=probes)


def _ill_posed(
    find: str, noun: str, old_end: ProbeRecord, new_end: ProbeRecord | None,
    leading: tuple[ProbeRecord, ...], trailing: tuple[ProbeRecord, ...],
) -> str:
    # Why the endpoints bracket no old-to-new boundary.
    old_state, new_state = _states(find)
    need = f"the first {noun} must be {old_state.name} and the last {new_state.name}"
    boundary = f"no {old_state.name}-to-{new_state.name} boundary in the range"
    # The first runnable candidate already has the new state and everything before it was skipped:
    # the state is present as early as it can be tested, which is not a boundary.
    if leading and old_end.result.verdict is new_state and (new_end is None or new_end.result.verdict is new_state):
        last = f"; the last {noun} to run: {_outcome(new_end)}" if new_end is not None else ""
        if trailing:
            last += f"; skipped after it: {_skip_list(trailing)}"
        return (f"no {old_state.name} {noun} in the range for --find {find}: {old_end.candidate}, the first {noun} "
                f"that could be tested, {_is(old_end)}, and every earlier {noun} was skipped: {_skip_list(leading)}; "
                f"the bug is already {'fixed' if find == 'fix' else 'present'} in {old_end.candidate}, the first "
                f"{noun} that can run the probe, so there is {boundary}{last}")
    # Symmetric at the new end: the last runnable candidate still has the old state, everything after it skipped.
    if trailing and new_end is not None and new_end.result.verdict is old_state and old_end.result.verdict is old_state:
        first = f"; skipped before it: {_skip_list(leading)}" if leading else ""
        return (f"no {new_state.name} {noun} in the range for --find {find}: the first {noun} to run, "
                f"{_outcome(old_end)}, and {new_end.candidate}, the last {noun} that could be tested, {_is(new_end)}; "
                f"every later {noun} was skipped: {_skip_list(trailing)}; the bug is still "
                f"{'present' if find == 'fix' else 'absent'} in {new_end.candidate}, the last {noun} that can run "
                f"the probe, so there is {boundary}{first}")
    if new_end is None:
        return (f"ill-posed range for --find {find}: {_outcome(old_end)} and every later {noun} was skipped: "
                f"{_skip_list(trailing) or '(none left)'}; {need}"
                + (f"; skipped before it: {_skip_list(leading)}" if leading else ""))
    skipped = leading + trailing
    extra = f"; skipped: {_skip_list(skipped)}" if skipped else ""
    return f"ill-posed range for --find {find}: {_outcome(old_end)} and {_outcome(new_end)}; {need}{extra}"


def monotone_check(records: Iterable[ProbeRecord], find: str | None = None) -> list[str]:
    """Warnings when the probed verdicts are not monotone in index order (SKIPs ignored).

    With ``find`` the old state is BAD (fix) or GOOD (regression); without it the
    verdict of the lowest probed index is taken as the old state.  A record of
    the old state at a higher index than one of the new state means the list
    has several boundaries and a bisect answer is only one of them.  Records of
    the same index with different verdicts (e.g. from re-runs) are reported too.
    """
    if find is not None and find not in FIND_MODES:
        raise bad_choice("--find mode", find, FIND_MODES)
    runs = sorted((r for r in records if r.result.verdict is not Verdict.SKIP), key=lambda r: (r.index, r.step))
    warnings: list[str] = []
    by_index: dict[int, ProbeRecord] = {}
    for r in runs:
        prev = by_index.setdefault(r.index, r)
        if prev.result.verdict is not r.result.verdict:
            warnings.append(f"inconsistent verdicts for {r.candidate}: {_short(prev)} then {_short(r)} (flaky probe?)")
    if not runs:
        return warnings
    if find is not None:
        old_state, new_state = _states(find)
    else:
        old_state = runs[0].result.verdict
        new_state = Verdict.GOOD if old_state is Verdict.BAD else Verdict.BAD
    first_new: ProbeRecord | None = None
    for r in runs:
        if r.result.verdict is new_state and first_new is None:
            first_new = r
        elif r.result.verdict is old_state and first_new is not None and r.index > first_new.index:
            warnings.append(
                f"non-monotone: {_short(r)} comes after {_short(first_new)}; "
                f"the range has more than one {old_state.name}/{new_state.name} boundary and a bisect finds only one"
            )
    return warnings
