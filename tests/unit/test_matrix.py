"""The matrix (harness.plan.matrix): cell ids, planning per platform, and parsing of the axis options."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.core.cell import Cell, EngineKey
from harness.core.errors import BadInput, ReproError
from harness.envbuild.index_releases import Release
from harness.plan.matrix import (
    DEFAULT_VERSIONS,
    EXECUTORS,
    MODES,
    ON_OFF,
    TRUE_FALSE,
    Selection,
    parse_bools,
    parse_choices,
    parse_versions,
    plan_matrix,
    unsupported_reason,
)

pytestmark = pytest.mark.unit

versions = st.builds(
    lambda a, b, c, rc: f"{a}.{b}.{c}{rc}",
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(0, 9),
    st.sampled_from(["", "rc1", ".post1"]),
)
cells = st.builds(
    Cell,
    version=versions,
    executor=st.sampled_from(EXECUTORS),
    async_on=st.booleans(),
    mode=st.sampled_from(MODES),
    clear_cache=st.booleans(),
    tp=st.integers(1, 8),
    scenario=st.sampled_from(["pause", "weight-sync"]),
    model_runner=st.sampled_from(["v1", "v2"]),
    batch_invariant=st.booleans(),
)
selections = st.builds(
    Selection,
    versions=st.lists(versions, min_size=1, max_size=3, unique=True).map(tuple),
    executors=st.lists(st.sampled_from(EXECUTORS), min_size=1, unique=True).map(tuple),
    asyncs=st.lists(st.booleans(), min_size=1, unique=True).map(tuple),
    modes=st.lists(st.sampled_from(MODES), min_size=1, unique=True).map(tuple),
    clear_caches=st.lists(st.booleans(), min_size=1, unique=True).map(tuple),
    tps=st.lists(st.integers(1, 4), min_size=1, max_size=2, unique=True).map(tuple),
    model_runners=st.lists(st.sampled_from(["v1", "v2"]), min_size=1, unique=True).map(tuple),
    batch_invariants=st.lists(st.booleans(), min_size=1, unique=True).map(tuple),
)


# --------------------------------------------------------------------------- ids


def test_cell_id_format() -> None:
    assert Cell("0.21.0", "mp", True, "keep", True).id == "vllm0.21.0-mp-async_on-keep-clear"
    assert Cell("0.32.0", "ray-v2", False, "abort", False).id == "vllm0.32.0-ray-v2-async_off-abort-noclear"
    assert Cell("0.22.0", "uni", True, "wait", True, tp=2).id == "vllm0.22.0-uni-async_on-wait-clear-tp2"


def test_engine_key_and_scenario_id() -> None:
    c = Cell("0.21.0", "mp", True, "keep", False, tp=4)
    assert c.engine == EngineKey("0.21.0", "mp", True, 4)
    assert c.engine.id == "vllm0.21.0-mp-async_on-tp4"
    assert Cell("0.21.0", "mp", False, "wait", True).engine.id == "vllm0.21.0-mp-async_off"
    assert c.scenario_id == "keep-noclear"
    assert c.id == f"{c.engine.id.removesuffix('-tp4')}-{c.scenario_id}-tp4"


@given(cells)
def test_cell_dict_round_trip(cell: Cell) -> None:
    d = cell.to_dict()
    assert d["async_scheduling"] is cell.async_on
    assert Cell.from_dict(d) == cell
    assert Cell.from_dict(d).id == cell.id
    assert parse_versions(cell.version, "cpu") == (cell.version,)


@given(cells, cells)
def test_distinct_cells_have_distinct_ids(a: Cell, b: Cell) -> None:
    assert (a.id == b.id) == (a == b)


def test_from_dict_defaults_tp_to_1() -> None:
    d = Cell("0.21.0", "mp", True, "keep", True).to_dict()
    del d["tp"]
    assert Cell.from_dict(d).tp == 1


# --------------------------------------------------------------------------- planning

DEFAULT_CPU = Selection(
    versions=("0.21.0", "0.32.0"),
    executors=EXECUTORS,
    asyncs=(False, True),
    modes=MODES,
    clear_caches=(True, False),
)


def test_default_cpu_plan_is_two_mp_engines_per_version() -> None:
    plan = plan_matrix(DEFAULT_CPU, "cpu")
    keys = [k for k, _ in plan.engines]
    assert sorted(keys) == sorted(EngineKey(v, "mp", a) for v in ("0.21.0", "0.32.0") for a in (False, True))
    for key, engine_cells in plan.engines:
        assert len(engine_cells) == 6
        assert {(c.mode, c.clear_cache) for c in engine_cells} == {
            (m, c) for m in MODES for c in (True, False)
        }
        assert all(c.engine == key for c in engine_cells)
    assert len(plan.unsupported) == 2 * 3 * 2 * 6  # versions x (uni, ray-v1, ray-v2) x asyncs x scenarios
    for cell, reason in plan.unsupported:
        assert cell.executor in ("uni", "ray-v1", "ray-v2")
        assert isinstance(reason, str) and reason
    ray = {r for c, r in plan.unsupported if c.executor.startswith("ray")}
    uni = {r for c, r in plan.unsupported if c.executor == "uni"}
    assert all("Ray" in r for r in ray)
    assert all("uni" in r for r in uni)
    assert len(plan.cells) == len(DEFAULT_CPU.cells()) == 96


def test_cuda_plan_runs_mp_uni_ray_v2_but_not_ray_v1_with_async() -> None:
    plan = plan_matrix(DEFAULT_CPU, "cuda")
    runnable = {c for _, cs in plan.engines for c in cs}
    for c in DEFAULT_CPU.cells():
        if c.executor == "ray-v1" and c.async_on:
            assert c not in runnable
            assert unsupported_reason(c, "cuda") is not None
            assert "async" in unsupported_reason(c, "cuda")  # type: ignore[operator]
        else:
            assert c in runnable, c.id
    assert {c.executor for c, _ in plan.unsupported} == {"ray-v1"}
    assert len(plan.unsupported) == 2 * 6
    assert len(plan.engines) == 2 * 7  # per version: mp, uni, ray-v2 x 2 asyncs + ray-v1 async off
    # On CPU the same async-on ray-v1 cell is also unsupported.
    assert unsupported_reason(Cell("0.21.0", "ray-v1", True, "keep", True), "cpu") is not None


def test_cpu_rejects_tensor_parallelism() -> None:
    assert unsupported_reason(Cell("0.21.0", "mp", True, "keep", True, tp=2), "cpu") is not None
    assert unsupported_reason(Cell("0.21.0", "mp", True, "keep", True, tp=2), "cuda") is None
    assert unsupported_reason(Cell("0.21.0", "mp", True, "keep", True), "cpu") is None


def test_plan_rejects_unknown_platform() -> None:
    with pytest.raises(BadInput, match="cpu, cuda"):
        plan_matrix(DEFAULT_CPU, "tpu")


@given(selections, st.sampled_from(["cpu", "cuda"]))
def test_plan_partitions_the_selection(sel: Selection, platform: str) -> None:
    plan = plan_matrix(sel, platform)
    assert sorted(plan.cells) == sorted(sel.cells())
    assert len(set(plan.cells)) == len(plan.cells)
    keys = [k for k, _ in plan.engines]
    assert len(set(keys)) == len(keys)
    for key, cs in plan.engines:
        assert cs and all(c.engine == key and unsupported_reason(c, platform) is None for c in cs)
    for c, reason in plan.unsupported:
        assert reason == unsupported_reason(c, platform) and reason


# --------------------------------------------------------------------------- parsing


def test_parse_choices_rejects_unknown_value_naming_all_choices() -> None:
    with pytest.raises(BadInput) as e:
        parse_choices("mode", "sideways", MODES, MODES)
    msg = str(e.value)
    assert "sideways" in msg
    for m in ("keep", "wait", "abort"):
        assert m in msg
    assert isinstance(e.value, ReproError)


def test_parse_choices_valid_inputs() -> None:
    assert parse_choices("mode", None, MODES, ("keep",)) == ("keep",)
    assert parse_choices("mode", "all", MODES, ("keep",)) == MODES
    assert parse_choices("mode", "abort, keep", MODES, MODES) == ("keep", "abort")  # canonical order
    assert parse_choices("mode", "wait,wait", MODES, MODES) == ("wait",)
    with pytest.raises(BadInput, match="empty mode"):
        parse_choices("mode", " , ", MODES, MODES)
    with pytest.raises(BadInput, match="'all'"):
        parse_choices("mode", "all,keep", MODES, MODES)


@given(st.lists(st.sampled_from(MODES), min_size=1))
def test_parse_choices_returns_canonical_subset(chosen: list[str]) -> None:
    out = parse_choices("mode", ",".join(chosen), MODES, MODES)
    assert set(out) == set(chosen)
    assert list(out) == [m for m in MODES if m in chosen]


def test_parse_bools() -> None:
    assert parse_bools("async", "on,off", ON_OFF, (False,)) == (True, False)
    assert parse_bools("async", "off", ON_OFF, (True,)) == (False,)
    assert parse_bools("async", "on,on", ON_OFF, (False,)) == (True,)
    assert parse_bools("async", "both", ON_OFF, (False,)) == (True, False)
    assert parse_bools("async", "all", ON_OFF, (False,)) == (True, False)
    assert parse_bools("async", None, ON_OFF, (False, True)) == (False, True)
    assert parse_bools("clear", "true,false", TRUE_FALSE, (True,)) == (True, False)
    assert parse_bools("clear", "false", TRUE_FALSE, (True,)) == (False,)


@pytest.mark.parametrize(
    ("mapping", "raw", "choices"),
    [
        (ON_OFF, "maybe", ("on", "off", "both")),
        (ON_OFF, "on,true", ("on", "off", "both")),
        (TRUE_FALSE, "on", ("true", "false", "both")),
        (ON_OFF, ",", ("on", "off", "both")),
    ],
)
def test_parse_bools_rejects_bad_values(mapping: dict[str, bool], raw: str, choices: tuple[str, ...]) -> None:
    with pytest.raises(BadInput) as e:
        parse_bools("async", raw, mapping, (True,))
    for c in choices:
        assert c in str(e.value)


def test_parse_versions() -> None:
    assert parse_versions("0.21.0,0.32.0", "cpu") == ("0.21.0", "0.32.0")
    assert parse_versions(" 0.21.0 , 0.21.0,0.11.0rc1 ", "cuda") == ("0.21.0", "0.11.0rc1")
    assert parse_versions("0.10.1.post1,0.12.0.dev3", "cpu") == ("0.10.1.post1", "0.12.0.dev3")
    assert parse_versions(None, "cpu") == DEFAULT_VERSIONS["cpu"] == ("0.21.0", "0.32.0")
    # On GPUs the default adds the newest release, resolved from the index at run time (none on cpu: no fetch).
    assert DEFAULT_VERSIONS["cuda"] == ("0.21.0", "0.22.0", "latest")
    linux = ("manylinux_2_28_x86_64", "manylinux_2_28_aarch64")
    newest = [Release("0.22.0", linux, None, False), Release("0.33.1", linux, None, False)]

    def index(package: str, _url: str | None) -> list[Release]:
        assert package == "vllm"
        return newest

    assert parse_versions(None, "cuda", fetch=index) == ("0.21.0", "0.22.0", "0.33.1")
    newest.pop()  # latest is 0.22.0: listed once
    assert parse_versions(None, "cuda", fetch=index) == ("0.21.0", "0.22.0")


@pytest.mark.parametrize("raw", ["latest!", "v0.21.0", "0.21.0,main", "0.21.x", "", " , "])
def test_parse_versions_rejects(raw: str) -> None:
    with pytest.raises(BadInput):
        parse_versions(raw, "cpu")


def test_parse_versions_message_names_the_bad_value() -> None:
    with pytest.raises(BadInput, match=r"'latest!'"):
        parse_versions("0.21.0,latest!", "cpu")


def test_tp_parsing_and_defaults() -> None:
    from harness.plan.matrix import parse_tps

    assert parse_tps(None, "cpu") == (1,)
    assert parse_tps(None, "cuda") == (1, 2)
    assert parse_tps("2,1,2", "cuda") == (1, 2)
    for bad in ("0", "x", ","):
        with pytest.raises(BadInput):
            parse_tps(bad, "cuda")


def test_weight_sync_cells_are_keep_mode_only() -> None:
    sel = Selection(versions=("0.21.0",), asyncs=(True,), scenarios=("pause", "weight-sync"))
    ws = [c for c in sel.cells() if c.scenario == "weight-sync"]
    assert {c.mode for c in ws} == {"keep"} and len(ws) == 2
    bad = Cell("0.21.0", "mp", True, "wait", True, scenario="weight-sync")
    assert "keep mode only" in (unsupported_reason(bad, "cpu") or "")


def test_tp2_needs_two_visible_gpus() -> None:
    c = Cell("0.21.0", "mp", True, "keep", True, tp=2)
    assert unsupported_reason(c, "cuda", n_gpus=1) == "tensor_parallel_size=2 needs 2 GPUs, 1 visible"
    assert unsupported_reason(c, "cuda", n_gpus=2) is None
    plan = plan_matrix(Selection(versions=("0.21.0",), executors=("mp",), tps=(1, 2)), "cuda", n_gpus=1)
    assert all(c.tp == 1 for _, cs in plan.engines for c in cs)
    assert all(c.tp == 2 for c, _ in plan.unsupported)


def test_the_default_scenarios_per_platform() -> None:
    # Issue 14: on cpu the default run plays every scenario vLLM's CPU platform runs: the default profile's
    # (seconds each, no engine start) plus preempt and chunked (an engine each per config); sleep and spec-ngram,
    # which vLLM refuses or cannot start there, only with --scenario all.  On cuda: the default profile's only.
    from harness.core.cell import BY_NAME
    from harness.core.scenarios import BY_SCENARIO, DEFAULT_SCENARIOS
    from harness.plan.matrix import parse_option

    gpu = parse_option(BY_NAME["scenario"], None, "cuda")
    assert gpu == DEFAULT_SCENARIOS and {"pause", "weight-sync", "reset-inflight", "abort-some"} <= set(gpu)
    assert all(BY_SCENARIO[s].profile == "default" for s in gpu)
    cpu = parse_option(BY_NAME["scenario"], None, "cpu")
    assert cpu == (*DEFAULT_SCENARIOS, "preempt", "chunked")
    assert not {"sleep", "spec-ngram", "spec-ngram-pause", "reset-deep"} & set(cpu)
    assert parse_option(BY_NAME["scenario"], "pause", "cpu") == ("pause",)
    assert set(parse_option(BY_NAME["scenario"], "all", "cpu")) == set(BY_SCENARIO)


def test_the_cli_runs_the_engine_door_unless_told() -> None:
    """`--door` defaults to engine: the default matrix (`tox -e repro`) must not start a server per engine config
    (it did, for one merge: the option's default was every door)."""
    from harness.frontends.cli import build_parser
    from harness.frontends.commands.matrix import matrix_axes

    parser = build_parser()
    assert matrix_axes(parser.parse_args(["matrix"]), "cpu")["doors"] == ("engine",)
    # all: the client door too, whose cells are UNSUPPORTED unless frameworks check names a framework
    assert matrix_axes(parser.parse_args(["matrix", "--door", "all"]), "cpu")["doors"] == ("engine", "server", "client")
