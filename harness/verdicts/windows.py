"""The bug windows: every known-bug row x every vLLM release measured, and where bisects put its boundaries.

A row is one cell rule of one known bug (harness/verdicts/known_bugs.toml): the cells it covers and the outcome it
expects inside its ``affected`` window.  A column is a release some committed report ran a cell of.  Each box
holds what the reports measured for that row's cells on that release; a bisect log whose cell the row covers,
and whose answer is that row's edge (the last probe before it inside the window, the answer outside it, or the
other way round), marks the row's first bad or first fixed release.  Pure: reading the files is
:func:`load`'s alone; ``harness.verdicts.windows_plot`` draws a :class:`Chart`.
"""

from __future__ import annotations

import json
import lzma
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.core.cell import cell_from_dict
from harness.core.errors import BadInput, ResultsFileError
from harness.core.oracle import Outcome
from harness.core.outcome_groups import Category, category
from harness.core.records import CellResult
from harness.core.versions import version_key
from harness.verdicts.known_bugs import KnownBug, Rule
from harness.verdicts.results import inner_suffix, read_bytes, read_results

BISECT_SCHEMA = "vllm-repro/bisect"
REPORT_SCHEMAS = ("vllm-repro/results", "vllm-repro/cell")


@dataclass(frozen=True)
class Bisect:
    """What one bisect log found: ``first_new`` is the first bad (regression) or first fixed (fix) release."""

    find: str  # "regression" or "fix"
    cell: Any  # the cell probed (its version is the first probe's)
    last_old: str | None
    first_new: str | None
    source: str = ""


@dataclass(frozen=True)
class Row:
    bug: str
    title: str
    rule: Rule
    affected: str  # the known-bug window, a PEP 440 specifier
    fixed_in: str
    platforms: tuple[str, ...] = ()  # the bug's platforms (KnownBug.platforms): only their cells are its boxes

    @property
    def label(self) -> str:
        k = f"({self.rule.k})" if self.rule.k is not None else ""
        on = f" [{', '.join(self.platforms)} only]" if self.platforms else ""
        return f"{self.bug}: {self.rule.pattern.text} -> {self.rule.expect.value}{k}{on}"


@dataclass(frozen=True)
class Box:
    """What the committed reports measured for one row on one release (``outcome`` None: nothing ran)."""

    outcome: str | None
    outcomes: tuple[tuple[str, int], ...] = ()  # every outcome seen, with how many cells showed it
    in_window: bool = False

    @property
    def category(self) -> Category:
        return category(self.outcome)

    @property
    def mixed(self) -> bool:
        """Both a finding and OK were measured (different executors, models, platforms ...)."""
        seen = {category(o) for o, _ in self.outcomes}
        return Category.TOKEN_FAULT in seen and Category.OK in seen


@dataclass(frozen=True)
class Chart:
    rows: tuple[Row, ...]
    releases: tuple[str, ...]
    boxes: tuple[tuple[Box, ...], ...]  # [row][release]
    first_bad: tuple[tuple[str, ...], ...]  # per row: the releases bisects named first bad
    first_fixed: tuple[tuple[str, ...], ...]  # per row: the releases bisects named first fixed
    reports: int = 0
    bisects: int = 0


def rows_of(bugs: Iterable[KnownBug]) -> tuple[Row, ...]:
    """One row per cell rule of every known bug, in the table's order.  A ``sometimes`` rule (a crash that holds only
    in runs that met it: harness.verdicts.known_bugs) has no window to draw and is left out."""
    return tuple(Row(b.id, b.title, r, str(b.affected), b.fixed_in, b.platforms)
                 for b in bugs for r in b.cells if not r.sometimes)


def _inside(row: Row, version: str | None) -> bool:
    if version is None:
        return False
    try:
        return Version(version) in _specifier(row)
    except InvalidVersion:
        return False


def _specifier(row: Row) -> Any:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(row.affected, prereleases=True)


