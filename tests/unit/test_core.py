"""The pure core (harness.core): one axes table, and the cell, ids, parser, patterns derived from it."""

from __future__ import annotations

import pickle
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.core.axes import EXECUTORS, MODEL_RUNNERS, MODES, SCENARIOS, TIERS
from harness.core.cell import AXES, BY_NAME, Cell, EngineKey, find_cell_id, parse_cell_id, parse_config_id
from harness.core.errors import BadInput
from harness.core.oracle import Outcome
from harness.core.pattern import parse_pattern, pattern_from_mapping
from harness.core.profiles import PROFILES
from harness.core.scenarios import BY_SCENARIO, SCENARIO_TABLE, pauses
from harness.verdicts.known_bugs import expectation, load_known_bugs
from harness.verdicts.workarounds import load_ledger

pytestmark = pytest.mark.unit

versions = st.from_regex(r"\A(0\.[0-9]{1,2}\.[0-9](rc1|\.post1|\.dev3\+gabc)?|[0-9a-f]{12})\Z")
cells = st.builds(
    Cell,
    version=versions,
    executor=st.sampled_from(EXECUTORS),
    async_on=st.booleans(),
    mode=st.sampled_from(MODES),
    clear_cache=st.booleans(),
    tp=st.integers(1, 8),
    scenario=st.sampled_from(SCENARIOS),
    model_runner=st.sampled_from(MODEL_RUNNERS),
    batch_invariant=st.booleans(),
    tier=st.sampled_from(TIERS),
).map(lambda c: c if pauses(c.scenario) else c.replace(mode="keep", clear_cache=True))


def test_cell_fields_are_the_axes_table() -> None:
    assert [f.name for f in fields(Cell)] == [a.attr for a in AXES]
    assert [f.name for f in fields(EngineKey)] == [a.attr for a in AXES if a.engine] + ["profile"]
    assert BY_NAME["tier"].values == ("engine", "scheduler")


def test_existing_ids_are_unchanged_by_the_tier_axis() -> None:
    assert Cell("0.21.0", "mp", True, "keep", True).tier == "engine"
    assert Cell("0.21.0", "mp", True, "keep", True).id == "vllm0.21.0-mp-async_on-keep-clear"
    c = Cell("0.22.0", "ray-v2", False, "keep", False, 2, "weight-sync", "v2", True)
    assert c.id == "vllm0.22.0-ray-v2-async_off-keep-noclear-tp2-mr_v2-batch_invariant-weight_sync"
    assert c.engine.id == "vllm0.22.0-ray-v2-async_off-tp2-mr_v2-batch_invariant"
    assert c.scenario_id == "weight_sync-keep-noclear"
    assert c.config_id == "ray-v2-async_off-keep-noclear-tp2-mr_v2-batch_invariant-weight_sync"
    sched = c.replace(tier="scheduler")
    assert sched.id == "vllm0.22.0-ray-v2-async_off-keep-noclear-tp2-mr_v2-batch_invariant-sched-weight_sync"
    assert sched.engine != c.engine


@given(cells)
def test_id_round_trips(cell: Cell) -> None:
    assert parse_cell_id(cell.id) == cell
    assert find_cell_id(f"tests/x.py::test_post_resume[{cell.id}]") == cell
    assert parse_config_id(cell.config_id) == cell.replace(version="")
    assert Cell.from_dict(cell.to_dict()) == cell
    assert pickle.loads(pickle.dumps(cell)) == cell


@given(cells, cells)
def test_ids_are_unique(a: Cell, b: Cell) -> None:
    assert (a.id == b.id) == (a == b)


def test_bad_ids_are_refused() -> None:
    for text in ("vllm0.21.0-mp-async_on-keep", "0.21.0-mp-async_on-keep-clear", "vllm0.21.0-gpu-async_on-keep-clear"):
        with pytest.raises(BadInput, match="not a cell id"):
            parse_cell_id(text)
    assert find_cell_id("tests/x.py::test_other[a-b]") is None


