"""Per framework and vLLM release: is the framework's sequence safe there, and can its workaround go?

Read from the results of the recipes' cells (harness.verdicts.frameworks); a release is SAFE for a framework
when every cell of its sequence came out OK, UNSAFE when one lost, repeated or shifted tokens (or crashed
vLLM), and UNKNOWN otherwise (a cell UNSUPPORTED, ERROR, TIMEOUT, AMBIGUOUS or not run), with the reason.  The
workaround verdict is the ledger's own (harness.verdicts.workarounds.judge): async on vs the workaround.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from harness.core.oracle import Outcome
from harness.core.versions import version_key
from harness.verdicts.frameworks import REQUESTS, SEQUENCE, STALE_KV, STAND_IN, CompiledCell, Recipe, recipe_cells
from harness.verdicts.results import CellResult
from harness.verdicts.workarounds import LedgerCheck, judge

_VALUES = {o.value for o in Outcome}


class Safety(enum.Enum):
    SAFE = "SAFE"  # every cell of the sequence OK
    UNSAFE = "UNSAFE"  # a cell lost, repeated or shifted tokens, or vLLM crashed
    UNKNOWN = "UNKNOWN"  # a cell could not say (UNSUPPORTED, ERROR, TIMEOUT, AMBIGUOUS, not run)


@dataclass(frozen=True)
class CellOutcome:
    """One compiled cell and what it came out as (``NOT RUN`` when no result names it)."""

    compiled: CompiledCell
    outcome: str
    detail: str  # the result's summary, or its reason when it produced no streams
    expectation: str = ""  # what the known-bug table says of it: "as expected (vllm#42043)", "UNEXPECTED (...)"

    @property
    def why(self) -> str:
        """Why the cell came out as it did, as far as the known-bug table knows: the bug that predicts it, an
        outcome no known bug predicts, or that no known bug covers the cell on this release."""
        e = self.expectation
        if e.startswith("as expected ("):
            return f"predicted by {e[len('as expected ('):-1]}"
        if e == "as expected":
            return "no known bug covers this cell on this release"
        return e

    @property
    def label(self) -> str:
        """``weight_sync-keep-clear`` (with ``[server]`` on the server door)."""
        cell = self.compiled.cell
        door = "" if cell.door == "engine" else f"[{cell.door}]"
        return f"{cell.scenario_id}{door}"


@dataclass(frozen=True)
class ReleaseVerdict:
    """One framework on one release: its sequence's safety, and the engine-door stand-in's when it has one."""

    version: str
    allowed: bool  # the framework's pin allows this release
    safety: Safety
    cells: tuple[CellOutcome, ...]
    stand_in: Safety | None
    stand_in_cells: tuple[CellOutcome, ...]
    # Issue 37: the stale-kv cells of its update sequence that a result names (outcome STALE-KV, OK, ...); not part
    # of ``safety``, which is about tokens lost, repeated or shifted around the pause.
    stale_kv: tuple[CellOutcome, ...] = ()
    # Issue 34: its cells sending the framework's kind of requests (sampled, logprobs judged) that a result names;
    # beside ``safety`` as the stale-kv cells are.
    requests: tuple[CellOutcome, ...] = ()


@dataclass(frozen=True)
class FrameworkCheck:
    recipe: Recipe
    releases: tuple[ReleaseVerdict, ...]  # oldest first
    workaround: LedgerCheck | None

    @property
    def safe_on(self) -> tuple[str, ...]:
        return tuple(r.version for r in self.releases if r.safety is Safety.SAFE)

    @property
    def stand_in_safe_on(self) -> tuple[str, ...]:
        return tuple(r.version for r in self.releases if r.stand_in is Safety.SAFE)

    def first_safe_from_pin(self, stand_in: bool = False) -> str | None:
        """The first checked release at or after the pin's lowest allowed one whose sequence is SAFE (with
        ``stand_in``: whose engine-door stand-in is)."""
        floor = self.recipe.floor
        for r in self.releases:
            safe = (r.stand_in if stand_in else r.safety) is Safety.SAFE
            if safe and (floor is None or version_key(r.version) >= version_key(floor)):
                return r.version
        return None

    @property
    def checked_from_pin(self) -> tuple[str, ...]:
        """The checked releases at or after the pin's floor."""
        floor = self.recipe.floor
        return tuple(r.version for r in self.releases
                     if floor is None or version_key(r.version) >= version_key(floor))


