"""The axes table is the only place an axis is written: a dummy axis added to a copy of the table reaches every
consumer.

``PcCell`` is ``Cell`` plus one boolean engine axis, ``prefix_caching`` (default on, spelled ``nopc`` when off,
so every existing id is unchanged), declared as a real maintainer would: one field.  Nothing else is told
about it; each check below goes through the consumer's ordinary entry point with the cell class (or a cell).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.core.axes import ON_OFF, axis
from harness.core.cell import Cell, find_cell_id, parse_cell_id, parse_config_id
from harness.core.oracle import Outcome
from harness.core.pattern import parse_pattern, pattern_from_mapping
from harness.core.records import CellResult, identity_form
from harness.frontends.commands.matrix import add_axis_options, matrix_axes
from harness.frontends.pytest_plugin import add_axis_options as add_pytest_options
from harness.frontends.pytest_plugin import matrix_cells, plugin_axes
from harness.plan.matrix import plan_cells, unsupported_reason
from harness.run.engine_process import engine_env
from harness.run.spec import RunConfig, build_spec
from harness.verdicts.history.store import run_id_of
from harness.verdicts.known_bugs import expectation, load_known_bugs
from harness.verdicts.results import Results, read_results
from harness.verdicts.workarounds import WorkaroundStatus, workaround_verdicts
from repro.core.wire import Spec
from repro.settings.engine_axes import unrealised

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"


@dataclass(frozen=True, order=True)
class PcCell(Cell):
    prefix_caching: bool = field(default=True, metadata=axis(
        "flag", (True, False), engine=True, id_rank=10, loop_rank=7, sort_rank=10,
        spellings=((True, ""), (False, "nopc")), option="prefix-caching", what="prefix-caching setting",
        option_words=tuple(ON_OFF.items()), plural="prefix_cachings", selection_default=(True,),
        help="prefix caching: on, off or both (default: on)"))


BASE = Cell("0.21.0", "mp", True, "keep", True)
ON = PcCell("0.21.0", "mp", True, "keep", True)
OFF = ON.replace(prefix_caching=False)


def test_ids_round_trip_and_the_default_leaves_every_id_unchanged() -> None:
    assert ON.id == BASE.id and ON.config_id == BASE.config_id and ON.engine.id == BASE.engine.id
    assert OFF.id == f"{BASE.id}-nopc" and OFF.engine.id.endswith("-nopc")
    for c in (ON, OFF, OFF.replace(scenario="weight-sync", tp=2)):
        assert parse_cell_id(c.id, PcCell) == c
        assert find_cell_id(f"test_post_resume[{c.id}]", PcCell) == c
        assert parse_config_id(c.config_id, PcCell) == c.replace(version="")
        assert PcCell.from_dict(c.to_dict()) == c
    # The base table does not know the axis: a nopc id is no id of it.
    assert find_cell_id(f"t[{OFF.id}]") is None


def test_engine_keys_and_grouping_separate_the_axis() -> None:
    assert ON.engine != OFF.engine
    assert ON.replace(mode="wait").engine == ON.engine
    plan = plan_cells([ON, ON.replace(mode="wait"), OFF], "cpu")
    assert [(k.id, len(cs)) for k, cs in plan.engines] == [(BASE.engine.id, 2), (OFF.engine.id, 1)]


def test_patterns_and_known_bug_rules_name_the_axis(tmp_path: Path) -> None:
    off = parse_pattern("prefix_caching=off", cell_type=PcCell)
    assert off.matches(OFF) and not off.matches(ON)
    assert pattern_from_mapping({"prefix_caching": True}, "rule", PcCell).matches(ON)
    assert parse_pattern("executor=mp", cell_type=PcCell).template().at("0.22.0") == ON.replace(version="0.22.0")
    table = tmp_path / "known_bugs.toml"
    table.write_text('[[bug]]\nid = "pc#1"\naffected = "<1"\n\n[[bug.cells]]\nprefix_caching = false\n'
                     'expect = "LOSS"\nk = 1\n')
    bugs = load_known_bugs(table, PcCell)
    assert expectation(OFF, bugs).outcome is Outcome.LOSS and expectation(ON, bugs).outcome is Outcome.OK


def _cr(cell: Cell, outcome: Outcome) -> CellResult:
    return CellResult(cell, outcome, "LOSS(1) in 8/8 requests" if outcome is Outcome.LOSS else "OK", label="x")


def test_workaround_pairs_stay_within_the_axis() -> None:
    # The bug an axis left out of the pairing made: the nopc async-on OK cell overwrote the default LOSS one, and
    # the verdict for a LOSS / OK pair came out REMOVABLE.  Both orders, so no insertion order hides it.
    default_pair = [_cr(ON, Outcome.LOSS), _cr(ON.replace(async_on=False), Outcome.OK)]
    nopc_pair = [_cr(OFF, Outcome.OK), _cr(OFF.replace(async_on=False), Outcome.OK)]
    for cells in (default_pair + nopc_pair, nopc_pair + default_pair):
        (verdict,) = workaround_verdicts(cells)
        assert verdict.status is WorkaroundStatus.NEEDED, verdict
        assert set(verdict.cell_ids) == {ON.id, ON.replace(async_on=False).id}
    (verdict,) = workaround_verdicts(nopc_pair)
    assert verdict.status is WorkaroundStatus.REMOVABLE and verdict.executor == "mp-nopc"


def test_the_scheduler_tier_takes_only_the_default_of_an_axis_it_does_not_vary() -> None:
    sched = ON.replace(tier="scheduler")
    assert unsupported_reason(sched, "cpu") is None
    reason = unsupported_reason(sched.replace(prefix_caching=False), "cpu")
    assert reason is not None and "prefix_caching on" in reason


def test_cli_option_selects_the_axis() -> None:
    p = argparse.ArgumentParser()
    add_axis_options(p, PcCell)
    assert "--prefix-caching" in p.format_help()
    axes = matrix_axes(p.parse_args(["--prefix-caching", "both"]), "cpu", PcCell)
    assert axes["prefix_cachings"] == (True, False)
    assert matrix_axes(p.parse_args([]), "cpu", PcCell)["prefix_cachings"] == (True,)


class _Group:
    def __init__(self) -> None:
        self.options: dict[str, dict[str, Any]] = {}

    def addoption(self, flag: str, **kwargs: Any) -> None:
        self.options[flag] = kwargs


class _Config:
    def __init__(self, **options: Any) -> None:
        self.options = {"repro_platform": "cpu", "wheelhouse": None, "vllm_versions": "0.21.0",
                        **{a.pytest_dest: None for a in plugin_axes(PcCell)}, **options}

    def getoption(self, name: str) -> Any:
        return self.options[name]


def test_pytest_option_selects_the_axis() -> None:
    group = _Group()
    add_pytest_options(group, PcCell)
    assert group.options["--vllm-prefix-caching"]["dest"] == "repro_prefix_cachings"
    cells = matrix_cells(_Config(repro_prefix_cachings="off", repro_executors="mp",  # type: ignore[arg-type]
                                 repro_scenarios="pause"), PcCell)
    assert cells and all(isinstance(c, PcCell) and not c.prefix_caching for c in cells)
    default = matrix_cells(_Config(repro_executors="mp", repro_scenarios="pause"), PcCell)  # type: ignore[arg-type]
    assert {c.prefix_caching for c in default} == {True}


def test_the_wire_spec_carries_the_axis_and_the_engine_side_refuses_one_it_cannot_realise(tmp_path: Path) -> None:
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "models")
    spec = build_spec(OFF.engine, (OFF,), cfg)
    read = Spec.from_json(spec.to_json())
    assert read.engine.axes["prefix_caching"] is False and read == spec
    # repro.settings.engine_axes has no mapping for the dummy axis: the engine refuses the cells rather than run them
    # unlabelled (adding the real axis adds its mapping there).
    assert unrealised(read.engine.axes) == ["prefix_caching"]
    assert unrealised(build_spec(BASE.engine, (BASE,), cfg).engine.axes) == []
    assert "VLLM_USE_V2_MODEL_RUNNER" in engine_env(OFF.engine, cfg, tmp_path)


def _history_sources() -> list[tuple[Path, str]]:
    """The committed reports the committed history holds, with the run id it recorded."""
    runs = [json.loads(line) for line in (DOCS / "history" / "history.jsonl").read_text().splitlines() if line]
    out = []
    for run in runs:
        src = Path(__file__).resolve().parents[2] / str(run.get("source") or "/")
        path = next((p for p in (src, src.with_name(src.name + ".xz"), src.with_name(src.name + ".gz")) if p.exists()),
                    src)
        if str(run.get("source") or "").startswith("docs/") and path.exists():
            out.append((path, run["run_id"]))
    return out


HISTORY = _history_sources()
FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "results").glob("*.json*"))


def _moved(results: Results) -> Results:
    """The same report with every cell of the table that has the new axis (at its default)."""
    cells = tuple(dataclasses.replace(cr, cell=PcCell(**dataclasses.asdict(cr.cell))) for cr in results.cells)
    return Results(cells, results.meta)


@pytest.mark.parametrize("path", [p for p, _ in HISTORY] + FIXTURES, ids=lambda p: p.name)
def test_committed_reports_keep_their_run_ids(path: Path) -> None:
    results = read_results(path)
    moved = _moved(results)
    assert run_id_of(moved) == run_id_of(results)
    # At its default the new axis is not written (files of this schema read back as they were written).
    assert [cr.to_dict() for cr in moved.cells] == [cr.to_dict() for cr in results.cells]
    off = dataclasses.replace(moved.cells[0], cell=moved.cells[0].cell.replace(prefix_caching=False))
    assert off.to_dict()["cell"]["prefix_caching"] is False
    assert identity_form(off.to_dict(), PcCell)["cell"]["prefix_caching"] is False
    assert run_id_of(Results((off, *moved.cells[1:]), results.meta)) != run_id_of(results)


def test_run_ids_recorded_in_the_committed_history_are_reproduced_with_the_new_axis() -> None:
    assert len(HISTORY) >= 10
    recorded = dict(HISTORY)
    # Two reports of each schema the history holds (schema 1 cpu, schema 2 gpu), as recorded when added.
    for name, run_id in (("0.21.0-0.22.0-mp-async_on-wait-abort.json", "711a6ffd90ccedd3"),
                         ("s2-0.22.0-uni.json", "0cb84d489ebe58f1")):
        (path,) = [p for p in recorded if p.name.removesuffix(".xz").removesuffix(".gz") == name]
        assert recorded[path] == run_id
        assert run_id_of(_moved(read_results(path))) == run_id
