"""Your model and engine settings: parsing and validation (harness.plan.engine_args), the one merge point into the
spec (harness.run.spec.merge_engine_args), and that the engine is started with exactly the arguments given
(repro.engine.main.engine_kwargs) or says which ones vLLM rejected (repro.engine.main.rejected_engine_args)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell, EngineKey
from harness.core.errors import BadInput
from harness.frontends.cli import main
from harness.frontends.commands.invocation import run_config
from harness.frontends.commands.matrix import add_axis_options, matrix_axes
from harness.plan.engine_args import (
    PRESETS,
    RLHF_SOURCE,
    engine_setup,
    parse_engine_arg,
    parse_model,
    read_engine_args_file,
)
from harness.run.spec import RunConfig, build_spec, merge_engine_args
from repro.core.wire import OWNED_ENGINE_ARGS, EngineSpec, Spec, WireError
from repro.engine import main as repro_engine
from repro.models.kinds import LoadedModel, load_model
from repro.models.realistic import SIZES

pytestmark = pytest.mark.unit

KEY = EngineKey("0.21.0", "mp", True)
CELLS = (Cell("0.21.0", "mp", True, "keep", True),)


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("raw", "key", "value"), [
    ("enable_prefix_caching=false", "enable_prefix_caching", False),
    ("enable_prefix_caching=False", "enable_prefix_caching", False),
    ("max_model_len=8192", "max_model_len", 8192),
    ("kv_cache_memory_bytes=268435456", "kv_cache_memory_bytes", 268435456),
    ("swap_space=0.5", "swap_space", 0.5),
    ("attention_backend=FLASH_ATTN", "attention_backend", "FLASH_ATTN"),
    ("dtype=bfloat16", "dtype", "bfloat16"),
    ("seed=None", "seed", None),
    ('compilation_config={"level": 0}', "compilation_config", {"level": 0}),
    ("max-num-seqs=4", "max_num_seqs", 4),  # the CLI spelling of a field works too
    ("served_model_name=a=b", "served_model_name", "a=b"),  # only the first '=' splits
])
def test_engine_arg_values_are_json_or_strings(raw: str, key: str, value: Any) -> None:
    assert parse_engine_arg(raw) == (key, value)


@pytest.mark.parametrize("raw", ["enable_prefix_caching", "=1", "1abc=2", "", "a b=1", "max.len=3"])
def test_a_malformed_engine_arg_is_bad_input_naming_the_form(raw: str) -> None:
    with pytest.raises(BadInput, match="KEY=VALUE"):
        parse_engine_arg(raw)


@pytest.mark.parametrize("key", sorted(OWNED_ENGINE_ARGS))
def test_an_argument_the_cell_decides_is_refused_naming_the_option(key: str) -> None:
    with pytest.raises(BadInput) as exc:
        engine_setup("cpu", engine_args=[f"{key}=1"])
    assert OWNED_ENGINE_ARGS[key].split()[0] in str(exc.value)


def _file(tmp_path: Path, doc: Any, raw: str | None = None) -> Path:
    path = tmp_path / "args.json"
    path.write_text(raw if raw is not None else json.dumps(doc))
    return path


@pytest.mark.parametrize(("doc", "raw", "says"), [
    (None, "{not json", "not JSON"),
    ([1, 2], None, "JSON object"),
    ({"bad key": 1}, None, "not an AsyncEngineArgs field name"),
    ({"async_scheduling": False}, None, "--async"),
])
def test_a_bad_engine_args_file_is_bad_input(tmp_path: Path, doc: Any, raw: str | None, says: str) -> None:
    with pytest.raises(BadInput, match=says):
        engine_setup("cpu", files=[_file(tmp_path, doc, raw)])


def test_a_missing_engine_args_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read"):
        read_engine_args_file(tmp_path / "nope.json")


def test_later_sources_win_preset_then_files_then_engine_args(tmp_path: Path) -> None:
    f = _file(tmp_path, {"max_model_len": 4096, "enable_prefix_caching": False})
    setup = engine_setup("cuda", engine_args=["enable_prefix_caching=true", "seed=3"], files=[f],
                         preset="rlhf-async-new-apis")
    assert setup.engine_args == {"enforce_eager": True, "max_model_len": 4096, "attention_backend": "FLASH_ATTN",
                                 "enable_prefix_caching": True, "seed": 3}


def test_the_rlhf_preset_is_the_upstream_examples_settings_mapped_onto_axes_and_options() -> None:
    cuda = engine_setup("cuda", preset="rlhf-async-new-apis")
    assert cuda.engine_args == {"enforce_eager": True, "max_model_len": 8192, "attention_backend": "FLASH_ATTN"}
    assert cuda.gpu_memory_utilization == 0.75
    assert cuda.axes == {"executor": "ray-v2", "batch-invariant": "on"}
    assert cuda.model.kind == "qwen3-random" and cuda.model.params == asdict(SIZES["cuda"])
    assert "defa164e131d6a8848ee5269af0f99e1d3eaf6c0" in RLHF_SOURCE and "rlhf_async_new_apis.py" in RLHF_SOURCE
    # The example has no CPU branch: on cpu only its platform-neutral arguments apply.
    cpu = engine_setup("cpu", preset="rlhf-async-new-apis")
    assert cpu.engine_args == {"enforce_eager": True, "max_model_len": 8192}
    assert (cpu.gpu_memory_utilization, cpu.axes) == (None, {})
    assert engine_setup("cpu", model="bigram-cycle", preset="rlhf-async-new-apis").model.kind == "bigram-cycle"


def test_unknown_preset_names_the_valid_ones() -> None:
    with pytest.raises(BadInput, match="rlhf-async-new-apis"):
        engine_setup("cpu", preset="verl")


def test_models_builtin_folder_and_hub_id(tmp_path: Path) -> None:
    assert parse_model(None, "cpu").kind == "bigram-cycle"
    q = parse_model("qwen3-random", "cpu")
    assert q.kind == "qwen3-random" and q.params == asdict(SIZES["cpu"])
    (tmp_path / "config.json").write_text("{}")
    folder = parse_model(str(tmp_path), "cpu")
    assert (folder.kind, folder.params) == ("path", {"path": str(tmp_path.resolve())})
    assert parse_model("Qwen/Qwen3-1.7B-Base", "cuda").params == {"name": "Qwen/Qwen3-1.7B-Base"}


@pytest.mark.parametrize("raw", ["qwen3-randm", "./no/such/dir", "/abs/missing", "a/b/c"])
def test_a_model_that_is_neither_is_bad_input(raw: str) -> None:
    with pytest.raises(BadInput, match="built-in"):
        parse_model(raw, "cpu")


def test_a_folder_without_config_json_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"no config\.json"):
        parse_model(str(tmp_path), "cpu")


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(("argv", "must_name"), [
    (["matrix", "--engine-arg", "async_scheduling=false"], ["async_scheduling", "--async"]),
    (["matrix", "--engine-arg", "distributed_executor_backend=ray"], ["--executor"]),
    (["bisect", "--versions", "0.21.0,0.22.0", "--engine-arg", "tensor_parallel_size=2"], ["--tp"]),
    (["workarounds", "check", "--versions", "0.21.0", "--engine-arg", "nokey"], ["KEY=VALUE"]),
    (["matrix", "--model", "no-such-model"], ["built-in", "qwen3-random"]),
    (["matrix", "--engine-args", "/no/such.json"], ["cannot read"]),
    (["matrix", "--platform", "cuda", "--gpu-memory-utilization", "1.5"], ["(0, 1]"]),
    # A declared setting's value outside its declaration (repro.settings.declared), before anything starts.
    (["matrix", "--engine-arg", "max_num_seqs=0"], ["--engine-arg max_num_seqs=0", "at least 1"]),
    (["matrix", "--engine-arg", "enable_prefix_caching=maybe"], ["enable_prefix_caching", "true or false"]),
    (["matrix", "--engine-arg", "gpu_memory_utilization=0.5"], ["--gpu-memory-utilization"]),
])
def test_bad_setup_exits_2_with_one_line(argv: list[str], must_name: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for word in must_name:
        assert word in err


def test_plan_takes_the_setup_options_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"requests": [{"rid": "r0", "prompt": [5, 7], "max_tokens": 4}], "pauses": []}))
    assert main(["plan", str(plan), "--versions", "0.21.0", "--engine-arg", "model=x"]) == 2
    assert "--model" in capsys.readouterr().err


def test_help_shows_the_preset_with_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["matrix", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for word in ("--model", "--engine-arg", "--engine-args", "--preset", "rlhf-async-new-apis",
                 "rlhf_async_new_apis.py"):
        assert word in out


def _args(**kw: Any) -> argparse.Namespace:
    base = {"num_requests": 8, "max_tokens": 48, "pause_after": 8, "kv_cache_gib": 1, "reports": Path("r"),
            "engine_timeout": 900.0, "scenario_timeout": 120.0, "gpu_memory_utilization": None, "model": None,
            "engine_arg": [], "engine_args": [], "preset": None}
    return argparse.Namespace(**{**base, **kw})


def test_run_config_carries_the_setup_and_the_presets_memory_unless_given(tmp_path: Path) -> None:
    cfg = run_config(_args(preset="rlhf-async-new-apis", engine_arg=["enable_prefix_caching=false"]), "cuda",
                     tmp_path)
    assert cfg.gpu_memory_utilization == 0.75 and cfg.model_kind == "qwen3-random" and cfg.custom_setup
    assert cfg.engine_args["enable_prefix_caching"] is False and cfg.preset == "rlhf-async-new-apis"
    assert run_config(_args(preset="rlhf-async-new-apis", gpu_memory_utilization=0.3), "cuda",
                      tmp_path).gpu_memory_utilization == 0.3
    plain = run_config(_args(), "cuda", tmp_path)
    assert (plain.gpu_memory_utilization, plain.custom_setup) == (0.05, False)
    assert run_config(_args(), "cpu", tmp_path).gpu_memory_utilization is None


def test_the_presets_axes_are_matrix_defaults_the_user_can_override() -> None:
    p = argparse.ArgumentParser()
    add_axis_options(p)  # every axis option, at its default (None)
    names = vars(p.parse_args([]))
    preset = argparse.Namespace(**names, preset="rlhf-async-new-apis", model=None, engine_arg=[], engine_args=[])
    axes = matrix_axes(preset, "cuda")
    assert axes["executors"] == ("ray-v2",) and axes["batch_invariants"] == (True,)
    chosen = argparse.Namespace(**{**vars(preset), "executor": "mp,ray-v2", "batch_invariant": "off"})
    axes = matrix_axes(chosen, "cuda")
    assert axes["executors"] == ("mp", "ray-v2") and axes["batch_invariants"] == (False,)
    plain = matrix_axes(argparse.Namespace(**{**vars(preset), "preset": None}), "cuda")
    assert plain["executors"] == ("mp", "uni", "ray-v1", "ray-v2") and plain["batch_invariants"] == (False,)


# --------------------------------------------------------------------------- into the spec, into the engine


def _cfg(tmp_path: Path, **kw: Any) -> RunConfig:
    return RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "models", **kw)


def test_the_spec_carries_exactly_the_users_arguments_over_the_schedulers(tmp_path: Path) -> None:
    user = {"enable_prefix_caching": False, "kv_cache_memory_bytes": 1 << 20, "max_model_len": 8192}
    cfg = _cfg(tmp_path, engine_args=user, model_kind="qwen3-random", model_params=asdict(SIZES["cpu"]))
    assert merge_engine_args(cfg, scheduling={"kv_cache_memory_bytes": 256 << 20}) == user  # the user's wins
    # ... except what a scenario's engine profile needs: that stays, over the user's and the scheduler's.
    profile = {"kv_cache_memory_bytes": 4 << 20, "num_gpu_blocks_override": 8}
    assert merge_engine_args(cfg, profile) == {**user, **profile}
    assert merge_engine_args(cfg, profile, {"kv_cache_memory_bytes": 256 << 20}) == {**user, **profile}
    spec = build_spec(KEY, CELLS, cfg, extra={"kv_cache_memory_bytes": 256 << 20})
    assert spec.engine.extra == user
    back = Spec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back.engine.extra == user and back.model_kind == "qwen3-random"
    assert back.model_params == asdict(SIZES["cpu"])
    assert build_spec(KEY, CELLS, _cfg(tmp_path)).engine.extra == {}


@pytest.mark.parametrize("key", sorted(OWNED_ENGINE_ARGS))
def test_the_wire_refuses_an_axis_in_the_extra_arguments(key: str) -> None:
    with pytest.raises(WireError, match=key):
        EngineSpec({"executor": "mp", "async_scheduling": True}, extra={key: 1})


def _model(**defaults: Any) -> LoadedModel:
    return LoadedModel("qwen3-random", "/models/q", vocab_size=100, defaults=defaults)


def test_the_engine_is_started_with_exactly_the_arguments_given(tmp_path: Path) -> None:
    user = {"enable_prefix_caching": False, "max_model_len": 8192, "dtype": "bfloat16", "attention_backend": "X"}
    spec = build_spec(KEY, CELLS, _cfg(tmp_path, engine_args=user))
    plain = repro_engine.engine_kwargs(build_spec(KEY, CELLS, _cfg(tmp_path)), _model(dtype="float32"))
    kwargs = repro_engine.engine_kwargs(spec, _model(dtype="float32"))
    # Every argument given, with its value; every other one as the engine's defaults have it.
    assert {k: kwargs[k] for k in user} == user
    assert {k: v for k, v in kwargs.items() if k not in user} == {k: v for k, v in plain.items() if k not in user}
    assert plain["dtype"] == "float32" and plain["max_model_len"] == 256 and plain["model"] == "/models/q"
    assert (plain["async_scheduling"], plain["distributed_executor_backend"]) == (True, "mp")


def test_the_engine_reports_config_objects_by_repr() -> None:
    class Conf:
        def __repr__(self) -> str:
            return "Conf(backend='nccl')"

    assert repro_engine.json_kwargs({"a": 1, "w": Conf()}) == {"a": 1, "w": "Conf(backend='nccl')"}


class _FakeArgs:
    """Stands in for AsyncEngineArgs: config validation refuses ``bad_key``."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs

    def create_engine_config(self) -> None:
        if "bad_key" in self.kwargs:
            raise ValueError(f"bad_key={self.kwargs['bad_key']} is not valid")


