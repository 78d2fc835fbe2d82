"""History: append-only runs, outcomes over time, the heat-map PNG, and clear errors for bad files."""

from __future__ import annotations

import io
import json
import re
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console
from synthetic_runs import RUNNING, infra, ran, report, write

from harness.core.cell import Cell
from harness.core.errors import BadInput, ReproError, ResultsFileError
from harness.core.oracle import Outcome
from harness.core.outcome_groups import COLORS, Category, category
from harness.core.records import legacy_label as cell_label
from harness.core.versions import version_order
from harness.verdicts.history.plot import PlotUnavailable, plot
from harness.verdicts.history.store import SCHEMA, HistoryCell, Run, add_run, read_history
from harness.verdicts.history.table import render_history
from harness.verdicts.history.view import show
from harness.verdicts.results import ResultsLog

pytestmark = pytest.mark.unit

KEEP_CLEAR_ON = "mp-async_on-keep-clear"
KEEP_CLEAR_OFF = "mp-async_off-keep-clear"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def nightly(created: str, *, v21_lose: int = RUNNING, **meta: object) -> object:
    """The default CPU matrix in miniature: 0.21.0 loses a token in keep+clear async-on, 0.32.0 does not."""
    return report((
        ran("0.21.0", True, lose=v21_lose),
        ran("0.21.0", False),
        ran("0.21.0", True, clear=False),
        ran("0.32.0", True),
        ran("0.32.0", False),
        infra("0.32.0", Outcome.UNSUPPORTED, "Ray executors do not run on vLLM's CPU platform", executor="ray-v2"),
    ), created, **meta)


@pytest.fixture
def hist(tmp_path: Path) -> Path:
    return tmp_path / "hist" / "history.jsonl"


def add(hist: Path, results: object, tmp_path: Path, name: str) -> object:
    return add_run(hist, write(results, tmp_path / name / "results.json"), now=NOW)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- add


def test_add_appends_one_schema_versioned_line_per_run(hist: Path, tmp_path: Path) -> None:
    r1 = add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "n1")
    r2 = add(hist, nightly("2026-11-30T02:00:00+00:00"), tmp_path, "n2")
    assert r1.added and r2.added and r1.run.run_id != r2.run.run_id
    lines = hist.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert (first["schema"], first["schema_version"]) == (SCHEMA, 1)
    assert first["meta"]["platform"] == "cpu" and first["meta"]["devices"] == ["AMD EPYC"]
    cell = next(c for c in first["cells"] if c["id"] == "vllm0.21.0-mp-async_on-keep-clear")
    assert (cell["outcome"], cell["label"]) == ("LOSS", "LOSS(1)")
    assert r2.message.startswith(f"added run {r2.run.run_id} (6 cells, cpu")
    assert r2.run.line == 2


def test_adding_the_same_run_twice_does_not_duplicate_it(hist: Path, tmp_path: Path) -> None:
    results = nightly("2026-11-29T02:00:00+00:00")
    json_path = write(results, tmp_path / "r" / "results.json")
    assert add_run(hist, json_path, now=NOW).added
    again = add_run(hist, json_path, now=NOW)
    assert not again.added and again.duplicate_of is not None and again.duplicate_of.line == 1
    assert "already in" in again.message and "not added again" in again.message
    # The JSONL log of the same run is the same run (same cells, no meta).
    log = ResultsLog(tmp_path / "r" / "results.jsonl")
    for c in reversed(results.cells):  # written in completion order, not report order
        log.append(c)
    assert not add_run(hist, log.path, now=NOW).added
    assert len(hist.read_text().splitlines()) == 1


def test_add_refuses_a_report_with_repeated_cells(hist: Path, tmp_path: Path) -> None:
    log = ResultsLog(tmp_path / "results.jsonl")
    log.append(ran("0.21.0", True, lose=RUNNING))
    log.append(ran("0.21.0", True))
    with pytest.raises(ResultsFileError, match=r"more than once.*vllm0\.21\.0-mp-async_on-keep-clear"):
        add_run(hist, log.path)
    assert not hist.exists() or hist.read_text() == ""


def test_add_completes_a_last_line_without_newline(hist: Path, tmp_path: Path) -> None:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "n1")
    hist.write_text(hist.read_text().rstrip("\n"))
    add(hist, nightly("2026-11-30T02:00:00+00:00"), tmp_path, "n2")
    assert len(read_history(hist).runs) == 2


# ---------------------------------------------------------------------- bad files