def _faulty(cr: CellResult) -> bool:
    # A FLAKY cell faulted in some of its runs: unsafe (as the workaround ledger counts it).
    if cr.outcome is Outcome.FLAKY:
        return any(Outcome(o).is_finding for o in (cr.repeats.outcomes if cr.repeats else {}) if o in _VALUES)
    return cr.outcome.is_finding


def safety_of(results: Iterable[CellResult | None]) -> Safety:
    """SAFE if every result is OK, UNSAFE if one is a finding, else UNKNOWN (no results: UNKNOWN)."""
    rs = list(results)
    if any(r is not None and _faulty(r) for r in rs):
        return Safety.UNSAFE
    if rs and all(r is not None and r.outcome is Outcome.OK for r in rs):
        return Safety.SAFE
    return Safety.UNKNOWN


def _outcome(c: CompiledCell, by_id: dict[str, CellResult]) -> CellOutcome:
    r = by_id.get(c.cell.id)
    if r is None:
        return CellOutcome(c, "NOT RUN", "no result names this cell")
    detail = r.summary if r.outcome is Outcome.OK or r.outcome.is_finding else (r.reason or r.summary)
    return CellOutcome(c, r.outcome.value, detail, r.expectation.describe() if r.expectation is not None else "")


def release_verdict(recipe: Recipe, version: str, by_id: dict[str, CellResult],
                    stand_ins: bool = True) -> ReleaseVerdict:
    compiled = recipe_cells(recipe, version, stand_ins, stale_kv=True)
    seq = [c for c in compiled if c.role == SEQUENCE]
    sub = [c for c in compiled if c.role == STAND_IN]
    stale = [c for c in compiled if c.role == STALE_KV and c.cell.id in by_id]
    req = [c for c in compiled if c.role == REQUESTS and c.cell.id in by_id]
    return ReleaseVerdict(
        version, recipe.allows(version), safety_of(by_id.get(c.cell.id) for c in seq),
        tuple(_outcome(c, by_id) for c in seq),
        safety_of(by_id.get(c.cell.id) for c in sub) if sub else None, tuple(_outcome(c, by_id) for c in sub),
        tuple(_outcome(c, by_id) for c in stale), tuple(_outcome(c, by_id) for c in req))


def check_frameworks(recipes: Iterable[Recipe], versions: Iterable[str] | Mapping[str, Iterable[str]],
                     results: Iterable[CellResult], stand_ins: bool = True) -> tuple[FrameworkCheck, ...]:
    """Each recipe's verdict per release (sorted numerically) and on its workaround, from ``results`` (a later
    result for the same cell id replaces an earlier one); ``versions`` by recipe name gives each its own."""
    rs = list(results)
    by_id = {r.id: r for r in rs}
    common = () if isinstance(versions, Mapping) else tuple(versions)
    out = []
    for recipe in recipes:
        vs = sorted(set(versions[recipe.name] if isinstance(versions, Mapping) else common), key=version_key)
        releases = tuple(release_verdict(recipe, v, by_id, stand_ins) for v in vs)
        w = recipe.workaround
        out.append(FrameworkCheck(recipe, releases, judge(w, vs, rs) if w is not None else None))
    return tuple(out)


def versions_with_results(recipes: Iterable[Recipe], results: Iterable[CellResult],
                          stand_ins: bool = True) -> dict[str, tuple[str, ...]]:
    """Per recipe, the releases ``results`` hold at least one of its cells for (what ``frameworks report`` shows:
    a run that checked each framework at its own pin leaves the others' columns out, not NOT RUN)."""
    rs = list(results)
    ids = {r.id for r in rs}
    versions = sorted({r.cell.version for r in rs}, key=version_key)
    return {recipe.name: tuple(v for v in versions
                               if any(c.cell.id in ids for c in recipe_cells(recipe, v, stand_ins)))
            for recipe in recipes}
