"""The known-bug table: what each cell is expected to show, so a run can say "as expected" or "UNEXPECTED".

A rule expecting LOSS or DUPLICATE with ``k`` means one such fault event of ``k`` tokens per pause, at the
pause index, in every request running at that pause (``harness.core.oracle.running_pauses``), and no other fault
anywhere: a request running at two keep + clear_cache pauses of an affected vLLM shows ``LOSS(1 at 6; 1 at
18)``.  A rule expecting CRASH is met by a cell that crashed (vLLM's own code raised), one expecting STALL by a
cell whose scheduler stopped making progress; any other outcome is met when every request running at a pause
shows it.

A bug may name the ``platforms`` it shows on (vLLM's CPU worker only, say): elsewhere, or where the platform is not
known (no engine report), it does not apply.  A CRASH rule may name the ``message`` the crash must carry, and a
rule marked ``sometimes`` holds only in runs that crashed with that message (a timing-dependent crash): its cells
are otherwise judged as if it were not there, and a cell that did crash so is a ``known crash`` (explained, not
UNEXPECTED), whatever the cell expects otherwise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import SHIFTS, FaultEvent, Outcome, events_label, running_pauses
from harness.core.pattern import CellPattern, pattern_from_mapping
from harness.core.records import ExpectationRecord, RequestRecord, RequestVerdictRecord
from harness.core.scenarios import pauses as scenario_pauses
from harness.core.scenarios import scenario as scenario_of
from harness.core.schema import found, validate
from harness.verdicts.file_schemas import KNOWN_BUG, known_bugs_schema
from harness.verdicts.results import CellResult
from harness.verdicts.tomlfile import load_table

# Outcomes judged on the cell alone: the scenario ended there, so its requests' streams say nothing more.
_WHOLE_CELL = (Outcome.CRASH, Outcome.STALL)

# A rule's keys: any axis name (harness.core.cell.Cell), "executors" (a list; older tables), expect and k.
_RULE_KEYS = {"expect", "k", "message", "sometimes"}
# The status of a cell that crashed the way a ``sometimes`` rule says (neither "as expected" nor UNEXPECTED).
KNOWN_CRASH = "known crash"


@dataclass(frozen=True)
class Rule:
    """Cells matching ``pattern`` show ``expect`` (with ``k`` tokens per request for LOSS/DUPLICATE)."""

    pattern: CellPattern
    expect: Outcome
    k: int | None = None
    message: str = ""  # the words a CRASH must carry ("" = any crash)
    sometimes: bool = False  # holds only in runs that crashed with ``message`` (timing)


@dataclass(frozen=True)
class KnownBug:
    id: str
    title: str
    fix: str
    fixed_in: str
    affected: SpecifierSet
    cells: tuple[Rule, ...]
    note: str = ""  # why the window is what it is (shown where two tiers' windows differ: harness.verdicts.compare)
    platforms: tuple[str, ...] = ()  # the platforms it shows on (engine report's "platform"); () = every one

    def applies(self, version: Version, platform: str | None) -> bool:
        """Whether the bug is in ``version`` on ``platform`` (a platform-bound bug needs a known platform)."""
        if self.platforms and platform not in self.platforms:
            return False
        return self.affected.contains(version, prereleases=True)


@dataclass(frozen=True)
class Expectation:
    outcome: Outcome
    k: int | None = None
    bug: str | None = None  # the known bug that makes this cell fail, if any
    message: str = ""  # the words its CRASH must carry ("" = any)

    @property
    def label(self) -> str:
        return f"{self.outcome.value}({self.k})" if self.k is not None else self.outcome.value


@dataclass(frozen=True)
class Check:
    """How a cell's result compares with its expectation."""

    status: str  # "as expected", "UNEXPECTED", "not run", "inconclusive" (AMBIGUOUS: the streams cannot tell)
    expected: Expectation
    message: str


