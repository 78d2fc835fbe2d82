"""Result history: an append-only JSONL file of runs, each cell's outcome over time, and a PNG heat-map.

One line per run (one results report)::

    {"schema": "vllm-repro/history", "schema_version": 1, "run_id": "…", "cells_digest": "…", "added": "2026-…",
     "source": "…",
     "meta": {"platform": "cpu", "created": "…", "inject": [...], "devices": [...], …},
     "cells": [{"id", "version", "executor", "async", "mode", "clear_cache", "tp", "scenario", "model_runner",
                "batch_invariant", ["tier",] "outcome", "label", "summary", "reason", "expectation", "expected",
                "vllm_version", "device", "inject"}, …]}

A cell's axes are those of harness.core.axes (``async`` spelled as in schema 1); an axis added since (``tier``)
is written only when it is not at its default, so the lines still read in older versions.

Outcomes are kept as strings, so a history written by a newer vllm-repro (e.g. FLAKY from ``--repeat``) still
shows and plots.  Runs that used fault injection (``--inject vllm#42043``) are labelled everywhere and kept in
rows of their own: an injected LOSS must never read as an upstream regression.
"""

from __future__ import annotations

import dataclasses
import fcntl
import fnmatch
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.core.axes import BY_NAME, LOOP_ORDER, SORT_ORDER
from harness.core.cell import Cell, parse_config_id
from harness.core.errors import BadInput, ReproError, ResultsFileError
from harness.core.outcomes import COLORS, LEGEND, Category, category, style
from harness.core.pattern import CellPattern, parse_pattern
from harness.core.records import AXES_AFTER_V1, Schema, identity_form, inject_ids, known_cell, legacy_label
from harness.core.schema import validate
from harness.core.versions import version_order
from harness.verdicts.file_schemas import HISTORY_RUN
from harness.verdicts.results import SCHEMA as RESULTS_SCHEMA
from harness.verdicts.results import CellResult, Results, read_results

SCHEMA = "vllm-repro/history"
SCHEMA_VERSION = 1
HISTORY = Schema(SCHEMA, SCHEMA_VERSION, noun="line", label="history ")
# Run facts worth keeping from a report's meta (envs paths and the like are left out).
META_KEYS = ("tool_version", "created", "finished", "platform", "host", "argv", "inject", "repeat", "engine_starts",
             "model", "engine_args", "preset")
# A history line spells the async axis "async" (results JSON: "async_scheduling").
_LINE_KEYS = {"async_scheduling": "async"}
_REQUIRED = ("id", "version", "executor", "async", "mode", "clear_cache", "outcome")


