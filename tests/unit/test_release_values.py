"""Settings that know their releases: vLLM 0.34.0 removed model runner V1, so a cell left at the default runs V2
there and says so, a cell that names v1 is UNSUPPORTED with the reason, and no release is given a variable it
rejects."""

from __future__ import annotations

import pytest

from harness.core.cell import BY_NAME, Cell, at_release
from harness.core.pattern import parse_pattern
from harness.plan.matrix import Selection, plan_cells
from repro.settings.engine_axes import engine_env

pytestmark = pytest.mark.unit

RUNNER = BY_NAME["model_runner"]


def test_the_declaration_knows_which_releases_have_v1() -> None:
    assert RUNNER.not_in_release("v1", "0.33.0") is None
    assert "removed in vLLM 0.34.0" in (RUNNER.not_in_release("v1", "0.34.0") or "")
    assert "removed in vLLM 0.34.0" in (RUNNER.not_in_release("v1", "0.35.1") or "")
    assert RUNNER.not_in_release("v2", "0.34.0") is None
    assert RUNNER.not_in_release("v1", "abc1234") is None  # a commit label: only its engine can tell
    assert (RUNNER.release_value("0.33.0"), RUNNER.release_value("0.34.0")) == ("v1", "v2")


def test_default_cells_run_the_only_runner_there_is_and_say_so() -> None:
    cells = Selection(versions=("0.33.0", "0.34.0"), modes=("keep",), clear_caches=(True,), asyncs=(True,)).cells()
    assert [(c.version, c.model_runner) for c in cells] == [("0.33.0", "v1"), ("0.34.0", "v2")]
    assert "mr_v2" in cells[1].id and "mr_v2" not in cells[0].id
    # Every way a cell is made from a template does the same (bisect probes, framework recipes, workarounds).
    assert parse_pattern("mode=keep").template().at("0.34.0").model_runner == "v2"
    assert parse_pattern("mode=keep,model_runner=v1").template().at("0.34.0").model_runner == "v1"
    plan = plan_cells(cells, "cuda")
    assert not plan.unsupported
    # The scheduler tier, which varies no runner, labels its 0.34.0 cells with the release's own.
    sched = at_release(Cell("0.34.0", tier="scheduler"))
    assert sched.model_runner == "v2" and not plan_cells([sched], "cpu").unsupported


def test_a_named_runner_the_release_lacks_is_unsupported_with_the_reason() -> None:
    sel = Selection(versions=("0.33.0", "0.34.0"), modes=("keep",), clear_caches=(True,), asyncs=(True,),
                    model_runners=("v1",), explicit=frozenset({"model_runner"}))
    plan = plan_cells(sel.cells(), "cuda")
    ((cell, reason),) = plan.unsupported
    assert cell.version == "0.34.0" and cell.model_runner == "v1"
    assert "model runner v1 was removed in vLLM 0.34.0" in reason


def test_no_release_gets_a_variable_it_rejects() -> None:
    # 0.34.0's Platform.validate_environ raises for VLLM_USE_V2_MODEL_RUNNER other than 1.
    cell = Selection(versions=("0.34.0",), modes=("keep",), clear_caches=(True,), asyncs=(True,)).cells()[0]
    axes = {a.name: getattr(cell, a.attr) for a in cell.table().engine}
    assert engine_env(axes).get("VLLM_USE_V2_MODEL_RUNNER", "1") == "1"


def test_engine_keys_made_without_a_cell_follow_too() -> None:
    # The fuzzer and plan replays make their scheduler-tier keys directly (harness.run.sched_fuzz, harness.run.replay).
    from harness.core.cell import EngineKey

    assert at_release(EngineKey("0.34.0", "mp", True, tier="scheduler")).model_runner == "v2"
    assert at_release(EngineKey("0.33.0", "mp", True, tier="scheduler")).model_runner == "v1"


def test_ray_v1_is_known_gone_from_0_33_0_and_its_variable_with_it() -> None:
    executor = BY_NAME["executor"]
    assert executor.not_in_release("ray-v1", "0.32.0") is None
    assert "removed in vLLM 0.33.0" in (executor.not_in_release("ray-v1", "0.33.0") or "")
    sel = Selection(versions=("0.32.0", "0.33.0"), executors=("ray-v1", "ray-v2"), modes=("keep",),
                    clear_caches=(True,), asyncs=(False,))
    plan = plan_cells(sel.cells(), "cuda")
    assert [(c.version, c.executor) for c, _ in plan.unsupported] == [("0.33.0", "ray-v1")]
    # 0.33.0's vllm/envs.py has no VLLM_USE_RAY_V2_EXECUTOR_BACKEND: it is set up to 0.32.0 only.
    assert engine_env({"version": "0.32.0", "executor": "ray-v2"}) == {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1"}
    assert engine_env({"version": "0.33.0", "executor": "ray-v2"}) == {}
    assert engine_env({"version": "abc1234", "executor": "ray-v1"}) == {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"}