def box_of(row: Row, release: str, results: Iterable[CellResult]) -> Box:
    """The outcome shown for ``row`` on ``release``: a finding if any cell showed one (the most frequent),
    else OK, else whatever the cells came out as (UNSUPPORTED, ERROR, ...); None when no cell ran."""
    seen = Counter(r.outcome.value for r in results
                   if r.cell.version == release and row.rule.pattern.matches(r.cell) and _on_platform(row, r))
    shown: str | None = None
    for wanted in (lambda o: Outcome(o).is_finding, lambda o: o == Outcome.OK.value, lambda o: True):
        picks = [o for o, _ in seen.most_common() if _known(o) and wanted(o)]
        if picks:
            shown = picks[0]
            break
    return Box(shown, tuple(sorted(seen.items())), _inside(row, release))


def _on_platform(row: Row, result: CellResult) -> bool:
    """A platform-bound bug's box counts only cells whose engine reported one of its platforms (a GPU's OK says
    nothing about vLLM's CPU worker)."""
    if not row.platforms:
        return True
    return result.engine is not None and result.engine.platform in row.platforms


def _known(outcome: str) -> bool:
    return outcome in {o.value for o in Outcome}


def boundaries(row: Row, bisects: Iterable[Bisect]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The first-bad and first-fixed releases of the bisects that ran ``row``'s cells and found its edges."""
    bad, fixed = set(), set()
    for b in bisects:
        if b.first_new is None or not row.rule.pattern.matches(b.cell):
            continue
        old_in, new_in = _inside(row, b.last_old), _inside(row, b.first_new)
        if b.find == "regression" and new_in and not old_in:
            bad.add(b.first_new)
        elif b.find == "fix" and old_in and not new_in:
            fixed.add(b.first_new)
    return tuple(sorted(bad, key=version_key)), tuple(sorted(fixed, key=version_key))


def build(bugs: Iterable[KnownBug], results: Iterable[CellResult], bisects: Iterable[Bisect] = (),
          reports: int = 0) -> Chart:
    """The chart's data: rows x releases (every release a result ran, plus every bisect boundary)."""
    rows, results, bisects = rows_of(bugs), tuple(results), tuple(bisects)
    edges = [boundaries(r, bisects) for r in rows]
    releases = {r.cell.version for r in results} | {v for bad, fixed in edges for v in (*bad, *fixed)}
    columns = tuple(sorted((v for v in releases if _is_release(v)), key=version_key))
    boxes = tuple(tuple(box_of(row, v, results) for v in columns) for row in rows)
    return Chart(rows, columns, boxes, tuple(b for b, _ in edges), tuple(f for _, f in edges), reports,
                 len(bisects))


def _is_release(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False  # a commit or a local build: not a release column
    return True


# --------------------------------------------------------------------------- reading the committed files


def _document(path: Path) -> Any:
    text = read_bytes(path).decode("utf-8")
    return json.loads(text.splitlines()[0] if ".jsonl" in path.suffixes else text)


def bisect_of(doc: dict[str, Any], source: str = "") -> Bisect | None:
    """A bisect log's answer and cell; None when it probed nothing."""
    cells = [p["cell"]["cell"] for p in doc.get("probes") or [] if isinstance(p.get("cell"), dict)]
    if not cells:
        return None
    cell = cell_from_dict(cells[0])
    return Bisect(str(doc.get("find")), cell, doc.get("last_old"), doc.get("first_new"), source)


def load(dirs: Iterable[Path]) -> tuple[list[CellResult], list[Bisect], int]:
    """Every cell result of every report (and JSONL log) under ``dirs``, every bisect log, and how many
    reports were read.  Other JSON files (history, wheelhouse manifests) are skipped."""
    results: list[CellResult] = []
    bisects: list[Bisect] = []
    reports = 0
    for d in dirs:
        if not d.is_dir():
            raise BadInput(f"--results {d}: not a folder")
        for path in sorted(d.rglob("*.json*")):
            if inner_suffix(path) not in (".json", ".jsonl"):
                continue
            try:
                doc = _document(path)
            except (OSError, ValueError, EOFError, lzma.LZMAError) as exc:
                raise ResultsFileError(f"cannot read {path}: {exc}") from exc
            schema = doc.get("schema") if isinstance(doc, dict) else None
            if schema in REPORT_SCHEMAS:
                results.extend(read_results(path).cells)
                reports += 1
            elif schema == BISECT_SCHEMA and (b := bisect_of(doc, str(path))) is not None:
                bisects.append(b)
    return results, bisects, reports