class PlotUnavailable(ReproError):
    """matplotlib is not installed."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class HistoryCell:
    """One cell of a run as the history keeps it: the cell, its outcome and label, and what to show."""

    cell: Cell
    outcome: str
    label: str
    summary: str
    reason: str | None = None
    expectation: str | None = None  # "as expected" / "UNEXPECTED" / "not run" from the known-bug table
    expected: str | None = None
    vllm_version: str | None = None  # what the engine reported (orders commit labels)
    device: str | None = None
    inject: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.cell.id

    @property
    def version(self) -> str:
        return str(self.cell.version)

    @property
    def config(self) -> str:
        """The cell without its version, e.g. ``mp-async_on-keep-clear``: a heat-map row."""
        return str(self.cell.config_id)

    @classmethod
    def from_result(cls, cr: CellResult, run_inject: tuple[str, ...]) -> HistoryCell:
        e, engine = cr.expectation, cr.engine
        return cls(
            cell=cr.cell, outcome=cr.outcome.value, label=cr.label, summary=cr.summary,
            # Infrastructure results repeat their reason as the summary: stored once.
            reason=cr.reason if cr.reason != cr.summary else None,
            expectation=e.status if e else None, expected=e.expected if e else None,
            vllm_version=engine.vllm_version if engine else None, device=engine.device_name if engine else None,
            inject=tuple(dict.fromkeys(run_inject + (engine.inject if engine else ()))),
        )

    def to_dict(self) -> dict[str, Any]:
        # The flat form of history schema 1; axes added since are written only off their default, so the line
        # still reads in an older vllm-repro.
        axes = {_LINE_KEYS.get(k, k): v for k, v in self.cell.to_dict().items()
                if k not in AXES_AFTER_V1 or v != BY_NAME[k].default}
        return {"id": self.id, **axes, "outcome": self.outcome, "label": self.label, "summary": self.summary,
                "reason": self.reason, "expectation": self.expectation, "expected": self.expected,
                "vllm_version": self.vllm_version, "device": self.device, "inject": list(self.inject)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HistoryCell:
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"cell {d.get('id', '?')!r} lacks {', '.join(missing)}")
        outcome = d["outcome"]
        if not isinstance(outcome, str) or not outcome:
            raise ValueError(f"cell {d['id']!r} has outcome {outcome!r}, not a string")
        summary = str(d.get("summary") or outcome)
        cell = known_cell({k: d[_LINE_KEYS.get(k, k)] for k in BY_NAME if _LINE_KEYS.get(k, k) in d})
        return cls(
            cell=cell, outcome=outcome, label=str(d.get("label") or legacy_label(outcome, summary)),
            summary=summary, reason=d.get("reason"), expectation=d.get("expectation"), expected=d.get("expected"),
            vllm_version=d.get("vllm_version"), device=d.get("device"), inject=inject_ids(d.get("inject")),
        )


@dataclass(frozen=True)
class Run:
    run_id: str
    added: str  # ISO time the run was added to the history
    source: str  # the report it came from
    meta: dict[str, Any]
    cells: tuple[HistoryCell, ...]
    line: int = 0  # line in the history file (0: not read from a file)
    cells_digest: str = ""  # hash of the report's cell results (see run_id_of)

    def same_run(self, other: Run) -> bool:
        """The same run: the same id, or the same cells where one of the two does not know when it ran."""
        if self.run_id == other.run_id:
            return True
        return bool(self.cells_digest) and self.cells_digest == other.cells_digest and (
            not self.meta.get("created") or not other.meta.get("created"))

    @property
    def inject(self) -> tuple[str, ...]:
        """Fault ids injected anywhere in this run (empty: an upstream result)."""
        ids = inject_ids(self.meta.get("inject"))
        return tuple(dict.fromkeys(ids + tuple(i for c in self.cells for i in c.inject)))

    @property
    def platform(self) -> str:
        return str(self.meta.get("platform") or "?")

    @property
    def setup(self) -> str:
        """The run's model and engine arguments when not the harness's own ("" then): a LOSS on another model
        or with other engine arguments is not the same row's history."""
        model = self.meta.get("model") or {}
        label = str(model.get("label") or model.get("kind") or "bigram-cycle") if isinstance(model, dict) else ""
        args = self.meta.get("engine_args") or {}
        if label in ("", "bigram-cycle") and not args:
            return ""
        return ", ".join([f"model {label}", *(f"{k}={json.dumps(v)}" for k, v in sorted(args.items()))])

    @property
    def created(self) -> str:
        """When the run itself happened (the report's ``created``), else when it was added."""
        return str(self.meta.get("created") or self.added)

    @property
    def when(self) -> datetime:
        for text in (self.meta.get("created"), self.added):
            try:
                t = datetime.fromisoformat(str(text))
            except (TypeError, ValueError):
                continue
            # Naive times (hand-written files) are read as UTC so they compare with aware ones.
            return t if t.tzinfo else t.replace(tzinfo=UTC)
        return datetime.min.replace(tzinfo=UTC)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "run_id": self.run_id,
                "cells_digest": self.cells_digest, "added": self.added, "source": self.source, "meta": self.meta,
                "cells": [c.to_dict() for c in self.cells]}


@dataclass(frozen=True)
class History:
    path: Path
    runs: tuple[Run, ...]


@dataclass(frozen=True)
class AddResult:
    path: Path
    run: Run
    added: bool  # False: the same run was already in the history
    duplicate_of: Run | None = None

    @property
    def message(self) -> str:
        inj = f", fault injection {', '.join(self.run.inject)}" if self.run.inject else ""
        what = (f"run {self.run.run_id} ({len(self.run.cells)} cells, {self.run.platform}, created "
                f"{self.run.created}{inj})")
        if self.added:
            return f"added {what} from {self.run.source} to {self.path}"
        dup = self.duplicate_of
        assert dup is not None
        return (f"{what} is already in {self.path} (line {dup.line}, added {dup.added} from {dup.source}); "
                "not added again")


