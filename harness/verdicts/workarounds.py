"""Workarounds: the ledger (each workaround's demonstrating cell) and the judgement, per version, of
whether a workaround is NEEDED, REMOVABLE or BROKEN.

The matrix's own verdict judges the upstream advice for vLLM #42043 (``async_scheduling=False``) from the
keep-mode ``clear_cache=True`` cells with async on and off; the ledger generalises it to any workaround
whose effect is a change of cell settings.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.core.axes import REQUESTS
from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome
from harness.core.pattern import pattern_from_mapping
from harness.core.schema import validate
from harness.core.versions import version_key
from harness.verdicts.file_schemas import LEDGER
from harness.verdicts.results import CellResult, Results
from harness.verdicts.tomlfile import load_table

INFRA = tuple(o for o in Outcome if o.is_infra)
# Cells whose streams cannot decide the workaround either way: no verdict, UNKNOWN.
NO_VERDICT = (*INFRA, Outcome.AMBIGUOUS)
# The ledger's demonstrating cell must name these; any other axis may be named too (tp, scenario, ...).
_REQUIRED = ("executor", "async_scheduling", "mode", "clear_cache")


class WorkaroundStatus(enum.Enum):
    NEEDED = "NEEDED"  # token fault with async on, OK with async off
    REMOVABLE = "REMOVABLE"  # OK with async on and off
    BROKEN = "BROKEN"  # token fault even with async off
    UNKNOWN = "UNKNOWN"  # a cell is missing or did not produce token streams


STATUS_STYLES = {
    WorkaroundStatus.NEEDED: "bold red",
    WorkaroundStatus.REMOVABLE: "green",
    WorkaroundStatus.BROKEN: "bold magenta",
    WorkaroundStatus.UNKNOWN: "yellow",
}


@dataclass(frozen=True)
class WorkaroundVerdict:
    version: str
    status: WorkaroundStatus
    evidence: str  # e.g. "LOSS(1) in 8/10 requests (...) of cell ...; async off: OK"
    cell_ids: tuple[str, ...] = ()  # the async-on / async-off cells the verdict rests on
    executor: str | None = None
    request: str = "greedy"  # the request kind (issue 34) both cells sent: one verdict per version and kind

    @property
    def where(self) -> str:
        """``0.21.0``, or ``0.21.0 sampled`` for a request kind other than greedy."""
        return self.version if self.request == "greedy" else f"{self.version} {self.request}"


def _is_demo(cr: CellResult) -> bool:
    return cr.cell.mode == "keep" and cr.cell.clear_cache and cr.cell.scenario == "pause"


_VALUES = {o.value for o in Outcome}


def judge_pair(
    version: str, executor: str, on: CellResult | None, off: CellResult | None,
    without: str = "async on", with_: str = "async off",
) -> WorkaroundVerdict:
    """Judge a workaround from the cell without it (``on``) and the cell with it (``off``).

    ``without``/``with_`` name the two settings in the evidence text (for
    vllm#42043: async on / async off).
    """
    ids = tuple(c.id for c in (on, off) if c is not None)

    def verdict(status: WorkaroundStatus, evidence: str) -> WorkaroundVerdict:
        return WorkaroundVerdict(version, status, evidence, ids, executor)

    def faulty(cr: CellResult | None) -> bool:
        # A FLAKY cell lost tokens in some of its runs: that counts as a loss here.
        if cr is None:
            return False
        if cr.outcome is Outcome.FLAKY:
            return any(Outcome(o).is_finding for o in (cr.repeats.outcomes if cr.repeats else {}) if o in _VALUES)
        return cr.outcome.is_finding

    def infra(cr: CellResult, side: str) -> WorkaroundVerdict:
        return verdict(WorkaroundStatus.UNKNOWN,
                       f"{side.replace(' ', '-')} cell {cr.id} is {cr.outcome.value}: {cr.reason or cr.summary}")

    if off is not None and faulty(off):
        if on is None:
            on_text = "not run"
        elif on.outcome is Outcome.OK:
            on_text = "OK"
        elif faulty(on):
            on_text = on.summary
        else:
            on_text = f"{on.outcome.value}: {on.reason or on.summary}"
        return verdict(WorkaroundStatus.BROKEN,
                       f"{off.summary} of cell {off.id} even with {with_}; {without}: {on_text}")
    if off is None and on is None:
        return verdict(WorkaroundStatus.UNKNOWN, "neither cell was run")
    if off is None:
        assert on is not None
        return verdict(WorkaroundStatus.UNKNOWN,
                       f"no {with_.replace(' ', '-')} keep-mode clear_cache=True cell to compare with {on.id}")
    if off.outcome in NO_VERDICT:
        return infra(off, with_)
    if on is None:
        return verdict(WorkaroundStatus.UNKNOWN,
                       f"no {without.replace(' ', '-')} keep-mode clear_cache=True cell to compare with {off.id}")
    if on.outcome in NO_VERDICT:
        return infra(on, without)
    if faulty(on):
        return verdict(WorkaroundStatus.NEEDED, f"{on.summary} of cell {on.id}; {with_}: OK")
    if Outcome.FLAKY in (on.outcome, off.outcome):
        flaky = on if on.outcome is Outcome.FLAKY else off
        return verdict(WorkaroundStatus.UNKNOWN, f"cell {flaky.id} is {flaky.summary}")
    return verdict(WorkaroundStatus.REMOVABLE, f"no token loss with {without} or {with_}")


def pair_key(cell: Cell) -> Cell:
    """The engine a cell's workaround pair shares: every engine axis but async (the workaround), and no scenario
    axes (the demonstrating cells share them).  Derived from the cell's own table, so an axis added there
    separates pairs by itself: cells that differ in any engine axis but async never judge each other."""
    table = type(cell).table()
    async_axis = table.by_name["async_scheduling"]
    keep = {a.attr: getattr(cell, a.attr) for a in table.engine if a is not async_axis}
    return type(cell)(**keep)


def _pair_rank(v: WorkaroundVerdict, key: Cell) -> tuple[Any, ...]:
    # The engine tier first: the workaround is an engine setting; the scheduler tier speaks for it only alone.
    # Then the pair whose engine axes are at their defaults (mp, tp 1, v1, ...), then report order.
    table = type(key).table()
    variant = [a for a in table.sort_order
               if a.engine and a.kind != "version" and a.name not in ("tier", "async_scheduling")]
    return (v.status is WorkaroundStatus.UNKNOWN, len(v.cell_ids) < 2, key.tier != table.by_name["tier"].default,
            *(getattr(key, a.attr) != a.default for a in variant), key.sort_key)


def workaround_verdicts(cells: Results | Iterable[CellResult]) -> tuple[WorkaroundVerdict, ...]:
    """Per vLLM version (sorted numerically), is ``async_scheduling=False`` needed against vllm#42043?

    Compares the keep-mode clear_cache=True cells with async on and off of one
    engine config (every engine axis but async: executor, TP, model runner, ...).
    Among engine configs, a conclusive pair wins over an inconclusive one; then the
    engine tier, then ``mp``, then tp=1 and so on (defaults first), then matrix order.
    A later result for the same cell id replaces an earlier one.
    """
    crs = tuple(cells.cells) if isinstance(cells, Results) else tuple(cells)
    versions = sorted({c.cell.version for c in crs}, key=version_key)
    out: list[WorkaroundVerdict] = []
    for version in versions:
        # One verdict per request kind (greedy first): a sampled pair never overwrites or judges a greedy one.
        kinds = sorted({_request(cr.cell) for cr in crs if cr.cell.version == version}, key=_request_rank)
        for kind in kinds:
            demo = [cr for cr in crs if cr.cell.version == version and _request(cr.cell) == kind and _is_demo(cr)]
            if demo or kind == "greedy":
                out.append(_version_verdict(version, kind, demo))
    return tuple(out)


def _request_rank(kind: str) -> tuple[int, str]:
    # The axis's order (harness.core.axes.REQUESTS); a kind this version does not know, last.
    return (REQUESTS.index(kind) if kind in REQUESTS else len(REQUESTS), kind)


def _request(cell: Cell) -> str:
    return str(getattr(cell, "request", "greedy"))


def _version_verdict(version: str, request: str, demo: list[CellResult]) -> WorkaroundVerdict:
    """The verdict of one version and request kind from its keep-mode clear_cache=True cells."""
    pairs: dict[Cell, dict[bool, CellResult]] = {}
    for cr in demo:
        pairs.setdefault(pair_key(cr.cell), {})[cr.cell.async_on] = cr
    if not pairs:
        return WorkaroundVerdict(version, WorkaroundStatus.UNKNOWN, "no keep-mode clear_cache=True cells",
                                 request=request)
    judged = [(judge_pair(version, _variant_label(key), p.get(True), p.get(False)), key) for key, p in pairs.items()]
    return replace(min(judged, key=lambda t: _pair_rank(*t))[0], request=request)


def _variant_label(key: Cell) -> str:
    # The label names the variant axes too (mp-mr_v2, mp-sched), so a verdict from a v2-only run says so.
    return "-".join((key.executor, *key.variant))


@dataclass(frozen=True)
class Workaround:
    id: str
    issue: str
    title: str
    location: str
    setting: str
    fix: str
    fixed_in: str
    cell: dict[str, Any]  # executor, async_scheduling, mode, clear_cache: the bug with the workaround off
    applied: dict[str, Any]  # the settings the workaround changes

    def cells(self, version: str) -> tuple[Any, Any]:
        """(without the workaround, with it) at ``version``."""
        without = pattern_from_mapping(self.cell, f"workaround {self.id} cell").template().at(version)
        changes = {type(without).table().by_name[k].attr: v for k, v in self.applied.items()}
        return without, without.replace(**changes)

    def _label(self, settings: dict[str, Any]) -> str:
        return ", ".join(f"{k}={v}" for k, v in settings.items())

    @property
    def labels(self) -> tuple[str, str]:
        """Names of the two settings, for evidence text ("async_scheduling=True" vs "...=False")."""
        without = {k: self.cell[k] for k in self.applied}
        return self._label(without), self._label(self.applied)


def _check_cell(where: str, table: Any, required: bool) -> None:
    if not isinstance(table, dict):
        raise BadInput(f"{where}: cell settings must be a TOML table, got {table!r}")
    pattern_from_mapping(table, where)  # names an unknown key or a bad value
    if any(isinstance(v, list) for v in table.values()):
        raise BadInput(f"{where}: a workaround names one value per cell key")
    if required:
        missing = set(_REQUIRED) - set(table)
        if missing:
            raise BadInput(f"{where}: cell lacks {sorted(missing)}")


def load_ledger(path: Path | None = None) -> tuple[Workaround, ...]:
    """Parse the ledger (default: the ``workarounds.toml`` shipped with vllm-repro)."""
    data, where = load_table(path, "workarounds.toml", "workaround ledger")
    validate(LEDGER, data, where)
    out = []
    for i, w in enumerate(data.get("workaround", [])):
        here = f"{where}: workaround #{i + 1} ({w.get('id', '?')})"
        try:
            _check_cell(here, w["cell"], required=True)
            _check_cell(here, w["applied"], required=False)
            if not w["applied"]:
                raise BadInput(f"{here}: [applied] changes nothing")
            out.append(Workaround(w["id"], w["issue"], w.get("title", ""), w.get("location", ""),
                                  w.get("setting", ""), w.get("fix", ""), w.get("fixed_in", ""),
                                  dict(w["cell"]), dict(w["applied"])))
        except KeyError as exc:
            raise BadInput(f"{here}: missing {exc.args[0]!r}") from exc
    if not out:
        raise BadInput(f"{where}: no [[workaround]] entries")
    return tuple(out)


@dataclass(frozen=True)
class LedgerCheck:
    workaround: Workaround
    verdicts: tuple[WorkaroundVerdict, ...]  # one per version, oldest first

    @property
    def first_removable(self) -> str | None:
        """The first version from which the workaround stays REMOVABLE through the newest checked."""
        first = None
        for v in self.verdicts:
            if v.status is WorkaroundStatus.REMOVABLE:
                first = first or v.version
            elif v.status is not WorkaroundStatus.UNKNOWN:
                first = None
        return first

    @property
    def consistency(self) -> str | None:
        """A note when the measured versions contradict the ledger's ``fixed_in``."""
        fixed = self.workaround.fixed_in
        if not fixed:
            return None
        for v in self.verdicts:
            before = version_key(v.version) < version_key(fixed)
            if before and v.status is WorkaroundStatus.REMOVABLE:
                return f"{v.version} is REMOVABLE although the ledger says fixed in {fixed}"
            if not before and v.status is WorkaroundStatus.NEEDED:
                return f"{v.version} still NEEDS the workaround although the ledger says fixed in {fixed}"
        return None


def judge(workaround: Workaround, versions: list[str], results: list[CellResult]) -> LedgerCheck:
    """Per version: NEEDED, REMOVABLE, BROKEN or UNKNOWN from the two cells' results."""
    by_id = {r.id: r for r in results}
    without_label, with_label = workaround.labels
    verdicts = []
    for v in sorted(versions, key=version_key):
        without, with_ = workaround.cells(v)
        verdicts.append(judge_pair(v, without.executor, by_id.get(without.id), by_id.get(with_.id),
                                   without=without_label, with_=with_label))
    return LedgerCheck(workaround, tuple(verdicts))
