"""The history as rows: per cell config and vLLM version, the outcome of every run, oldest first."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.cell import TABLE, parse_config_id
from harness.core.pattern import CellPattern, parse_pattern
from harness.core.versions import version_order
from harness.verdicts.history.store import History, HistoryCell


@dataclass(frozen=True)
class Row:
    """A heat-map row: a cell config on one platform, injected runs apart from upstream ones."""

    platform: str
    config: str
    inject: tuple[str, ...] = ()
    setup: str = ""  # another model or engine arguments than the harness's (Run.setup): rows of their own


@dataclass(frozen=True)
class Observation:
    run_id: str
    created: str  # when the run happened
    outcome: str
    label: str  # "LOSS(1)", "OK", …
    summary: str
    expectation: str | None
    inject: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class Series:
    row: Row
    version: str
    observations: tuple[Observation, ...]  # oldest first

    @property
    def latest(self) -> Observation:
        return self.observations[-1]

    @property
    def since(self) -> Observation:
        """The first run of the latest outcome's unbroken streak."""
        first = self.observations[-1]
        for o in reversed(self.observations):
            if o.label != self.latest.label:
                break
            first = o
        return first


@dataclass(frozen=True)
class HistoryView:
    path: Path
    rows: tuple[Row, ...]
    versions: tuple[str, ...]  # sorted as versions; commit labels by the version their wheel reported
    series: tuple[Series, ...]
    runs: int  # runs shown
    injected_runs: int  # runs with fault injection among them
    excluded_injected_runs: int  # runs left out because they used fault injection
    platforms: tuple[str, ...]
    hidden_unsupported_rows: int = 0  # rows left out because every version is UNSUPPORTED there

    def get(self, row: Row, version: str) -> Series | None:
        return next((s for s in self.series if s.row == row and s.version == version), None)

    def find(self, config: str, version: str, platform: str | None = None,
             inject: tuple[str, ...] = ()) -> Series | None:
        """The series of a config (e.g. ``mp-async_on-keep-clear``) and version."""
        return next((s for s in self.series if s.row.config == config and s.version == version
                     and s.row.inject == inject and (platform is None or s.row.platform == platform)), None)

    def label(self, row: Row) -> str:
        """Row label: the config, the platform when the view spans several, and any injection."""
        text = row.config
        if len(self.platforms) > 1:
            text += f" ({row.platform})"
        if row.inject:
            text += f" [inject {','.join(row.inject)}]"
        if row.setup:
            text += f" [{row.setup}]"
        return text


# Rows group by engine config (in report order), then by scenario, mode and clear_cache.
_ROW_AXES = tuple(a.name for a in TABLE.sort_order if a.engine and a.kind != "version") + tuple(
    a.name for a in TABLE.loop_order if not a.engine)


def _row_key(row: Row) -> tuple[Any, ...]:
    cell = parse_config_id(row.config)
    if cell is None:
        return (row.inject, row.setup, row.platform, 1, row.config)
    rank = dict(zip((a.name for a in type(cell).table().sort_order), cell.sort_key, strict=True))
    return (row.inject, row.setup, row.platform, 0, *(rank[name] for name in _ROW_AXES))


def _selector(patterns: Sequence[str]) -> Callable[[HistoryCell], bool]:
    """``--cells``: fnmatch patterns on the config or id, and ``key=value`` items of one cell pattern.

    The ``key=value`` items together are one pattern (``executor=mp,async=on,tp=2``: every axis must match, as
    in ``bisect --cell``), however the comma-separated option was split; a cell is selected when it matches
    any glob or that pattern.
    """
    globs = [p for p in patterns if "=" not in p]
    items = [p for p in patterns if "=" in p]
    pattern: CellPattern | None = parse_pattern(",".join(items), "--cells") if items else None

    def selected(cell: HistoryCell) -> bool:
        return not patterns or any(fnmatch.fnmatchcase(cell.config, p) or fnmatch.fnmatchcase(cell.id, p)
                                   for p in globs) or (pattern is not None and pattern.matches(cell.cell))

    return selected


def show(
    history: History,
    *,
    include_injected: bool = True,
    platform: str | None = None,
    cells: Sequence[str] = (),
    versions: Sequence[str] = (),
    hide_unsupported: bool = False,
) -> HistoryView:
    """Per cell config and vLLM version, the outcome of every run, oldest first.

    ``cells``: fnmatch patterns on the config (``mp-async_on-keep-*``) or the full cell id, and ``key=value``
    items of a cell pattern (``executor=mp``, ``async=on``, ``tp=2``: harness.core.pattern); ``versions``: exact
    version labels; ``platform``: ``cpu`` or ``cuda``; ``hide_unsupported``: leave out rows whose latest outcome
    is UNSUPPORTED on every version (Ray and uni cells on CPU).  Runs are ordered by when they happened (the
    report's ``created``), so a report added late does not hide newer results.
    """
    runs = [r for r in history.runs if platform is None or r.platform == platform]
    excluded = 0
    if not include_injected:
        excluded = sum(1 for r in runs if r.inject)
        runs = [r for r in runs if not r.inject]
    runs.sort(key=lambda r: r.when)  # stable: same time keeps file order
    selected = _selector(cells)
    obs: dict[tuple[Row, str], list[Observation]] = {}
    hints: dict[str, str] = {}
    for run in runs:
        for c in run.cells:
            if not selected(c) or (versions and c.version not in versions):
                continue
            if c.vllm_version:
                hints.setdefault(c.version, c.vllm_version)
            row = Row(run.platform, c.config, c.inject, run.setup)
            obs.setdefault((row, c.version), []).append(Observation(
                run.run_id, run.created, c.outcome, c.label, c.summary, c.expectation, c.inject, run.source))
    hidden = 0
    if hide_unsupported:
        unsupported = {r for r, _ in obs} - {r for (r, _), o in obs.items() if o[-1].outcome != "UNSUPPORTED"}
        hidden = len(unsupported)
        obs = {k: o for k, o in obs.items() if k[0] not in unsupported}
    order = version_order((v for _, v in obs), hints)
    rows = tuple(sorted({r for r, _ in obs}, key=_row_key))
    series = tuple(Series(r, v, tuple(obs[r, v])) for r in rows for v in order if (r, v) in obs)
    return HistoryView(history.path, rows, tuple(order), series, len({o.run_id for s in series
                                                                      for o in s.observations}),
                       sum(1 for r in runs if r.inject), excluded, tuple(sorted({r.platform for r in rows})),
                       hidden)