def cells_digest(results: Results) -> str:
    """Hash of a report's cell results, sorted by id (a JSONL log lists them in completion order).

    The cells are hashed in their schema-1 identity form (harness.core.records.identity_form), so a run added
    before a schema upgrade is recognised after it.
    """
    cells = sorted(json.dumps(identity_form(c.to_dict()), sort_keys=True, separators=(",", ":"))
                   for c in results.cells)
    return hashlib.sha256("\n".join(cells).encode()).hexdigest()


def run_id_of(results: Results) -> str:
    """Stable id of a run: a hash of its cell results and when it was created.

    Meta that a re-render may change (paths, argv) is left out, so a report re-rendered with ``vllm-repro
    report --out`` keeps its id; the results.jsonl log of the same run (no meta) is matched by its cells
    (``Run.same_run``).
    """
    created = str(results.meta.get("created") or "")
    return hashlib.sha256(f"{cells_digest(results)}|{created}".encode()).hexdigest()[:16]


def run_from_results(results: Results, source: str, added: datetime | None = None) -> Run:
    """The history record of one results report (not yet written anywhere)."""
    ids = [c.id for c in results.cells]
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        raise ResultsFileError(
            f"{source}: {len(dups)} cell(s) appear more than once (first: {dups[0]!r}), as in the JSONL log of a "
            "--repeat run; add the aggregated results.json instead")
    meta = {k: results.meta[k] for k in META_KEYS if results.meta.get(k) not in (None, "", [], {})}
    if "platform" not in meta:
        # A JSONL log (or an older report) has no meta: the engines say which platform they ran on.
        engines = {c.engine.platform for c in results.cells if c.engine and c.engine.platform}
        if len(engines) == 1:
            meta["platform"] = engines.pop()
    run_inject = inject_ids(results.meta.get("inject"))
    if run_inject:
        meta["inject"] = list(run_inject)
    devices = sorted({c.engine.device_name for c in results.cells if c.engine and c.engine.device_name})
    if devices:
        meta["devices"] = devices
    when = (added or datetime.now().astimezone()).isoformat(timespec="seconds")
    cells = tuple(HistoryCell.from_result(c, run_inject) for c in results.cells)
    return Run(run_id_of(results), when, source, meta, cells, 0, cells_digest(results))


# --------------------------------------------------------------------------- the file


def _history_hint(schema: Any) -> str:
    return "; that is a results report: add it with `vllm-repro history add`" if schema == RESULTS_SCHEMA else ""


def _parse(text: str, path: Path) -> tuple[Run, ...]:
    runs = []
    lines = text.splitlines(keepends=True)
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            cut = " (the file ends mid-line: an interrupted write?)" if not raw.endswith("\n") else ""
            raise ResultsFileError(
                f"{where}: corrupt history line ({exc.msg} at column {exc.colno}){cut}; fix or delete that line"
            ) from exc
        HISTORY.check(obj, where, _history_hint)
        validate(HISTORY_RUN, obj, where, ResultsFileError)
        try:
            missing = [k for k in ("run_id", "added", "cells") if k not in obj]
            if missing:
                raise ValueError(f"missing {', '.join(missing)}")
            if not isinstance(obj["cells"], list) or not all(isinstance(c, dict) for c in obj["cells"]):
                raise ValueError("'cells' is not a list of objects")
            meta = obj.get("meta") or {}
            if not isinstance(meta, dict):
                raise ValueError("'meta' is not an object")
            runs.append(Run(str(obj["run_id"]), str(obj["added"]), str(obj.get("source") or ""), meta,
                            tuple(HistoryCell.from_dict(c) for c in obj["cells"]), n,
                            str(obj.get("cells_digest") or "")))
        except (KeyError, ValueError, TypeError) as exc:
            raise ResultsFileError(f"{where}: malformed history run ({exc})") from exc
    return tuple(runs)


