"""One stream against its reference: the decomposition into fault events (see the package docstring).

What :func:`classify_stream` returns is a :class:`StreamVerdict`: OK, TRUNCATED, LOSS / DUPLICATE with every
event, or DIVERGED at the first token no sequence of shifts explains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.core.oracle.outcome import SHIFTS, FaultEvent, Outcome, events_label

# Outcomes whose label names where the stream went wrong: ``DIVERGED(at 9)``, ``LOGPROB-SHIFT(at 9)``.
_AT_LABELLED = (Outcome.TRUNCATED, Outcome.LOGPROB_SHIFT, Outcome.GROUP_BROKEN, Outcome.STALE_KV)


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
        if self.outcome is Outcome.DIVERGED or (self.outcome in _AT_LABELLED and self.at is not None):
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