def _bad_line_cases(tmp_path: Path, hist: Path) -> list[tuple[str, str]]:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "n1")
    good = hist.read_text()
    future = json.loads(good)
    future["schema_version"] = 2
    no_cells = json.loads(good)
    del no_cells["cells"]
    results_doc = json.loads((tmp_path / "n1" / "results.json").read_text())
    return [
        (good + '{"schema": "vllm-repro/history", "schema_ver\n', r":2: corrupt history line \(.*column"),
        (good + json.dumps(future) + "\n", r":2: history schema_version 2 is not supported .*upgrade vllm-repro"),
        (good + json.dumps(no_cells) + "\n", r":2: cells: missing \(expected a list"),
        (json.dumps(results_doc) + "\n", r":1: not a vllm-repro/history line .*history add"),
        (good + '"just a string"\n', r":2: not a vllm-repro/history line"),
    ]


@pytest.mark.parametrize("case", range(5))
def test_bad_history_files_name_file_line_and_problem(case: int, hist: Path, tmp_path: Path) -> None:
    text, pattern = _bad_line_cases(tmp_path, hist)[case]
    hist.write_text(text)
    with pytest.raises(ResultsFileError, match=re.escape(str(hist)) + pattern) as err:
        read_history(hist)
    assert isinstance(err.value, ReproError)  # the CLI's exit 2
    # A corrupt history is never appended to.
    with pytest.raises(ResultsFileError, match=re.escape(str(hist)) + pattern):
        add(hist, nightly("2026-11-30T02:00:00+00:00"), tmp_path, "n2")
    assert hist.read_text() == text


def test_truncated_last_line_says_so(hist: Path, tmp_path: Path) -> None:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "n1")
    hist.write_text(hist.read_text()[:-40])
    with pytest.raises(ResultsFileError, match=r":1: corrupt history line .*interrupted write"):
        read_history(hist)


def test_missing_history_file_says_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(ResultsFileError, match="does not exist; start it with `vllm-repro history add"):
        read_history(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(("content", "pattern"), [
    ('{"schema": "vllm-repro/results", "schema_version": 99, "cells": []}', r"schema_version 99 is not supported"),
    ('{"schema": "vllm-repro/results", "cells": [', r"corrupt JSON"),
])
def test_bad_results_file_is_refused_naming_it(content: str, pattern: str, hist: Path, tmp_path: Path) -> None:
    bad = tmp_path / "results.json"
    bad.write_text(content)
    with pytest.raises(ResultsFileError, match=re.escape(str(bad)) + ".*" + pattern):
        add_run(hist, bad)
    assert not hist.exists()


# ---------------------------------------------------------------------- show


def test_show_orders_runs_by_when_they_happened_not_when_added(hist: Path, tmp_path: Path) -> None:
    # The newer run (0.21.0 fixed, say by a backport) is added first, an older one later (a backfill).
    add(hist, nightly("2026-11-30T02:00:00+00:00", v21_lose=0), tmp_path, "new")
    add(hist, nightly("2026-11-28T02:00:00+00:00"), tmp_path, "old")
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "mid")
    view = show(read_history(hist))
    s = view.find(KEEP_CLEAR_ON, "0.21.0")
    assert s is not None
    assert [o.label for o in s.observations] == ["LOSS(1)", "LOSS(1)", "OK"]
    assert s.latest.label == "OK" and s.since.created.startswith("2026-11-30")
    assert view.versions == ("0.21.0", "0.32.0")
    assert view.runs == 3
    out = io.StringIO()
    render_history(view, Console(file=out, width=200))
    text = out.getvalue()
    assert "LOSS(1) ×2 → OK" in text and "3 run(s)" in text


def test_show_filters_cells_versions_and_platform(hist: Path, tmp_path: Path) -> None:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "cpu")
    add(hist, report((ran("0.21.0", True, lose=RUNNING, platform="cuda", device="NVIDIA H100"),),
                     "2026-11-29T03:00:00+00:00", platform="cuda"), tmp_path, "gpu")
    view = show(read_history(hist), cells=["mp-async_on-*"], versions=["0.21.0"])
    assert {(view.label(s.row), s.version) for s in view.series} == {
        ("mp-async_on-keep-clear (cpu)", "0.21.0"), ("mp-async_on-keep-noclear (cpu)", "0.21.0"),
        ("mp-async_on-keep-clear (cuda)", "0.21.0")}
    only_cuda = show(read_history(hist), platform="cuda")
    assert [view.label(s.row) for s in only_cuda.series] == [KEEP_CLEAR_ON + " (cuda)"]
    assert [only_cuda.label(s.row) for s in only_cuda.series] == [KEEP_CLEAR_ON]
    hidden = show(read_history(hist), hide_unsupported=True)
    assert hidden.hidden_unsupported_rows == 1 and all(s.row.config != "ray-v2-async_on-keep-clear"
                                                       for s in hidden.series)