def read_history(path: Path) -> History:
    """Read a history file; raise ResultsFileError naming the file and line if it is missing or unusable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ResultsFileError(
            f"history file {path} does not exist; start it with `vllm-repro history add REPORT.json "
            f"--history {path}`") from exc
    except OSError as exc:
        raise ResultsFileError(f"cannot read history file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"{path}: not a text file ({exc.reason} at byte {exc.start})") from exc
    return History(path, _parse(text, path))


def add_run(history_path: Path, report: Path, now: datetime | None = None) -> AddResult:
    """Append the run in ``report`` (results.json or results.jsonl) to the history, unless it is already there.

    The history is validated first (a corrupt file is never appended to) and locked while it is read and
    appended, so two concurrent ``history add`` calls cannot both add the same run.
    """
    results = read_results(report)
    if not results.cells:
        raise ResultsFileError(f"{report}: no cell results; nothing to add to the history")
    run = run_from_results(results, str(report), now)
    try:
        history_path.parent.mkdir(parents=True, exist_ok=True)
        f = open(history_path, "a+", encoding="utf-8")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise ResultsFileError(f"cannot open history file {history_path}: {exc.strerror}") from exc
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        f.seek(0)
        try:
            text = f.read()
        except UnicodeDecodeError as exc:
            raise ResultsFileError(f"{history_path}: not a text file ({exc.reason} at byte {exc.start})") from exc
        existing = _parse(text, history_path)
        dup = next((r for r in existing if r.same_run(run)), None)
        if dup is not None:
            return AddResult(history_path, run, False, dup)
        # A hand-edited last line without its newline would otherwise swallow the new run.
        sep = "\n" if text and not text.endswith("\n") else ""
        line = len(text.splitlines()) + 1
        # One write of one line in append mode: a reader never sees half a run unless the machine dies mid-write
        # (and then the next read names that line).
        f.write(sep + json.dumps(run.to_dict(), separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return AddResult(history_path, dataclasses.replace(run, line=line), True)


# --------------------------------------------------------------------------- show


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
_ROW_AXES = tuple(a.name for a in SORT_ORDER if a.engine and a.kind != "version") + tuple(
    a.name for a in LOOP_ORDER if not a.engine)


def _row_key(row: Row) -> tuple[Any, ...]:
    cell = parse_config_id(row.config)
    if cell is None:
        return (row.inject, row.setup, row.platform, 1, row.config)
    rank = dict(zip((a.name for a in SORT_ORDER), cell.sort_key, strict=True))
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


def _streaks(observations: Sequence[Observation], keep: int = 6) -> str:
    # Run-length encoded labels, oldest first: "OK ×3 → LOSS(1) ×2".
    parts: list[list[Any]] = []
    for o in observations:
        if parts and parts[-1][0] == o.label:
            parts[-1][1] += 1
        else:
            parts.append([o.label, 1])
    text = [f"{label} ×{n}" if n > 1 else label for label, n in parts]
    if len(text) > keep:
        text = ["…", *text[-keep:]]
    return " → ".join(text)


def history_table(view: HistoryView) -> Table:
    """A rich table: one row per (cell config, version) with the latest outcome and the outcomes over time."""
    table = Table(title=f"vllm-repro history: {view.path}", show_lines=False)
    for name, kw in (("cell", {"no_wrap": True}), ("vLLM", {"no_wrap": True}), ("latest", {"no_wrap": True}),
                     ("since", {"no_wrap": True}), ("runs", {"justify": "right"}),
                     ("outcomes, old → new", {"min_width": 12})):
        table.add_column(name, **kw)
    for s in view.series:
        last = s.latest
        since = s.since.created[:16].replace("T", " ")
        table.add_row(Text(view.label(s.row), style="magenta" if s.row.inject else ""), Text(s.version),
                      Text(last.label, style=style(last.outcome)), Text(since),
                      Text(str(len(s.observations))), Text(_streaks(s.observations)))
    return table


def history_caption(view: HistoryView) -> str:
    """What the view covers, and how fault injection is treated."""
    text = f"{view.runs} run(s), {len(view.rows)} cell config(s), {len(view.versions)} version(s)."
    if view.injected_runs:
        text += (f" {view.injected_runs} run(s) used fault injection: their rows are marked [inject …]; the bug "
                 "was re-introduced on purpose, so they say nothing about upstream vLLM.")
    if view.excluded_injected_runs:
        text += f" {view.excluded_injected_runs} run(s) with fault injection left out."
    if view.hidden_unsupported_rows:
        text += f" {view.hidden_unsupported_rows} cell config(s) UNSUPPORTED on every version left out."
    return text


def render_history(view: HistoryView, console: Console) -> None:
    """Print the history table and its caption."""
    if not view.series:
        console.print(f"no runs in {view.path} match the selection")
        return
    console.print(history_table(view))
    console.print(Text(history_caption(view)))


# --------------------------------------------------------------------------- plot


@dataclass(frozen=True)
class PlotBox:
    row: str  # the row label
    config: str  # e.g. mp-async_on-keep-clear
    platform: str
    inject: tuple[str, ...]
    version: str
    outcome: str | None  # None: no run
    label: str
    color: str  # fill colour, "#rrggbb"
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 in PNG pixels, origin top-left, x1/y1 exclusive


@dataclass(frozen=True)
class HeatmapLayout:
    path: Path
    width: int
    height: int
    rows: tuple[str, ...]
    versions: tuple[str, ...]
    boxes: tuple[PlotBox, ...]
    runs: int
    excluded_injected_runs: int

    def box(self, row: str, version: str, platform: str | None = None) -> PlotBox:
        """The box of a row (its label, or a config such as ``mp-async_on-keep-clear``: upstream runs) and version."""
        found = [b for b in self.boxes if b.version == version and (platform is None or b.platform == platform)
                 and (b.row == row or (b.config == row and not b.inject))]
        if len(found) != 1:
            what = "no box" if not found else f"{len(found)} boxes (one per platform; pass platform=)"
            raise KeyError(f"{what} for row {row!r}, version {version!r}")
        return found[0]


def _matplotlib() -> tuple[Any, Any, Any]:
    # Imported here: matplotlib is an optional extra, and the Agg canvas is used directly (no pyplot, no global
    # backend switch), so plotting works without a display.
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError as exc:
        raise PlotUnavailable(
            f"history plot needs matplotlib, which is not installed ({exc}): pip install 'vllm-repro[plot]'"
        ) from exc
    return Figure, FigureCanvasAgg, (Patch, Rectangle)


def _text_color(fill: str) -> str:
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "white"


@dataclass(frozen=True)
class _Geometry:
    """Figure size and the heat-map's place in it, in inches (fixed: no layout engine moves the boxes)."""

    width: float
    height: float
    left: float
    bottom: float
    cell_w: float
    cell_h: float
    legend: tuple[Category, ...]
    legend_columns: int


