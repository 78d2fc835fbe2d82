"""The workaround ledger: each workaround's demonstrating cell, and per version whether it is still needed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.errors import BadInput
from harness.matrix import EXECUTORS, MODES, Cell
from harness.report import WorkaroundStatus, WorkaroundVerdict, judge_pair, version_key
from harness.results import CellResult
from harness.tomlfile import load_table

_CELL_FIELDS = {"executor": str, "async_scheduling": bool, "mode": str, "clear_cache": bool}


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

    def cells(self, version: str) -> tuple[Cell, Cell]:
        """(without the workaround, with it) at ``version``."""
        c = self.cell
        without = Cell(version, c["executor"], c["async_scheduling"], c["mode"], c["clear_cache"])
        a = self.applied
        with_ = replace(
            without,
            executor=a.get("executor", without.executor),
            async_on=a.get("async_scheduling", without.async_on),
            mode=a.get("mode", without.mode),
            clear_cache=a.get("clear_cache", without.clear_cache),
        )
        return without, with_

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
    for key, value in table.items():
        if key not in _CELL_FIELDS:
            raise BadInput(f"{where}: unknown cell key {key!r}; valid: {', '.join(_CELL_FIELDS)}")
        if not isinstance(value, _CELL_FIELDS[key]):
            raise BadInput(f"{where}: {key} = {value!r} should be a {_CELL_FIELDS[key].__name__}")
    if required:
        missing = set(_CELL_FIELDS) - set(table)
        if missing:
            raise BadInput(f"{where}: cell lacks {sorted(missing)}")
    if table.get("executor", "mp") not in EXECUTORS:
        raise BadInput(f"{where}: executor {table['executor']!r}; valid: {', '.join(EXECUTORS)}")
    if table.get("mode", "keep") not in MODES:
        raise BadInput(f"{where}: mode {table['mode']!r}; valid: {', '.join(MODES)}")


def load_ledger(path: Path | None = None) -> tuple[Workaround, ...]:
    """Parse the ledger (default: the ``workarounds.toml`` shipped with vllm-repro)."""
    data, where = load_table(path, "workarounds.toml", "workaround ledger")
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
