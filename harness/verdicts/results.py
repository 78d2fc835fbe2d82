"""Cell results and the results files (JSONL while running, JSON at the end), schema-versioned.

The records themselves (CellResult and what it holds), the schema check and the migration of older files are
in harness.core.records; this module reads and writes the files.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.cell import Cell
from harness.core.errors import ResultsFileError
from harness.core.oracle import CellVerdict, Outcome
from harness.core.recorded_streams import StreamRecord
from harness.core.records import (
    LINE,
    RESULTS,
    SCHEMA_VERSION,
    CellResult,
    EngineInfo,
    RequestRecord,
    migrate_cell,
)
from harness.core.schema import ListOf, Obj, validate
from harness.verdicts.file_schemas import CELL_RESULT

SCHEMA = RESULTS.name
# Checked before migration (which needs an object); each cell is then checked against CELL_RESULT.
CELL_OBJECT = Obj({}, open=True, what="a cell result object")
RESULTS_DOC = Obj({"cells": ListOf(CELL_OBJECT, what="a list of cell results")}, open=True)
LINE_SCHEMA = LINE.name


def infra_result(cell: Cell, outcome: Outcome, reason: str,
                 engine: EngineInfo | dict[str, Any] | None = None) -> CellResult:
    """A cell that did not produce token streams: UNSUPPORTED, ERROR or TIMEOUT, with its reason."""
    return CellResult(cell, outcome, reason, reason=reason, engine=_engine(engine), label=outcome.value)


def _engine(engine: EngineInfo | dict[str, Any] | None) -> EngineInfo | None:
    return EngineInfo(engine) if isinstance(engine, dict) else engine


def judged_result(
    cell: Cell, verdict: CellVerdict, records: Sequence[StreamRecord], engine: EngineInfo | dict[str, Any] | None,
    duration_s: float | None,
) -> CellResult:
    """A cell whose scenario ran, with the oracle's verdict merged into each request record (as the engine wrote
    it: ``StreamRecord.raw``)."""
    by_rid = {rv.rid: rv.to_dict() for rv in verdict.requests}
    reqs = tuple(RequestRecord({**rec.raw, "verdict": by_rid.get(rec.rid)}) for rec in records)
    return CellResult(cell, verdict.outcome, verdict.summary, verdict.reason, verdict.counts, reqs, _engine(engine),
                      duration_s, label=verdict.label)


@dataclass(frozen=True)
class Results:
    cells: tuple[CellResult, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        meta = {k: v for k, v in self.meta.items() if k not in ("schema", "schema_version", "cells")}
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **meta, "cells": [c.to_dict() for c in self.cells]}


def log_line(result: CellResult) -> dict[str, Any]:
    """The JSONL form of a cell result (one line of results.jsonl)."""
    return {"schema": LINE_SCHEMA, "schema_version": SCHEMA_VERSION, **result.to_dict()}


# Engines side by side record from several threads: one line at a time.
_APPEND = threading.Lock()


class ResultsLog:
    """Append-only JSONL of cell results: one line per cell, written as soon as it is known."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, result: CellResult) -> None:
        line = json.dumps(log_line(result))
        with _APPEND, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def size(self) -> int:
        """Bytes in the log now (0 when it does not exist yet): where this run's lines begin."""
        return self.path.stat().st_size if self.path.exists() else 0

    def reorder_since(self, offset: int, results: list[CellResult]) -> None:
        """Rewrite the lines after ``offset`` (atomically) as ``results``, in that order.

        Engines side by side finish in any order; the log of a run ends in the order a one-at-a-time run
        writes, so logs of runs compare line by line.  Lines before ``offset`` (a resumed run's kept
        cells) stay as they are.
        """
        with _APPEND:
            head = self.path.read_bytes()[:offset] if self.path.exists() else b""
            tmp = self.path.with_suffix(".jsonl.tmp")
            with open(tmp, "wb") as f:
                f.write(head + "".join(json.dumps(log_line(r)) + "\n" for r in results).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)