@pytest.fixture
def fake_vllm_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repro_engine, "_engine_args",
                        lambda spec, model, wt=None: _FakeArgs(repro_engine.engine_kwargs(spec, model, wt)))


def _spec(tmp_path: Path, extra: dict[str, Any]) -> Spec:
    return build_spec(KEY, CELLS, _cfg(tmp_path, engine_args=extra))


@pytest.mark.usefixtures("fake_vllm_args")
def test_a_rejected_engine_argument_is_named_with_vllms_message(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {"bad_key": 3, "seed": 1})
    why = repro_engine.rejected_engine_args(spec, _model(), ValueError("bad_key=3 is not valid"))
    assert why == "vLLM rejected engine argument(s) ['bad_key']: ValueError: bad_key=3 is not valid"


@pytest.mark.usefixtures("fake_vllm_args")
def test_a_start_up_failure_the_arguments_do_not_explain_stays_an_error(tmp_path: Path) -> None:
    # The config builds with them: the failure came later (an engine core crash is not a rejection).
    assert repro_engine.rejected_engine_args(_spec(tmp_path, {"seed": 1}), _model(), RuntimeError("boom")) is None
    # No user arguments at all: nothing to reject.
    assert repro_engine.rejected_engine_args(_spec(tmp_path, {}), _model(), ValueError("x")) is None


