"""The optional GPU engine axes: model runner v1/v2 (VLLM_USE_V2_MODEL_RUNNER) and VLLM_BATCH_INVARIANT.

Ids stay what they were for the defaults (old reports and histories keep matching), each axis value
gets its own engine, the CPU tier refuses them with a reason, the engine environment always sets
both variables explicitly, and a cell only counts when the workers report what it asked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.cell import Cell, EngineKey
from harness.core.oracle import Outcome
from harness.plan.matrix import Selection, plan_matrix, unsupported_reason
from harness.run.engine_process import engine_env
from harness.run.spec import RunConfig, engine_spec
from harness.verdicts.history.store import HistoryCell
from harness.verdicts.results import CellResult
from harness.verdicts.workarounds import workaround_verdicts
from repro.settings.effective import effective_settings, refused_setting
from repro.settings.read_back import runner_generation

pytestmark = pytest.mark.unit

V1 = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
V2 = "vllm.v1.worker.gpu.model_runner.GPUModelRunner"


def test_default_axes_keep_the_old_ids() -> None:
    c = Cell("0.21.0", "mp", True, "keep", True)
    assert c.id == "vllm0.21.0-mp-async_on-keep-clear"
    assert c.engine.id == "vllm0.21.0-mp-async_on"
    assert Cell.from_dict({k: v for k, v in c.to_dict().items()
                           if k not in ("model_runner", "batch_invariant")}) == c


def test_variant_ids_and_engines() -> None:
    c = Cell("0.22.0", "ray-v2", True, "keep", True, tp=2, scenario="weight-sync", model_runner="v2",
             batch_invariant=True)
    assert c.id == "vllm0.22.0-ray-v2-async_on-keep-clear-tp2-mr_v2-batch_invariant-weight_sync"
    assert c.engine == EngineKey("0.22.0", "ray-v2", True, 2, "v2", True)
    assert c.engine.id == "vllm0.22.0-ray-v2-async_on-tp2-mr_v2-batch_invariant"
    sel = Selection(versions=("0.21.0",), modes=("keep",), asyncs=(True,), model_runners=("v1", "v2"),
                    batch_invariants=(False, True))
    plan = plan_matrix(sel, "cuda", 1)
    assert len(plan.engines) == 4  # one engine per (runner, batch-invariant) pair
    assert {k.id for k, _ in plan.engines} == {
        "vllm0.21.0-mp-async_on", "vllm0.21.0-mp-async_on-mr_v2", "vllm0.21.0-mp-async_on-batch_invariant",
        "vllm0.21.0-mp-async_on-mr_v2-batch_invariant"}


def test_cpu_refuses_the_gpu_axes_with_reasons() -> None:
    assert "V1 CPU model runner" in (unsupported_reason(Cell("0.32.0", "mp", True, "keep", True,
                                                              model_runner="v2"), "cpu") or "")
    assert "needs CUDA" in (unsupported_reason(Cell("0.21.0", "mp", True, "keep", True,
                                                    batch_invariant=True), "cpu") or "")
    assert unsupported_reason(Cell("0.21.0", "mp", True, "keep", True, model_runner="v2",
                                   batch_invariant=True), "cuda", 1) is None


def test_history_rows_name_the_variant_like_results() -> None:
    c = Cell("0.21.0", "uni", True, "keep", True, model_runner="v2", batch_invariant=True)
    cr = CellResult(cell=c, outcome=Outcome.OK, summary="OK 10/10")
    row = HistoryCell.from_result(cr, ())
    assert row.config == c.config_id
    assert HistoryCell.from_dict(row.to_dict()) == row


def test_engine_env_sets_both_variables_explicitly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Left over in the caller's shell, they must not change what a default cell runs.
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    cfg = RunConfig(platform="cuda", model_cache=tmp_path, work_dir=tmp_path)
    env = engine_env(EngineKey("0.22.0", "mp", True), cfg, tmp_path)
    assert (env["VLLM_USE_V2_MODEL_RUNNER"], env["VLLM_BATCH_INVARIANT"]) == ("0", "0")
    env = engine_env(EngineKey("0.22.0", "mp", True, 1, "v2", True), cfg, tmp_path)
    assert (env["VLLM_USE_V2_MODEL_RUNNER"], env["VLLM_BATCH_INVARIANT"]) == ("1", "1")
    spec = engine_spec(EngineKey("0.22.0", "mp", True, 1, "v2", True), (), cfg)
    assert (spec["engine"]["axes"]["model_runner"], spec["engine"]["axes"]["batch_invariant"]) == ("v2", True)


def test_runner_generation() -> None:
    assert runner_generation(V1) == "v1"
    assert runner_generation("vllm.v1.worker.cpu_model_runner.CPUModelRunner") == "v1"
    assert runner_generation(V2) == "v2"
    assert runner_generation("vllm.v1.worker.cpu.model_runner.CPUModelRunner") == "v2"  # 0.32's CPU v2
    assert runner_generation(None) is None


def _probe(runners: list[str], invariant: list[bool | None]) -> dict:
    return {
        "frontend_async_scheduling": True,
        "core": {"async_scheduling": True, "scheduler_class": "vllm.v1.core.sched.async_scheduler.AsyncScheduler",
                 "executor_class": "vllm.v1.executor.multiproc_executor.MultiprocExecutor"},
        "workers": [{"use_async_scheduling": True, "model_runner_class": r, "batch_invariant": b}
                    for r, b in zip(runners, invariant, strict=True)],
    }


def _requested(runner: str = "v1", invariant: bool = False) -> dict:
    return {"async_scheduling": True, "executor": "mp", "model_runner": runner, "batch_invariant": invariant}


@pytest.mark.parametrize(
    ("requested", "runners", "invariant", "problem"),
    [
        (_requested(), [V1, V1], [None, None], None),  # module never loaded: not batch-invariant
        (_requested(), [V1], [False], None),
        (_requested("v2"), [V2, V2], [False, False], None),
        (_requested("v2"), [V1], [False], "asked for model runner v2"),
        (_requested("v1"), [V1, V2], [False, False], "asked for model runner v1"),
        (_requested(invariant=True), [V1], [True], None),
        (_requested(invariant=True), [V1], [None], "VLLM_BATCH_INVARIANT=1"),
        (_requested(invariant=True), [V1, V1], [True, False], "mode is mixed"),
        (_requested(invariant=False), [V1], [True], "VLLM_BATCH_INVARIANT=0"),
    ],
)
def test_effective_settings_check_runner_and_batch_invariance(
    requested: dict, runners: list[str], invariant: list[bool | None], problem: str | None
) -> None:
    eff, reason = effective_settings(requested, _probe(runners, invariant))
    if problem is None:
        assert reason is None
        assert eff["model_runner"] == requested["model_runner"]
        assert eff["batch_invariant"] is requested["batch_invariant"]
    else:
        assert reason is not None and problem in reason


def test_v2_without_a_worker_probe_is_not_claimed() -> None:
    probe = _probe([], [])
    _, reason = effective_settings(_requested("v2"), probe)
    assert reason is not None and "unknown runner" in reason
    assert effective_settings(_requested(), probe)[1] is None  # old behaviour for the default runner
    assert "VLLM_BATCH_INVARIANT=1" in (effective_settings(_requested(invariant=True), probe)[1] or "")


def _pair(version: str, runner: str, outcome_on: Outcome) -> list[CellResult]:
    return [CellResult(cell=Cell(version, "mp", a, "keep", True, model_runner=runner),
                       outcome=outcome_on if a else Outcome.OK, summary="x") for a in (True, False)]


def test_workaround_verdict_pairs_within_one_runner() -> None:
    # Async on from runner v1 and async off from v2 are no pair: the verdict never mixes them.
    cells = [_pair("0.21.0", "v1", Outcome.LOSS)[0], _pair("0.21.0", "v2", Outcome.OK)[1]]
    (verdict,) = workaround_verdicts(cells)
    assert len({"mr_v2" in i for i in verdict.cell_ids}) == 1
    (verdict,) = workaround_verdicts([*_pair("0.21.0", "v2", Outcome.LOSS), _pair("0.21.0", "v1", Outcome.OK)[1]])
    assert verdict.status.name == "NEEDED"
    assert all("mr_v2" in i for i in verdict.cell_ids)


def test_history_rows_sort_by_engine_config_then_scenario() -> None:
    from harness.verdicts.history.view import Row, _row_key

    def config(**kw: object) -> str:
        return Cell("0.21.0", "mp", True, "keep", True, **kw).config_id  # type: ignore[arg-type]

    configs = [config(model_runner="v2", scenario="weight-sync"), config(batch_invariant=True), config(),
               config(model_runner="v2"), config(scenario="weight-sync"), config(tp=2)]
    ordered = sorted(configs, key=lambda c: _row_key(Row("cuda", c)))
    assert ordered == [config(), config(scenario="weight-sync"), config(batch_invariant=True),
                       config(model_runner="v2"), config(model_runner="v2", scenario="weight-sync"), config(tp=2)]


@pytest.mark.parametrize(
    ("requested", "message", "expect"),
    [
        (_requested("v2"), "VLLM_USE_V2_MODEL_RUNNER requires Triton.", "refused model runner v2"),
        (_requested("v2"), "VLLM_USE_V2_MODEL_RUNNER does not yet support: ['hybrid']", "refused model runner v2"),
        (_requested("v1"), "VLLM_USE_V2_MODEL_RUNNER requires Triton.", None),  # not ours to excuse
        (_requested("v2"), "CUDA out of memory", None),  # any other start-up failure stays an ERROR
        (_requested(invariant=True), "Selected backend FLASHINFER is not valid: ['batch invariance not supported']",
         "refused VLLM_BATCH_INVARIANT=1"),
        (_requested(), "Selected backend FLASHINFER is not valid: ['batch invariance not supported']", None),
    ],
)
def test_refused_setting_only_excuses_what_was_asked_for(requested: dict, message: str, expect: str | None) -> None:
    reason = refused_setting(requested, ValueError(message))
    assert (reason is None) if expect is None else (reason is not None and expect in reason and message[:20] in reason)


@pytest.mark.parametrize("module", ["vllm.model_executor.layers.batch_invariant",
                                    "vllm.model_executor.determinism.batch_invariant"])
def test_worker_probe_reads_batch_invariant_mode(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from repro.patches.shim import BATCH_INVARIANT_MODULES, _batch_invariant_mode

    for name in BATCH_INVARIANT_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert _batch_invariant_mode() is None  # vLLM never loaded it: not switched on
    fake = types.ModuleType(module)
    fake._batch_invariant_MODE = False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module, fake)
    assert _batch_invariant_mode() is False
    fake._batch_invariant_MODE = True  # type: ignore[attr-defined]
    assert _batch_invariant_mode() is True


def test_workaround_verdict_names_the_variant() -> None:
    (verdict,) = workaround_verdicts(_pair("0.21.0", "v2", Outcome.LOSS))
    assert verdict.executor == "mp-mr_v2"
    (verdict,) = workaround_verdicts(_pair("0.21.0", "v1", Outcome.LOSS))
    assert verdict.executor == "mp"


def test_a_runner_without_its_own_async_flag_follows_the_core_but_a_missing_probe_does_not() -> None:
    # vLLM 0.34.0's V2 GPU runner has no use_async_scheduling (measured on an H200: every 0.34.0 cell was
    # "could not establish effective async_scheduling ... workers: [None]" before this).
    probe = _probe([V2], [False])
    probe["workers"][0].update(use_async_scheduling=None, runner_async_flag=False)
    eff, reason = effective_settings(_requested("v2"), probe)
    assert reason is None and eff["async_scheduling"] is True
    probe["core"]["scheduler_class"] = "vllm.v1.core.sched.scheduler.Scheduler"  # the core contradicts: no claim
    assert "could not establish effective async_scheduling" in (effective_settings(_requested("v2"), probe)[1] or "")
    unknown = _probe([V2], [False])
    unknown["workers"][0]["use_async_scheduling"] = None  # a runner that has the flag but reports nothing
    assert effective_settings(_requested("v2"), unknown)[1] is not None
