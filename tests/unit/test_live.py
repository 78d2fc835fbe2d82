"""The live board a person watches on a terminal (harness.frontends.commands.live)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from harness.core.cell import Cell
from harness.core.events import EngineEvent
from harness.core.oracle import Outcome
from harness.core.records import EngineInfo
from harness.frontends.commands.live import LiveBoard
from harness.plan.matrix import Selection, plan_matrix
from harness.run.context import Progress
from harness.verdicts.results import CellResult, infra_result

pytestmark = pytest.mark.unit


def _render(board: LiveBoard) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(board.render())
    return out.getvalue()


def test_board_folds_unsupported_cells_and_counts_what_ran() -> None:
    sel = Selection(versions=("0.21.0",), executors=("mp", "uni", "ray-v1", "ray-v2"), modes=("keep",))
    plan = plan_matrix(sel, "cpu")
    board = LiveBoard(Console(file=io.StringIO()), plan, len(plan.cells), jobs=1)
    for cell, why in plan.unsupported:
        board(Progress("cell", "", cell.engine, infra_result(cell, Outcome.UNSUPPORTED, why)))
    key, cells = plan.engines[1]
    board(Progress("engine-start", f"engine {key.id}", key))
    board(Progress("event", "engine", key, event=EngineEvent(EngineInfo({}))))
    board(Progress("cell", "", key, CellResult(cells[0], Outcome.LOSS, "LOSS(1)", label="LOSS(1)")))
    text = _render(board)
    # 12 unsupported cells of three executors: two reasons, one line each, not twelve lines.
    assert sum("UNSUPPORTED" in line for line in text.splitlines()) == 2
    assert "4 cell(s) UNSUPPORTED: vLLM's CPU platform replaces the uni executor" in text
    assert "8 cell(s) UNSUPPORTED: Ray executors do not run on vLLM's CPU platform" in text
    (row,) = [line.split() for line in text.splitlines() if line.startswith(key.id)]
    assert row[1:4] == ["running", "1/2", "1"]
    assert f"13/{len(plan.cells)} cells, 1 token fault(s), 0 ERROR/TIMEOUT/BUILD-FAILED" in text
    assert "1 engine(s) queued" in text


def test_eta_from_finished_engines() -> None:
    plan = plan_matrix(Selection(versions=("0.21.0", "0.32.0"), modes=("keep",), clear_caches=(True,)), "cpu")
    board = LiveBoard(Console(file=io.StringIO()), plan, len(plan.cells), jobs=2)
    assert board.eta(0.0) == "?"
    key, cells = plan.engines[0]
    row = board.rows[key.id]
    row.t0, row.t1 = 0.0, 30.0
    assert board.eta(31.0) == "~60s"  # three engines left, two at a time, 30 s each
    assert Cell("0.21.0", "mp", False, "keep", True) in cells