def load_known_bugs(path: Path | None = None, cell_type: type[Cell] = Cell) -> tuple[KnownBug, ...]:
    """Parse the known-bug TOML (default: the table shipped with vllm-repro); rules name ``cell_type``'s axes."""
    data, where = load_table(path, "known_bugs.toml", "known-bug table")
    validate(known_bugs_schema(cell_type), data, where)
    bugs = []
    for i, b in enumerate(data.get("bug", [])):
        try:
            affected = SpecifierSet(b["affected"])
        except InvalidSpecifier:
            raise BadInput(f"{where}: bug[{i}].affected: expected {KNOWN_BUG.fields['affected'].expected}, found "
                           f"{found(b['affected'])}") from None
        try:
            rules = tuple(_rule(c, f"{where}: bug {b.get('id')!r}", cell_type) for c in b.get("cells", []))
            bugs.append(KnownBug(b["id"], b.get("title", ""), b.get("fix", ""), b.get("fixed_in", ""), affected,
                                 rules, str(b.get("note", "")), tuple(b.get("platforms", ()))))
        except (KeyError, InvalidSpecifier, ValueError, TypeError) as exc:
            raise BadInput(f"{where}: bug #{i + 1} is malformed ({exc!r})") from exc
    return tuple(bugs)


def _rule(table: dict[str, Any], where: str, cell_type: type[Cell] = Cell) -> Rule:
    unknown = set(table) - set(cell_type.table().by_name) - _RULE_KEYS - {"executors"}
    if unknown:
        raise BadInput(f"{where} has unknown cell keys {sorted(unknown)}")
    axes = {("executor" if k == "executors" else k): v for k, v in table.items() if k not in _RULE_KEYS}
    rule = Rule(pattern_from_mapping(axes, where, cell_type), Outcome(table["expect"]), table.get("k"),
                str(table.get("message", "")), bool(table.get("sometimes", False)))
    if (rule.message or rule.sometimes) and rule.expect is not Outcome.CRASH:
        raise BadInput(f"{where}: message and sometimes belong to a rule expecting CRASH, not {rule.expect.value}")
    if rule.sometimes and not rule.message:
        raise BadInput(f"{where}: a sometimes rule names the message its crash carries")
    return rule


def expectation(cell: Any, bugs: tuple[KnownBug, ...], platform: str | None = None) -> Expectation:
    """The outcome ``cell`` should show on ``platform`` given the known bugs (OK when none applies); ``sometimes``
    rules do not say what a cell shows (see :func:`known_crash`)."""
    try:
        version = Version(cell.version)
    except ValueError:
        return Expectation(Outcome.OK)
    for bug in bugs:
        if not bug.applies(version, platform):
            continue
        for rule in bug.cells:
            if not rule.sometimes and rule.pattern.matches(cell):
                return Expectation(rule.expect, rule.k, bug.id, rule.message)
    return Expectation(Outcome.OK)


def known_crash(result: CellResult, bugs: tuple[KnownBug, ...], platform: str | None) -> KnownBug | None:
    """The bug whose ``sometimes`` rule explains ``result``'s CRASH (its message in the crash's reason), or None."""
    if result.outcome is not Outcome.CRASH:
        return None
    try:
        version = Version(result.cell.version)
    except ValueError:
        return None
    said = f"{result.reason or ''} {result.summary}"
    for bug in bugs:
        if bug.applies(version, platform) and any(
                r.sometimes and r.message in said and r.pattern.matches(result.cell) for r in bug.cells):
            return bug
    return None