def merge_results(parts: list[tuple[Path, Results]], extra: dict[str, Any] | None = None) -> Results:
    """One Results from several files (partial runs of one matrix): cells by id, a later file wins.

    A single file keeps its meta; merged files keep each one's meta under
    ``sources`` and the common facts (platform, tool version, inject) only when
    every file agrees on them.
    """
    if len(parts) == 1:
        _, res = parts[0]
        return Results(res.cells, {**res.meta, **(extra or {})})
    cells: dict[str, CellResult] = {}
    for _, res in parts:
        for c in res.cells:
            cells.pop(c.id, None)
            cells[c.id] = c
    meta: dict[str, Any] = {"merged_from": len(parts)}
    # Any injected fault of any part is the merged report's: every report of such a run must say so.
    meta["inject"] = list(dict.fromkeys(f for _, r in parts for f in (r.meta.get("inject") or [])))
    for key in ("platform", "tool_version", "repeat", "model", "engine_args", "preset"):
        values = {json.dumps(r.meta.get(key), sort_keys=True) for _, r in parts if key in r.meta}
        if len(values) == 1 and all(key in r.meta for _, r in parts):
            meta[key] = parts[0][1].meta[key]
    created = sorted(str(r.meta["created"]) for _, r in parts if r.meta.get("created"))
    if created:
        meta["created"] = created[0]
    meta["sources"] = [{"path": str(p), **{k: r.meta.get(k) for k in ("created", "argv", "host", "engine_starts")
                                           if k in r.meta}, "cells": len(r.cells)} for p, r in parts]
    return Results(tuple(cells.values()), {**meta, **(extra or {})})


# Committed reports are compressed: gzip, or xz for the big ones (a GPU matrix's 6 MB report: 417 kB gzipped,
# 42 kB with xz), read as the file inside.
DECOMPRESS = {".gz": gzip.decompress, ".xz": lzma.decompress}


def read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when its name ends in ``.gz`` or ``.xz``."""
    raw = path.read_bytes()
    unpack = DECOMPRESS.get(path.suffix)
    return unpack(raw) if unpack else raw


def inner_suffix(path: Path) -> str:
    """``.json`` for ``results.json``, ``results.json.gz`` and ``results.json.xz`` alike."""
    return (path.with_suffix("") if path.suffix in DECOMPRESS else path).suffix


def read_results(path: Path) -> Results:
    """Read a results JSON (or a JSONL log of cell lines) of any schema version this vllm-repro reads.

    Older cells are migrated (harness.core.records.migrate_cell); a migrated report's meta says
    ``migrated_from``.  Raise ResultsFileError if the file is unusable.
    """
    try:
        text = read_bytes(path).decode("utf-8")
    except (OSError, EOFError, gzip.BadGzipFile, lzma.LZMAError) as exc:
        raise ResultsFileError(f"cannot read results file {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    if inner_suffix(path) == ".jsonl":
        cells = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ResultsFileError(f"{path}:{n}: corrupt line ({exc.msg})") from exc
            cells.append(_cell(obj, LINE.check(obj, f"{path}:{n}"), f"{path}:{n}"))
        return Results(tuple(cells))
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsFileError(f"{path}: corrupt JSON ({exc.msg} at line {exc.lineno})") from exc
    version = RESULTS.check(obj, str(path))
    meta = {k: v for k, v in obj.items() if k not in ("schema", "schema_version", "cells", "migrated_from")}
    if version != SCHEMA_VERSION or "migrated_from" in obj:
        meta["migrated_from"] = obj.get("migrated_from", version)
    validate(RESULTS_DOC, obj, str(path), ResultsFileError)
    return Results(tuple(_cell(c, version, str(path), f"cells[{i}]") for i, c in enumerate(obj.get("cells", []))),
                   meta)


def _cell(obj: Any, version: int, where: str, at: str = "") -> CellResult:
    validate(CELL_OBJECT, obj, where, ResultsFileError, at)
    migrated = migrate_cell(obj, version)
    validate(CELL_RESULT, migrated, where, ResultsFileError, at)
    try:
        return CellResult.from_dict(migrated)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ResultsFileError(f"{where}: malformed cell result ({exc!r})") from exc
