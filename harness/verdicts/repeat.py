"""``--repeat N``: fold the N runs of one cell into one result, FLAKY when their outcomes differ."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from harness.core.oracle import Outcome
from harness.core.records import RepeatSummary
from harness.verdicts.results import CellResult


def aggregate(runs: list[CellResult]) -> CellResult:
    """One result for the runs of a cell: their common outcome, or FLAKY with the fraction of each outcome.

    FLAKY means the verdicts of runs disagree.  A run that produced no verdict
    (ERROR, TIMEOUT, BUILD-FAILED, UNSUPPORTED) makes the cell that outcome
    (the worst such), so infrastructure failures are never hidden as FLAKY and
    a resumed run re-runs the cell.  The requests shown are those of the first
    run with the worst outcome, so a FLAKY cell still names the lost tokens of
    a failing run.
    """
    if not runs:
        raise ValueError("aggregate() needs at least one run")
    if len({r.cell for r in runs}) != 1:
        raise ValueError(f"runs of different cells: {sorted({r.id for r in runs})}")
    n = len(runs)
    counts = Counter(r.outcome.value for r in runs)
    repeats = RepeatSummary(n, dict(counts), {k: round(v / n, 4) for k, v in counts.items()},
                            tuple(r.summary for r in runs))
    worst = max(runs, key=lambda r: r.outcome.rank)
    if len(counts) == 1:
        return replace(worst, summary=f"{worst.summary} ({n}/{n} runs)" if n > 1 else worst.summary,
                       repeats=repeats if n > 1 else None)
    split = ", ".join(f"{k} {v}/{n}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    if worst.outcome.is_infra:
        return replace(worst, summary=f"{worst.outcome.value} in {counts[worst.outcome.value]}/{n} runs "
                                      f"({split}): {worst.reason or worst.summary}", repeats=repeats)
    return replace(worst, outcome=Outcome.FLAKY, summary=f"FLAKY: {split}", label=Outcome.FLAKY.value,
                   reason=f"runs disagree: {'; '.join(f'#{i}: {s}' for i, s in enumerate(repeats.runs, 1))}",
                   repeats=repeats)