def _geometry(view: HistoryView, labels: Sequence[str]) -> _Geometry:
    nrows, ncols = len(view.rows), len(view.versions)
    cell_w, cell_h = 1.25, 0.42  # inches
    left = 0.4 + 0.075 * max(len(t) for t in labels)
    width = max(left + ncols * cell_w + 0.3, 8.0)
    legend = tuple(c for c in Category if c is not Category.OTHER or any(
        category(s.latest.outcome) is c for s in view.series))
    ncol = 3 if width < 9 else 4
    top, bottom = 1.1, 0.6 + 0.25 * -(-len(legend) // ncol)
    return _Geometry(width, top + nrows * cell_h + bottom, left, bottom, cell_w, cell_h, legend, ncol)


def _heatmap_axes(fig: Any, view: HistoryView, labels: Sequence[str], g: _Geometry) -> Any:
    nrows, ncols = len(view.rows), len(view.versions)
    # Fixed axes geometry (no layout engine): the boxes computed below are where savefig puts them.
    ax = fig.add_axes((g.left / g.width, g.bottom / g.height, ncols * g.cell_w / g.width,
                       nrows * g.cell_h / g.height))
    ax.set_xlim(0, ncols)
    ax.set_ylim(nrows, 0)
    ax.set_xticks([c + 0.5 for c in range(ncols)], list(view.versions), fontsize=9)
    ax.set_yticks([r + 0.5 for r in range(nrows)], list(labels), fontsize=9)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    return ax


def _draw_boxes(ax: Any, view: HistoryView, rectangle: Any) -> list[tuple[int, int, str | None, str, str]]:
    # One coloured box per (row, version) with the latest label; (row, column, outcome, text, fill) of each.
    drawn: list[tuple[int, int, str | None, str, str]] = []
    for r, row in enumerate(view.rows):
        for c, version in enumerate(view.versions):
            s = view.get(row, version)
            outcome = s.latest.outcome if s else None
            fill = COLORS[category(outcome)]
            text = s.latest.label if s else "—"
            ax.add_patch(rectangle((c, r), 1, 1, facecolor=fill, edgecolor="white", linewidth=2))
            ax.text(c + 0.5, r + 0.5, text if len(text) <= 16 else text[:15] + "…", ha="center", va="center",
                    fontsize=8, color=_text_color(fill) if s else "#909090")
            drawn.append((r, c, outcome, text, fill))
    return drawn


def _titles_and_legend(fig: Any, view: HistoryView, g: _Geometry, patch: Any) -> None:
    title = "vllm-repro history: latest outcome per cell and vLLM version"
    sub = history_caption(view)
    fig.text(0.5, 1 - 0.25 / g.height, title, ha="center", va="center", fontsize=11, weight="bold")
    fig.text(0.5, 1 - 0.5 / g.height, sub if len(sub) < 160 else sub[:157] + "…", ha="center", va="center",
             fontsize=7, color="#555555")
    fig.legend(handles=[patch(facecolor=COLORS[c], edgecolor="#888888", label=LEGEND[c]) for c in g.legend],
               loc="lower center", ncol=g.legend_columns, frameon=False, fontsize=8,
               bbox_to_anchor=(0.5, 0.1 / g.height))


def _save_png(fig: Any, out: Path, dpi: int) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BadInput(f"cannot write the plot to {out}: {exc.strerror}") from exc


def plot(
    history: History,
    out: Path,
    *,
    include_injected: bool = False,
    platform: str | None = None,
    cells: Sequence[str] = (),
    versions: Sequence[str] = (),
    hide_unsupported: bool = False,
    dpi: int = 100,
) -> HeatmapLayout:
    """Write a PNG heat-map of cell configs x versions coloured by the latest run's outcome.

    OK green, token faults red, UNSUPPORTED grey, ERROR/TIMEOUT/BUILD-FAILED amber, FLAKY purple, any other
    outcome blue, no run white.  Runs with fault injection are left out unless ``include_injected``, and then
    get rows of their own.  Returns where each box landed in the PNG.
    """
    view = show(history, include_injected=include_injected, platform=platform, cells=cells, versions=versions,
                hide_unsupported=hide_unsupported)
    if not view.series:
        why = f" ({view.excluded_injected_runs} run(s) with fault injection left out)" \
            if view.excluded_injected_runs else ""
        raise BadInput(f"nothing to plot: no run in {history.path} matches the selection{why}")
    Figure, FigureCanvasAgg, (Patch, Rectangle) = _matplotlib()
    labels = [view.label(r) for r in view.rows]
    g = _geometry(view, labels)
    fig = Figure(figsize=(g.width, g.height), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    ax = _heatmap_axes(fig, view, labels, g)
    drawn = _draw_boxes(ax, view, Rectangle)
    _titles_and_legend(fig, view, g, Patch)
    canvas.draw()
    w_px, h_px = canvas.get_width_height()
    boxes = []
    for r, c, outcome, text, fill in drawn:
        (x0, y0), (x1, y1) = ax.transData.transform([(c, r + 1), (c + 1, r)])
        row = view.rows[r]
        boxes.append(PlotBox(labels[r], row.config, row.platform, row.inject, view.versions[c], outcome, text, fill,
                             (round(x0), round(h_px - y1), round(x1), round(h_px - y0))))
    _save_png(fig, out, dpi)
    return HeatmapLayout(out, w_px, h_px, tuple(labels), view.versions, tuple(boxes), view.runs,
                         view.excluded_injected_runs)
