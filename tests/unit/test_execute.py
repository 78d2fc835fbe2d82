"""The one matrix loop (harness.run.execute.execute_plan) on a fake backend: what every backend gets for free."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.envbuild.envs import IndexConfig
from harness.plan.matrix import plan_cells
from harness.run.context import BackendReport, CellSink, EngineWork, Progress, RunContext
from harness.run.execute import execute_plan
from harness.run.spec import RunConfig
from harness.verdicts.results import ResultsLog, infra_result, read_results

pytestmark = pytest.mark.unit


class _Backend:
    """Reports every cell of every engine ERROR, one of them twice (a Ray result after its ERROR)."""

    def __init__(self) -> None:
        self.seen: list[EngineWork] = []

    def run(self, engines: Sequence[EngineWork], ctx: RunContext, record: CellSink) -> BackendReport:
        for key, cells in engines:
            self.seen.append((key, cells))
            for c in cells:
                record(infra_result(c, Outcome.ERROR, "fake"))
            record(infra_result(cells[0], Outcome.OK, "late duplicate"))
        return BackendReport({"0.21.0": {"path": "/envs/x"}}, len(engines), {"cluster": {"backend": "fake"}})


def test_the_loop_records_plan_and_backend_cells_once_in_plan_order(tmp_path: Path) -> None:
    cells = [Cell("0.21.0", "mp", True, "keep", True), Cell("0.21.0", "ray-v2", True, "keep", True),
             Cell("0.21.0", "mp", True, "wait", True)]
    plan = plan_cells(cells, "cpu")
    assert plan.unsupported, "ray-v2 on cpu is refused by the planner"
    shown: list[Progress] = []
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path)
    ctx = RunContext(cfg, IndexConfig(), tmp_path, ResultsLog(tmp_path / "results.jsonl"), argv=("matrix",),
                     on_progress=shown.append)
    backend = _Backend()

    res = execute_plan(plan, ctx, backend)

    assert backend.seen == list(plan.engines)
    assert [c.id for c in res.cells] == [c.id for c in plan.cells]
    outcome = {c.id: c.outcome for c in res.cells}
    assert [outcome[c.id] for c in cells] == [Outcome.ERROR, Outcome.UNSUPPORTED, Outcome.ERROR]
    assert sorted(c.id for c in read_results(tmp_path / "results.jsonl").cells) == sorted(c.id for c in cells)
    assert [p.cell.id for p in shown if p.kind == "cell" and p.cell] == [cells[1].id, cells[0].id, cells[2].id]
    assert res.meta["engine_starts"] == 1 and res.meta["argv"] == ["matrix"]
    assert res.meta["envs"] == {"0.21.0": {"path": "/envs/x"}} and res.meta["cluster"] == {"backend": "fake"}
    with pytest.raises(ValueError, match="results log"):
        execute_plan(plan, RunContext(cfg, IndexConfig(), tmp_path), backend)
