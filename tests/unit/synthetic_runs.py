"""Synthetic cell results and reports for the history and compare unit tests, judged by the real oracle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from synthetic import request_record

from harness.core.cell import Cell
from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from harness.verdicts.results import CellResult, Results, infra_result, judged_result

MAX_TOKENS = 32
PAUSE_AT = 8
RUNNING = 8  # requests running at the pause; 2 more are submitted during it
EXTRA = 2


def reference(n: int) -> list[int]:
    # Distinct tokens per request, as the bigram-cycle model gives.
    return [(1000 * (n + 1) + 7 * j) % 100_003 for j in range(MAX_TOKENS + 8)]


def records(cell: Cell, lose: int = 0, k: int = 1, first: int = 0) -> list[dict[str, Any]]:
    """RUNNING requests paused at PAUSE_AT (requests first..first+lose-1 lose k tokens there) plus EXTRA."""
    out = []
    for i in range(RUNNING + EXTRA):
        ref = reference(i)
        running = i < RUNNING
        obs = ref[:MAX_TOKENS]
        if running and first <= i < first + lose:
            obs = ref[:PAUSE_AT] + ref[PAUSE_AT + k : MAX_TOKENS + k]
        out.append(request_record(
            f"{cell.scenario_id}-{'r' if running else 'x'}{i if running else i - RUNNING:02d}", obs, ref,
            running=running, mode=cell.mode, clear_cache=cell.clear_cache, pause_at=PAUSE_AT,
            max_tokens=MAX_TOKENS, prompt=[i, i + 1]))
    return out


def engine(cell: Cell, platform: str = "cpu", device: str = "AMD EPYC", effective_async: bool | None = None,
           inject: Any = None) -> dict[str, Any]:
    e: dict[str, Any] = {
        "vllm_version": cell.version, "torch_version": "2.11.0", "platform": platform, "device_name": device,
        "requested": {"async_scheduling": cell.async_on, "executor": cell.executor},
        "effective": {"async_scheduling": cell.async_on if effective_async is None else effective_async,
                      "executor_class": "MultiprocExecutor"},
    }
    if inject is not None:
        e["probe"] = {"core": {"inject": inject}}
    return e


def ran(version: str, async_on: bool = True, lose: int = 0, *, k: int = 1, first: int = 0, mode: str = "keep",
        clear: bool = True, executor: str = "mp", platform: str = "cpu", device: str = "AMD EPYC",
        effective_async: bool | None = None, inject: Any = None) -> CellResult:
    cell = Cell(version, executor, async_on, mode, clear)
    recs = records(cell, lose, k, first)
    return judged_result(cell, cell_verdict(stream_records(recs)), stream_records(recs),
                         engine(cell, platform, device, effective_async, inject), duration_s=0.5)


def infra(version: str, outcome: Outcome, reason: str, *, async_on: bool = True, executor: str = "mp",
          mode: str = "keep", clear: bool = True) -> CellResult:
    return infra_result(Cell(version, executor, async_on, mode, clear), outcome, reason)


def report(cells: tuple[CellResult, ...], created: str, platform: str = "cpu", **meta: Any) -> Results:
    return Results(cells, {"tool_version": "0.1.0", "created": created, "platform": platform,
                           "host": {"node": "box", "machine": "x86_64"}, **meta})


def write(results: Results, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path