def test_an_unknown_field_is_rejected_with_the_type_error(tmp_path: Path) -> None:
    exc = TypeError("AsyncEngineArgs.__init__() got an unexpected keyword argument 'fooo'")
    why = repro_engine.rejected_engine_args(_spec(tmp_path, {"fooo": 1}), _model(), exc)
    assert why is not None and "['fooo']" in why and "unexpected keyword argument 'fooo'" in why


def test_every_preset_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in PRESETS:
        assert f"--preset {name}" in readme and "rlhf_async_new_apis.py" in readme


def test_model_kinds_resolve_in_the_engine(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 77}}))
    folder = load_model("path", {"path": str(tmp_path / "m")}, tmp_path / "cache")
    assert (folder.source, folder.vocab_size, folder.defaults, folder.perm) == (str(tmp_path / "m"), 77, {}, None)
    hub = load_model("path", {"name": "Qwen/Qwen3-1.7B-Base"}, tmp_path / "cache")
    assert (hub.source, hub.vocab_size) == ("Qwen/Qwen3-1.7B-Base", None)
    with pytest.raises(ValueError, match="exactly one"):
        load_model("path", {"path": "a", "name": "b"}, tmp_path)
    bigram = load_model("bigram-cycle", {}, tmp_path / "cache")
    # float32, and vLLM loads the checkpoint's word-level tokenizer (repro.models.tokenizer).
    assert bigram.defaults == {"dtype": "float32", "skip_tokenizer_init": False}
    assert bigram.perm is not None and len(bigram.perm) == 512