def test_injected_runs_are_labelled_and_kept_apart(hist: Path, tmp_path: Path) -> None:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "upstream")
    injected = report((ran("0.32.0", True, lose=RUNNING, inject={"requested": ["vllm#42043"]}),),
                      "2026-11-30T02:00:00+00:00", inject=["vllm#42043"])
    r = add(hist, injected, tmp_path, "inj")
    assert r.run.inject == ("vllm#42043",) and "fault injection vllm#42043" in r.message
    view = show(read_history(hist))
    assert view.injected_runs == 1
    upstream = view.find(KEEP_CLEAR_ON, "0.32.0")
    inj = view.find(KEEP_CLEAR_ON, "0.32.0", inject=("vllm#42043",))
    assert upstream is not None and upstream.latest.label == "OK"
    assert inj is not None and inj.latest.label == "LOSS(1)"
    assert view.label(inj.row) == KEEP_CLEAR_ON + " [inject vllm#42043]"
    out = io.StringIO()
    render_history(view, Console(file=out, width=250))
    assert "[inject vllm#42043]" in out.getvalue() and "nothing about upstream" in out.getvalue()
    without = show(read_history(hist), include_injected=False)
    assert without.excluded_injected_runs == 1 and all(not s.row.inject for s in without.series)


def test_runs_with_another_model_or_engine_arguments_get_rows_of_their_own(hist: Path, tmp_path: Path) -> None:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "bigram")
    mine = report((ran("0.32.0", True, lose=RUNNING),), "2026-11-30T02:00:00+00:00",
                  model={"kind": "qwen3-random", "label": "qwen3-random", "params": {}},
                  engine_args={"enable_prefix_caching": False}, preset=None)
    add(hist, mine, tmp_path, "mine")
    view = show(read_history(hist))
    plain = view.find(KEEP_CLEAR_ON, "0.32.0")
    assert plain is not None and plain.latest.label == "OK"  # the other model's LOSS is not this row's
    other = next(s for s in view.series if s.row.setup and s.version == "0.32.0")
    assert other.latest.label == "LOSS(1)"
    assert view.label(other.row) == KEEP_CLEAR_ON + " [model qwen3-random, enable_prefix_caching=false]"


def test_engine_reported_injection_counts_even_without_meta(hist: Path, tmp_path: Path) -> None:
    results = report((ran("0.32.0", True, lose=RUNNING, inject={"requested": ["vllm#42043"], "applied": {}}),),
                     "2026-11-30T02:00:00+00:00")
    assert add(hist, results, tmp_path, "inj").run.inject == ("vllm#42043",)


def test_show_selects_cells_by_cell_pattern_too(hist: Path, tmp_path: Path) -> None:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "cpu")
    by_glob = show(read_history(hist), cells=["mp-async_on-*"])
    by_pattern = show(read_history(hist), cells=["executor=mp,async=on"])
    split = show(read_history(hist), cells=["executor=mp", "async=on"])  # as --cells splits on commas
    assert by_pattern.series == split.series == by_glob.series and len(by_glob.series) == 3
    both = show(read_history(hist), cells=["clear_cache=false", "ray-v2-*"])
    assert {s.row.config for s in both.series} == {"mp-async_on-keep-noclear", "ray-v2-async_on-keep-clear"}
    with pytest.raises(BadInput, match="cell key"):
        show(read_history(hist), cells=["colour=red"])


def test_history_cells_hold_a_cell_and_keep_the_schema_1_line_form() -> None:
    line = {"id": "vllm0.21.0-mp-async_on-keep-clear-tp2", "version": "0.21.0", "executor": "mp", "async": True,
            "mode": "keep", "clear_cache": True, "tp": 2, "scenario": "pause", "outcome": "LOSS",
            "summary": "LOSS(1) in 8/10 requests", "reason": None, "expectation": "as expected",
            "expected": "LOSS(1)", "vllm_version": "0.21.0", "device": "H200", "inject": []}
    old = HistoryCell.from_dict(line)  # an early line: no label, model_runner, batch_invariant or tier
    assert old.cell == Cell("0.21.0", "mp", True, "keep", True, tp=2) and old.label == "LOSS(1)"
    assert (old.id, old.version, old.config) == (line["id"], "0.21.0", "mp-async_on-keep-clear-tp2")
    written = old.to_dict()
    assert "tier" not in written and written["async"] is True
    assert {k: v for k, v in written.items() if k in line} == line
    sched = HistoryCell(old.cell.replace(tier="scheduler"), "OK", "OK", "OK 10/10")
    assert sched.to_dict()["tier"] == "scheduler" and HistoryCell.from_dict(sched.to_dict()) == sched