def check(result: CellResult, bugs: tuple[KnownBug, ...]) -> Check:
    """Compare a cell result with the known-bug table."""
    platform = result.engine.platform if result.engine is not None else None
    exp = expectation(result.cell, bugs, platform)
    if result.outcome.is_infra:
        return Check("not run", exp, f"{result.outcome.value}: {result.reason or result.summary}")
    if result.outcome is Outcome.AMBIGUOUS:
        return Check("inconclusive", exp, f"expected {exp.label}; the streams cannot tell: "
                                          f"{result.reason or result.summary}")
    if exp.outcome is not Outcome.CRASH and (crash := known_crash(result, bugs, platform)) is not None:
        return Check(KNOWN_CRASH, replace(exp, bug=crash.id),
                     f"{result.summary}: known crash, {crash.title} (expected {exp.label} had it not crashed)")
    if exp.outcome is Outcome.OK:
        if result.outcome is Outcome.OK:
            return Check("as expected", exp, "OK, as expected")
        return Check("UNEXPECTED", exp, f"expected OK, got {result.summary}")
    if exp.outcome in _WHOLE_CELL:
        # A crash or a stall ends the scenario: its requests are whatever came before; the cell's outcome is
        # the verdict.
        said = f"{result.reason or ''} {result.summary}"
        if result.outcome is exp.outcome and exp.message in said:
            return Check("as expected", exp, f"{result.summary}, as expected from {exp.bug}")
        wanted = f" ({exp.message!r})" if exp.message else ""
        return Check("UNEXPECTED", exp, f"expected {exp.outcome.value}{wanted} from {exp.bug}, got {result.summary}")
    # Expected a fault: every request running at a pause shows exactly it (per pause); the rest are OK.
    # A cell with no pause and no in-flight operation (vllm#52461's logitsproc) has no "running at pause" to
    # narrow a whole-stream fault (DIVERGED) to: every request is expected to show it.
    every = not scenario_pauses(result.cell.scenario) and not any(
        req.verdict is not None and req.verdict.running_at_pause for req in result.requests)
    # A scenario may name the records such a fault shows in instead (connector-stale: its "-kv" records).
    shape = scenario_of(result.cell.scenario)
    suffix = shape.fault_records if shape is not None else ""
    # Only a scenario that never pauses names where a shift shows (kv-load-recompute: f0); in a pausing one the
    # named records are those of its whole-stream fault (stale-kv's "-shared"), while a shift (vllm#42043's LOSS
    # of the requests kept across the pause) shows in the requests running at the pause.
    shift_suffix = "" if scenario_pauses(result.cell.scenario) else suffix
    problems = [p for req in result.requests
                if (p := _request_problem(req, exp, every, suffix, shift_suffix)) is not None]
    if not problems and result.outcome is exp.outcome:
        return Check("as expected", exp, f"{result.summary}, as expected from {exp.bug}")
    shown = "; ".join(problems[:4]) or f"got {result.summary}"
    return Check("UNEXPECTED", exp, f"expected {exp.label} from {exp.bug} in requests running at pause: {shown}")


def _request_problem(req: RequestRecord, exp: Expectation, every: bool = False, suffix: str = "",
                     shift_suffix: str = "") -> str | None:
    """Why one request does not show what ``exp`` expects of it, or None when it does."""
    v = req.verdict or RequestVerdictRecord("?")
    if v.outcome == Outcome.AMBIGUOUS.value:
        return None  # proves nothing either way; the cell's other requests decide
    # A pause in abort mode ends the request there: it has no token after it to lose (the sleep scenario's
    # level-2 sleep aborts the requests its level-1 sleep kept).
    at = Counter(p.client_tokens for p in running_pauses(req.pauses)
                 if p.client_tokens is not None and p.mode != "abort")
    if exp.outcome not in SHIFTS:
        subject = (req.rid or "").endswith(suffix) if suffix else v.running_at_pause or every
        want = exp.label if subject else "OK"
        return None if v.short == want else f"{req.rid}: expected {want}, got {v.label or v.short}"
    if not at and shift_suffix:  # no pause: the scenario names the records the shift shows in (kv-load-recompute)
        want = exp.label if (req.rid or "").endswith(shift_suffix) else "OK"
        return None if v.short == want else f"{req.rid}: expected {want}, got {v.label or v.short}"
    if not at:
        return None if v.outcome == Outcome.OK.value else f"{req.rid}: expected OK, got {v.label or v.short}"
    fits = v.outcome == exp.outcome.value and [e.at for e in v.events] == sorted(at) and all(
        e.kind is exp.outcome and _k_fits(e, exp.k, at[e.at]) for e in v.events)
    if fits:
        return None
    # Two pauses at one index (no token delivered in between) lose k or up to k per pause there (measured on
    # 0.21.0: the second discard is absorbed when a frame was in flight; tests/integration/test_schedules.py).
    want = events_label([FaultEvent(exp.outcome, exp.k or 1, i) for i in sorted(at)])
    return f"{req.rid}: expected {want}, got {v.label or v.short}"


def _k_fits(event: FaultEvent, k: int | None, pauses_here: int) -> bool:
    if k is None:
        return True
    return k <= event.k <= k * pauses_here


def annotate(result: CellResult, bugs: tuple[KnownBug, ...]) -> CellResult:
    """``result`` with its known-bug comparison attached (``CellResult.expectation``)."""
    c = check(result, bugs)
    return replace(result, expectation=ExpectationRecord(c.status, c.expected.label, c.expected.bug, c.message))
