"""What the project has judged (the newest release with a verdict in its history or results) and the releases the
index has past it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.core.outcome_groups import Category, category

# Outcomes that are a verdict on the release: the cell ran and its streams were judged (a finding counts).
from harness.envbuild.index_releases import Fetch
from harness.plan.releases import candidate_versions

VERDICT_CATEGORIES = frozenset({Category.OK, Category.AMBIGUOUS, Category.TOKEN_FAULT, Category.FLAKY})


@dataclass(frozen=True)
class Judged:
    """The newest release judged, and where that was read (files and their run or cell counts)."""

    version: str | None  # None: nothing judged in the files given
    sources: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "sources": list(self.sources)}


def release_of(label: str) -> Version | None:
    """The release a version label names, or None for a commit label, a dev build or a local build."""
    try:
        v = Version(label)
    except InvalidVersion:
        return None
    # A commit label is hex: all digits ("123456789012") would parse as a one-part version.
    if len(v.release) < 2 or v.is_devrelease or v.local is not None:
        return None
    return v


def newest_judged(cells: Iterable[tuple[str, str, bool]]) -> str | None:
    """The newest release among (version label, outcome, injected) cells whose outcome is a verdict; cells of a
    fault-injected run say nothing about upstream vLLM and are left out."""
    judged = [(v, label) for label, outcome, injected in cells
              if not injected and category(outcome) in VERDICT_CATEGORIES and (v := release_of(label)) is not None]
    return max(judged)[1] if judged else None


def judged_from(history: Path | None, results: Sequence[Path]) -> Judged:
    """The newest release judged in a history file and results files (ResultsFileError names an unreadable one)."""
    from harness.verdicts.history.store import read_history
    from harness.verdicts.results import read_results

    cells: list[tuple[str, str, bool]] = []
    sources: list[str] = []
    if history is not None:
        hist = read_history(history)
        cells += [(c.version, c.outcome, bool(run.inject or c.inject)) for run in hist.runs for c in run.cells]
        sources.append(f"{history} ({len(hist.runs)} runs)")
    for path in results:
        res = read_results(path)
        injected = bool(res.meta.get("inject"))
        cells += [(str(c.cell.version), c.outcome.value, injected or bool(c.engine and c.engine.inject))
                  for c in res.cells]
        sources.append(f"{path} ({len(res.cells)} cells)")
    return Judged(newest_judged(cells), tuple(sources))


def newer_releases(judged: str, package: str, index_url: str | None, fetch: Fetch, pre: bool = False,
                   machine: str | None = None) -> tuple[str | None, tuple[str, ...]]:
    """(the index's newest release for this machine, the releases newer than ``judged``, oldest first).  BadInput
    (from the index) when it cannot be listed."""
    floor = release_of(judged)
    if floor is None:
        raise ValueError(f"{judged!r} is no release")
    available = candidate_versions(package, index_url, pre, fetch, machine)
    newer = tuple(v for v in available if (r := release_of(v)) is not None and r > floor)
    return (available[-1] if available else None), newer