def test_unknown_outcomes_from_a_newer_writer_still_show(hist: Path) -> None:
    def cell(version: str, outcome: str, summary: str) -> HistoryCell:
        return HistoryCell(Cell(version, "mp", True, "keep", True), outcome, cell_label(outcome, summary), summary)

    run = Run("abc", "2026-11-30T00:00:00+00:00", "x", {"platform": "cpu"},
              (cell("0.21.0", "FLAKY", "FLAKY(LOSS(1) 2/3)"), cell("0.32.0", "SOMETHING-NEW", "?")))
    hist.parent.mkdir(parents=True)
    hist.write_text(json.dumps(run.to_dict()) + "\n")
    view = show(read_history(hist))
    labels = {s.version: s.latest.label for s in view.series}
    assert labels == {"0.21.0": "FLAKY(LOSS(1) 2/3)", "0.32.0": "SOMETHING-NEW"}
    assert category("FLAKY") is Category.FLAKY and category("SOMETHING-NEW") is Category.OTHER


def test_categories() -> None:
    assert category("OK") is Category.OK
    for o in ("LOSS", "DUPLICATE", "DIVERGED", "TRUNCATED"):
        assert category(o) is Category.TOKEN_FAULT
    for o in ("ERROR", "TIMEOUT", "BUILD-FAILED"):
        assert category(o) is Category.INFRA
    assert category("UNSUPPORTED") is Category.UNSUPPORTED
    assert category(None) is Category.NOT_RUN


def test_cell_label() -> None:
    assert cell_label("LOSS", "LOSS(1) in 8/10 requests (8/8 running at pause)") == "LOSS(1)"
    assert cell_label("LOSS", "LOSS(1,2) in 3/10 requests") == "LOSS(1,2)"
    assert cell_label("OK", "OK 10/10") == "OK"
    assert cell_label("UNSUPPORTED", "Ray executors do not run") == "UNSUPPORTED"
    assert cell_label("BUILD-FAILED", "BUILD-FAILED: no wheel") == "BUILD-FAILED"


def test_version_order_numeric_with_commit_labels() -> None:
    labels = ["0.32.0", "0ab12cd34ef5", "0.9.0", "0.21.0", "0.10.0", "0.21.0rc1", "deadbeef0000", "0.22.0"]
    hints = {"0ab12cd34ef5": "0.21.1.dev40+g0ab12cd34"}  # the wheel's own version places the commit
    assert version_order(labels, hints) == ["0.9.0", "0.10.0", "0.21.0rc1", "0.21.0", "0ab12cd34ef5", "0.22.0",
                                            "0.32.0", "deadbeef0000"]