def test_from_dict_of_schema_1_cells_takes_defaults() -> None:
    old = {"version": "0.21.0", "executor": "mp", "async_scheduling": True, "mode": "keep", "clear_cache": True}
    assert Cell.from_dict(old) == Cell("0.21.0", "mp", True, "keep", True)
    with pytest.raises(KeyError):
        Cell.from_dict({"version": "0.21.0", "executor": "mp"})


def test_sort_key_is_the_report_order() -> None:
    cs = [Cell("0.21.0", "mp", True, "keep", True, tp=2), Cell("0.9.0", "uni", False, "wait", False),
          Cell("0.21.0", "mp", False, "keep", False), Cell("0.21.0", "mp", False, "keep", True)]
    assert [c.id for c in sorted(cs, key=lambda c: c.sort_key)] == [
        "vllm0.9.0-uni-async_off-wait-noclear", "vllm0.21.0-mp-async_off-keep-clear",
        "vllm0.21.0-mp-async_off-keep-noclear", "vllm0.21.0-mp-async_on-keep-clear-tp2"]


def test_pattern_reaches_every_axis() -> None:
    p = parse_pattern("executor=mp,async=on,mode=keep,clear_cache=true,tp=2,scenario=weight_sync")
    hit = Cell("0.21.0", "mp", True, "keep", True, 2, "weight-sync")
    assert p.matches(hit)
    assert not p.matches(hit.replace(tp=1))
    assert not p.matches(hit.replace(scenario="pause"))
    assert parse_pattern("executor=mp|uni").matches(Cell("0.21.0", "uni", True, "keep", True))
    tpl = p.template()
    assert tpl.at("0.20.0") == hit.replace(version="0.20.0")
    assert tpl.label == "mp, async on, keep, clear_cache=true, tp=2, scenario=weight-sync"
    assert parse_pattern("").template().at("0.30").id == "vllm0.30-mp-async_on-keep-clear"
    assert parse_pattern("tier=scheduler").template().at("0.30").id == "vllm0.30-mp-async_on-keep-clear-sched"


@pytest.mark.parametrize(("raw", "needle"), [
    ("executor", "write key=value"),
    ("colour=red", "unknown cell key 'colour'; valid choices: version, executor"),
    ("executor=gpu", "unknown executor 'gpu'; valid choices: mp, uni, ray-v1, ray-v2"),
    ("tp=0", "invalid tp '0'"),
    ("async=maybe", "unknown async_scheduling 'maybe'"),
    # Every catalogue name, then the "_" spellings of the hyphenated ones.
    ("scenario=chaos", f"valid choices: {', '.join(SCENARIOS)}, weight_sync"),
])
def test_bad_patterns_name_the_choices(raw: str, needle: str) -> None:
    with pytest.raises(BadInput, match=None) as exc:
        parse_pattern(raw)
    assert needle in str(exc.value)


def test_template_refuses_several_values_or_a_version() -> None:
    for raw in ("executor=mp|uni", "version=0.21.0"):
        with pytest.raises(BadInput, match="one value per axis"):
            parse_pattern(raw).template()


def test_mapping_pattern_types_are_strict() -> None:
    assert pattern_from_mapping({"tp": 2, "scenario": "weight-sync"}, "t").matches(
        Cell("0.21.0", "mp", True, "keep", True, 2, "weight-sync"))
    for table, needle in (({"tp": "2"}, "should be a int"), ({"async_scheduling": "on"}, "should be a bool"),
                          ({"tier": "gpu"}, "unknown tier 'gpu'"), ({"async": True}, "unknown cell key 'async'")):
        with pytest.raises(BadInput, match=None) as exc:
            pattern_from_mapping(table, "t")
        assert needle in str(exc.value)