def test_compare_warns_when_the_two_reports_ran_different_set_ups() -> None:
    from harness.verdicts.compare.pairs import compare
    from harness.verdicts.results import Results

    mine = Results((), {"model": {"kind": "qwen3-random", "label": "qwen3-random"},
                        "engine_args": {"enable_prefix_caching": False}})
    warnings = compare(Results((), {}), mine).warnings
    assert any("A ran model bigram-cycle with no engine arguments, B model qwen3-random with "
               "enable_prefix_caching=False" in w for w in warnings), warnings
    assert not any("model" in w for w in compare(mine, mine).warnings)


@pytest.mark.parametrize("scenario", ["preempt", "chunked", "sleep", "spec_ngram", "weight_sync"])
def test_scenarios_built_on_the_bigram_cycle_are_unsupported_with_another_model(scenario: str,
                                                                                tmp_path: Path) -> None:
    import asyncio

    from repro.scenarios.cell_run import run_scenario
    from repro.scenarios.vocab import EngineContext, ScenarioUnsupported

    ctx = EngineContext(model_spec=None, model_dir=tmp_path, perm=None, model_cache=tmp_path, work_dir=tmp_path,
                        tensor_parallel_size=1, start_engine=lambda d: None, model_kind="qwen3-random",
                        vocab_size=32768)
    sc = {"id": "s", "scenario": scenario, "params": {}, "seed": 0}
    with pytest.raises(ScenarioUnsupported, match="bigram-cycle"):
        asyncio.run(run_scenario(object(), sc, ctx, 1.0))
