"""The known-bug table: what each cell is expected to show, so a run can say "as expected" or "UNEXPECTED"."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from harness.errors import BadInput
from harness.matrix import Cell
from harness.oracle import Outcome
from harness.results import CellResult
from harness.tomlfile import load_table

_CELL_KEYS = {"async_scheduling", "mode", "clear_cache", "executor", "executors"}


@dataclass(frozen=True)
class KnownBug:
    id: str
    title: str
    fix: str
    fixed_in: str
    affected: SpecifierSet
    cells: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Expectation:
    outcome: Outcome
    k: int | None = None
    bug: str | None = None  # the known bug that makes this cell fail, if any

    @property
    def label(self) -> str:
        return f"{self.outcome.value}({self.k})" if self.k is not None else self.outcome.value


@dataclass(frozen=True)
class Check:
    """How a cell's result compares with its expectation."""

    status: str  # "as expected", "UNEXPECTED", "not run"
    expected: Expectation
    message: str


def load_known_bugs(path: Path | None = None) -> tuple[KnownBug, ...]:
    """Parse the known-bug TOML (default: the table shipped with vllm-repro)."""
    data, where = load_table(path, "known_bugs.toml", "known-bug table")
    bugs = []
    for i, b in enumerate(data.get("bug", [])):
        try:
            affected = SpecifierSet(b["affected"])
            cells = tuple(b.get("cells", []))
            for c in cells:
                unknown = set(c) - _CELL_KEYS - {"expect", "k"}
                if unknown:
                    raise BadInput(f"{where}: bug {b.get('id')!r} has unknown cell keys {sorted(unknown)}")
                Outcome(c["expect"])
            bugs.append(KnownBug(b["id"], b.get("title", ""), b.get("fix", ""), b.get("fixed_in", ""), affected,
                                 cells))
        except (KeyError, InvalidSpecifier, ValueError, TypeError) as exc:
            raise BadInput(f"{where}: bug #{i + 1} is malformed ({exc!r})") from exc
    return tuple(bugs)


def _matches(rule: dict[str, Any], cell: Cell) -> bool:
    if "async_scheduling" in rule and rule["async_scheduling"] != cell.async_on:
        return False
    if "mode" in rule and rule["mode"] != cell.mode:
        return False
    if "clear_cache" in rule and rule["clear_cache"] != cell.clear_cache:
        return False
    if "executor" in rule and rule["executor"] != cell.executor:
        return False
    return not ("executors" in rule and cell.executor not in rule["executors"])


def expectation(cell: Cell, bugs: tuple[KnownBug, ...]) -> Expectation:
    """The outcome ``cell`` should show given the known bugs (OK when none applies)."""
    try:
        version = Version(cell.version)
    except ValueError:
        return Expectation(Outcome.OK)
    for bug in bugs:
        if not bug.affected.contains(version, prereleases=True):
            continue
        for rule in bug.cells:
            if _matches(rule, cell):
                return Expectation(Outcome(rule["expect"]), rule.get("k"), bug.id)
    return Expectation(Outcome.OK)


def check(result: CellResult, bugs: tuple[KnownBug, ...]) -> Check:
    """Compare a cell result with the known-bug table."""
    exp = expectation(result.cell, bugs)
    if result.outcome.is_infra:
        return Check("not run", exp, f"{result.outcome.value}: {result.reason or result.summary}")
    if exp.outcome is Outcome.OK:
        if result.outcome is Outcome.OK:
            return Check("as expected", exp, "OK, as expected")
        return Check("UNEXPECTED", exp, f"expected OK, got {result.summary}")
    # Expected a fault: every request running at the pause shows exactly it; the rest are OK.
    problems = []
    for req in result.requests:
        v = req.get("verdict") or {}
        want = exp.label if v.get("running_at_pause") else "OK"
        got = v.get("outcome", "?") if v.get("k") is None else f"{v.get('outcome')}({v.get('k')})"
        if got != want:
            problems.append(f"{req.get('rid')}: expected {want}, got {v.get('label', got)}")
    if not problems and result.outcome is exp.outcome:
        return Check("as expected", exp, f"{result.summary}, as expected from {exp.bug}")
    shown = "; ".join(problems[:4]) or f"got {result.summary}"
    return Check("UNEXPECTED", exp, f"expected {exp.label} from {exp.bug} in requests running at pause: {shown}")


def annotate(result: CellResult, bugs: tuple[KnownBug, ...]) -> CellResult:
    """``result`` with its known-bug comparison attached (``CellResult.expectation``)."""
    c = check(result, bugs)
    return replace(result, expectation={"status": c.status, "expected": c.expected.label, "bug": c.expected.bug,
                                        "message": c.message})
