"""``matrix --resume``: what a run was asked to do (``run.json``) and which of its cells are finished."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from harness import __version__
from harness.core.errors import BadInput, ResultsFileError
from harness.core.oracle import Outcome
from harness.core.records import Schema
from harness.core.schema import validate
from harness.envbuild.envs import default_wheels
from harness.plan.matrix import Selection
from harness.run.spec import RunConfig
from harness.verdicts.file_schemas import RUN_RECORD
from harness.verdicts.results import CellResult, log_line, read_results

RUN_FILE = "run.json"
RUN_SCHEMA = "vllm-repro/run"
RUN = Schema(RUN_SCHEMA, 1)  # run.json has its own version: results schemas 2 and 3 left it unchanged
# Outcomes a resumed run keeps; the others (ERROR, TIMEOUT, BUILD-FAILED) are run again.
KEEP = frozenset(o for o in Outcome if not o.is_infra) | {Outcome.UNSUPPORTED}


def run_record(sel: Selection, cfg: RunConfig, platform: str, wheels: str | None = None) -> dict[str, Any]:
    """The settings that decide a run's cells and verdicts; a resumed run must match them.

    ``wheels`` (the vLLM build) is recorded only where it is not the platform's own, so the record of a
    default run is the one it always was.
    """
    record = {
        "schema": RUN_SCHEMA,
        "schema_version": RUN.version,
        "tool_version": __version__,
        "platform": platform,
        "cells": [c.id for c in sel.cells()],
        "settings": {
            "scenario_params": cfg.scenario_params,
            "model_params": cfg.model_params,
            "inject": list(cfg.inject),
            "repeat": cfg.repeat,
            "weight_transfer": cfg.weight_transfer,
            "weight_sync_fresh_check": cfg.weight_sync_fresh_check,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "model_kind": cfg.model_kind,
            "engine_args": cfg.engine_args,
            "preset": cfg.preset,
        },
    }
    if wheels is not None and wheels != default_wheels(platform):
        record["settings"]["wheels"] = wheels  # type: ignore[index]
    return record


def resume_state(reports: Path, current: dict[str, Any]) -> list[CellResult]:
    """Finished cells of the run in ``reports`` that a resumed run keeps, after checking it is the same run."""
    run_path = reports / RUN_FILE
    try:
        previous = json.loads(run_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"nothing to resume in {reports}: no {RUN_FILE} (run without --resume first)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsFileError(f"{run_path}: unreadable run record ({exc})") from exc
    RUN.check(previous, str(run_path))
    validate(RUN_RECORD, previous, str(run_path), ResultsFileError)
    diffs = [k for k in ("platform", "cells", "settings") if previous.get(k) != current.get(k)]
    if diffs:
        raise BadInput(f"--resume: the run in {reports} was started with different {', '.join(diffs)}; "
                       "repeat its exact options, or start a new run without --resume")
    log = reports / "results.jsonl"
    if not log.exists():
        return []
    _drop_torn_tail(log)
    wanted = set(current["cells"])
    kept: dict[str, CellResult] = {}
    for r in read_results(log).cells:
        if r.id in wanted and r.outcome in KEEP:
            kept[r.id] = r
    return list(kept.values())


def _drop_torn_tail(log: Path) -> None:
    # A kill can land mid-write: a last line without its newline is an
    # unfinished record, not a result.  Every complete line was fsync'd.
    data = log.read_bytes()
    if data and not data.endswith(b"\n"):
        log.write_bytes(data[: data.rfind(b"\n") + 1])


def rewrite_log(log: Path, kept: list[CellResult]) -> None:
    """Replace ``log`` (atomically) by the kept cells, so re-run cells do not appear twice."""
    tmp = log.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in kept:
            f.write(json.dumps(log_line(r)) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, log)


def keep_engine_logs(reports: Path) -> Path | None:
    """Move the interrupted run's ``engines/`` aside (``engines.prev-N``): the kept cells' logs stay readable."""
    engines = reports / "engines"
    if not engines.is_dir():
        return None
    n = 1
    while (reports / f"engines.prev-{n}").exists():
        n += 1
    dest = reports / f"engines.prev-{n}"
    engines.rename(dest)
    return dest