# ---------------------------------------------------------------------- plot


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return tuple(int(hex_color[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def _red(rgb: tuple[int, int, int]) -> bool:
    # What a reader calls red, whatever the palette constants say.
    r, g, b = rgb
    return r >= 170 and g <= 90 and b <= 90


def _green(rgb: tuple[int, int, int]) -> bool:
    r, g, b = rgb
    return g >= 120 and r <= 100 and b <= 100


def _dominant(png: object, box: tuple[int, int, int, int]) -> tuple[int, int, int]:
    x0, y0, x1, y1 = box
    region = png[y0:y1, x0:x1, :3]  # type: ignore[index]
    pixels = Counter(tuple(round(float(v) * 255) for v in px) for row in region for px in row)
    return pixels.most_common(1)[0][0]


def test_plot_colours_0_21_red_and_0_32_green(hist: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "n1")
    add(hist, report((ran("0.32.0", True, lose=RUNNING, inject=["vllm#42043"]),), "2026-11-30T02:00:00+00:00",
                     inject=["vllm#42043"]), tmp_path, "inj")
    layout = plot(read_history(hist), tmp_path / "out" / "history.png")
    png = imread(layout.path)
    assert png.shape[:2] == (layout.height, layout.width)
    red, green = layout.box(KEEP_CLEAR_ON, "0.21.0"), layout.box(KEEP_CLEAR_ON, "0.32.0")
    assert (red.label, green.label) == ("LOSS(1)", "OK")
    assert _dominant(png, red.box) == _rgb(COLORS[Category.TOKEN_FAULT]) and _red(_dominant(png, red.box))
    assert _dominant(png, green.box) == _rgb(COLORS[Category.OK]) and _green(_dominant(png, green.box))
    # Neighbours check the geometry: the async-off row above is green, the ray row grey, a missing box white.
    assert _dominant(png, layout.box(KEEP_CLEAR_OFF, "0.21.0").box) == _rgb(COLORS[Category.OK])
    assert _dominant(png, layout.box("ray-v2-async_on-keep-clear", "0.32.0").box) == _rgb(
        COLORS[Category.UNSUPPORTED])
    assert _dominant(png, layout.box("ray-v2-async_on-keep-clear", "0.21.0").box) == (255, 255, 255)
    # The injected LOSS on 0.32.0 is left out: it must not read as an upstream regression.
    assert layout.excluded_injected_runs == 1
    assert not any("inject" in r for r in layout.rows)


def test_plot_follows_the_data(hist: Path, tmp_path: Path) -> None:
    # The same pixel check on swapped data: 0.21.0 green, 0.32.0 red (so the check above can fail).
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    add(hist, report((ran("0.21.0", True), ran("0.32.0", True, lose=3)), "2026-11-29T02:00:00+00:00"),
        tmp_path, "n1")
    layout = plot(read_history(hist), tmp_path / "swapped.png")
    png = imread(layout.path)
    assert _green(_dominant(png, layout.box(KEEP_CLEAR_ON, "0.21.0").box))
    assert _red(_dominant(png, layout.box(KEEP_CLEAR_ON, "0.32.0").box))


def test_plot_with_injected_runs_gives_them_their_own_row(hist: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "n1")
    add(hist, report((ran("0.32.0", True, lose=RUNNING, inject=["vllm#42043"]),), "2026-11-30T02:00:00+00:00",
                     inject=["vllm#42043"]), tmp_path, "inj")
    layout = plot(read_history(hist), tmp_path / "inj.png", include_injected=True)
    png = imread(layout.path)
    inj_row = KEEP_CLEAR_ON + " [inject vllm#42043]"
    assert inj_row in layout.rows
    assert _red(_dominant(png, layout.box(inj_row, "0.32.0").box))
    assert _green(_dominant(png, layout.box(KEEP_CLEAR_ON, "0.32.0").box))


def test_plot_of_nothing_is_bad_input(hist: Path, tmp_path: Path) -> None:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "n1")
    with pytest.raises(BadInput, match="nothing to plot"):
        plot(read_history(hist), tmp_path / "x.png", versions=["0.99.0"])


def test_plot_without_matplotlib_says_how_to_install(hist: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "n1")
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(PlotUnavailable, match=r"pip install 'vllm-repro\[plot\]'") as err:
        plot(read_history(hist), tmp_path / "x.png")
    assert isinstance(err.value, ReproError)
    assert not (tmp_path / "x.png").exists()


def test_weight_sync_cells_are_rows_of_their_own(tmp_path: Path) -> None:
    from dataclasses import replace as dc_replace

    pause = ran("0.21.0", lose=1)
    wsync = dc_replace(ran("0.21.0"), cell=dc_replace(pause.cell, scenario="weight-sync"))
    hist = tmp_path / "h.jsonl"
    add_run(hist, write(report((pause, wsync), "2026-11-30T10:00:00+00:00"), tmp_path / "r.json"))
    view = show(read_history(hist))
    configs = sorted({s.row.config for s in view.series})
    assert configs == [KEEP_CLEAR_ON, KEEP_CLEAR_ON + "-weight_sync"]
    assert {s.row.config: s.latest.label for s in view.series} == {
        KEEP_CLEAR_ON: "LOSS(1)", KEEP_CLEAR_ON + "-weight_sync": "OK"}


def test_a_history_cell_with_an_unknown_axis_value_names_its_line(hist: Path, tmp_path: Path) -> None:
    add(hist, nightly("2026-11-29T02:00:00+00:00"), tmp_path, "n1")
    run = json.loads(hist.read_text())
    run["cells"][0]["tier"] = "quantum"
    hist.write_text(json.dumps(run) + "\n")
    with pytest.raises(ResultsFileError,
                       match=r":1: cells\[0\]\.tier: expected one of engine, scheduler, found 'quantum'"):
        read_history(hist)
