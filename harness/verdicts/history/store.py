"""The history file: its records (a run and its cells), reading it, and appending a run to it."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.core.cell import BY_NAME, Cell
from harness.core.errors import ResultsFileError
from harness.core.records import (
    Schema,
    identity_form,
    inject_ids,
    known_cell,
    legacy_label,
    new_axes_off_default,
)
from harness.core.schema import validate
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
        axes = {_LINE_KEYS.get(k, k): v for k, v in new_axes_off_default(self.cell.to_dict(), type(self.cell)).items()}
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
    cells = sorted(json.dumps(identity_form(c.to_dict(), type(c.cell)), sort_keys=True, separators=(",", ":"))
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