def test_known_bug_rule_can_name_a_scenario(tmp_path: Path) -> None:
    p = tmp_path / "bugs.toml"
    p.write_text('[[bug]]\nid = "ws"\naffected = ">=0.1"\n[[bug.cells]]\nscenario = "weight-sync"\ntp = 2\n'
                 'async_scheduling = true\nexpect = "DUPLICATE"\nk = 2\n')
    bugs = load_known_bugs(p)
    hit = Cell("0.21.0", "mp", True, "keep", True, 2, "weight-sync")
    assert expectation(hit, bugs).outcome is Outcome.DUPLICATE
    assert expectation(hit.replace(scenario="pause"), bugs).outcome is Outcome.OK
    assert expectation(hit.replace(tp=1), bugs).outcome is Outcome.OK


def test_workaround_ledger_can_name_any_axis(tmp_path: Path) -> None:
    p = tmp_path / "ledger.toml"
    p.write_text('[[workaround]]\nid = "w"\nissue = "vllm#1"\n[workaround.cell]\nexecutor = "ray-v2"\n'
                 'async_scheduling = true\nmode = "keep"\nclear_cache = true\ntp = 2\nscenario = "weight-sync"\n'
                 '[workaround.applied]\nasync_scheduling = false\n')
    (w,) = load_ledger(p)
    without, with_ = w.cells("0.21.0")
    assert without.id == "vllm0.21.0-ray-v2-async_on-keep-clear-tp2-weight_sync"
    assert with_.id == "vllm0.21.0-ray-v2-async_off-keep-clear-tp2-weight_sync"
    p.write_text(p.read_text().replace("tp = 2", 'tp = [1, 2]'))
    with pytest.raises(BadInput, match=r"workaround\[0\]\.cell\.tp: expected an integer >= 1, found a list"):
        load_ledger(p)


def test_scenario_table_is_well_formed() -> None:
    assert SCENARIO_TABLE[0].name == "pause" and SCENARIO_TABLE[0].segment == ""  # ids predating the axis
    segments = [s.segment for s in SCENARIO_TABLE]
    assert len(set(segments)) == len(segments)
    for s in SCENARIO_TABLE:
        assert s.profile in PROFILES, s.name
        assert set(s.tiers) <= set(TIERS) and s.tiers, s.name
        assert set(s.modes) <= set(MODES), s.name
        assert s.summary, s.name
        for mode in MODES:
            for clear in (True, False):
                cell = Cell("0.21.0", "mp", True, mode, clear, scenario=s.name)
                if s.admits(mode, clear):
                    assert parse_cell_id(cell.id) == cell
                    assert cell.engine.profile == s.profile


def test_a_non_pausing_scenario_leaves_mode_and_clear_cache_out_of_its_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    # No scenario of the table may need this yet; the rule is the cell model's, so check it on a copy.
    import dataclasses

    nopause = dataclasses.replace(BY_SCENARIO["weight-sync"], modes=())
    monkeypatch.setitem(BY_SCENARIO, "weight-sync", nopause)
    cell = Cell("0.21.0", "mp", True, "keep", True, scenario="weight-sync")
    assert cell.id == "vllm0.21.0-mp-async_on-weight_sync"
    assert parse_cell_id(cell.id) == cell
    assert cell.scenario_id == "weight_sync"
    assert nopause.admits("keep", True) and not nopause.admits("wait", True) and not nopause.admits("keep", False)


def test_engine_key_id_names_a_non_default_profile() -> None:
    key = Cell("0.21.0", "mp", True, "keep", True).engine
    assert key.profile == "default" and key.id == "vllm0.21.0-mp-async_on"
    from dataclasses import replace

    assert replace(key, profile="tiny-kv").id == "vllm0.21.0-mp-async_on-tiny_kv"


def test_scheduler_tier_cells_need_no_engine_profile() -> None:
    # The scheduler tier builds every scenario's scheduler itself: its cells of one config share one process.
    cells = [Cell("0.21.0", "mp", True, scenario=s, tier="scheduler") for s in ("pause", "preempt", "abort-some")]
    assert {c.engine for c in cells} == {cells[0].engine} and cells[0].engine.profile == "default"
    assert Cell("0.21.0", "mp", True, scenario="preempt").engine.profile == "tiny-kv"
