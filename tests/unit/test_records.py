"""Typed cell results, the one schema check, the migration of older files and stable run ids.

The report fixtures under tests/fixtures/results/ are cut from the reports committed under docs/results/
(schema 1, 2 and 3, both tiers, every outcome; tests/fixtures/results/README.md says which): each must load,
round-trip, re-render exactly as its committed Markdown, and keep its run id across the schema upgrade.
Every committed report itself is loaded and rendered by the ``slow`` test in test_committed_reports.py.
"""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path
from typing import Any

import pytest
from synthetic_runs import RUNNING, infra, ran, report

from harness.core.cell import BY_NAME, Cell
from harness.core.errors import ResultsFileError
from harness.core.oracle import Outcome
from harness.core.records import (
    LINE,
    RESULTS,
    SCHEMA_VERSION,
    CellResult,
    EngineInfo,
    ExpectationRecord,
    RepeatSummary,
    RequestRecord,
    RequestVerdictRecord,
    Schema,
    identity_form,
    legacy_label,
    migrate_cell,
)
from harness.verdicts.compare.pairs import compare
from harness.verdicts.compare.render import markdown as compare_markdown
from harness.verdicts.history.store import run_id_of
from harness.verdicts.report.markdown import markdown
from harness.verdicts.results import Results, ResultsLog, read_bytes, read_results

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"
REPORTS = sorted(FIXTURES.glob("*.json*"))


def _text(path: Path) -> str:
    """A results file's text (``.gz`` and ``.xz`` ones are compressed)."""
    return read_bytes(path).decode()


def _is_log(path: Path) -> bool:
    return ".jsonl" in path.suffixes


def _first_doc(path: Path) -> dict[str, Any]:
    text = _text(path)
    return dict(json.loads(text.splitlines()[0] if _is_log(path) else text))


def _cells_of(path: Path) -> list[dict[str, Any]]:
    if _is_log(path):
        return [json.loads(line) for line in _text(path).splitlines() if line.strip()]
    return list(json.loads(_text(path))["cells"])


def check_round_trip(path: Path) -> Results:
    """``path`` loads, and each cell written back is what was read (plus, for older schemas, the new fields and
    the axes an older writer left out at their defaults)."""
    results = read_results(path)
    originals = _cells_of(path)
    assert len(results.cells) == len(originals)
    if _first_doc(path)["schema_version"] == SCHEMA_VERSION:  # written by this schema: back exactly as it was
        assert [cr.to_dict() for cr in results.cells] == [
            {k: v for k, v in o.items() if k not in ("schema", "schema_version")} for o in originals]
        return results
    for cr, orig in zip(results.cells, originals, strict=True):
        orig = {k: v for k, v in orig.items() if k not in ("schema", "schema_version")}
        implicit = {k: v for k, v in cr.cell.to_dict().items() if k not in orig["cell"] and k != "tier"}
        assert all(v == BY_NAME[k].default for k, v in implicit.items())
        assert identity_form(cr.to_dict()) == identity_form({**orig, "cell": {**orig["cell"], **implicit}})
        # Schema 1 had no tier (engine); schema 2 reports of the scheduler tier say so.
        assert cr.cell.tier == orig["cell"].get("tier", "engine")
        assert cr.label == orig.get("label", legacy_label(orig["outcome"], orig["summary"]))
        assert cr.to_dict()["label"] == cr.label and cr.attempts == ()
        # Every request verdict gained its fault events: the one LOSS/DUPLICATE an older oracle named.
        for req in cr.requests:
            v = req.verdict
            assert v is not None and [e.label for e in v.events] == ([v.label] if v.outcome in ("LOSS",
                                                                                            "DUPLICATE") else [])
    return results


# ---------------------------------------------------------------------- report fixtures


def test_the_fixtures_hold_every_schema_tier_and_outcome() -> None:
    docs = [(_first_doc(p), read_results(p)) for p in REPORTS]
    assert {d["schema_version"] for d, _ in docs} == set(range(1, SCHEMA_VERSION + 1))
    assert {c.cell.tier for _, r in docs for c in r.cells} == {"engine", "scheduler"}
    assert {c.outcome for _, r in docs for c in r.cells} == set(Outcome)
    assert any(p.suffix == ".gz" for p in REPORTS) and any(_is_log(p) for p in REPORTS)


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.name)
def test_every_fixture_loads_round_trips_and_re_renders_as_committed(path: Path) -> None:
    results = check_round_trip(path)
    golden = FIXTURES / (path.name.split(".")[0] + ".md")
    assert markdown(results) == golden.read_text(encoding="utf-8")


def test_a_comparison_of_fixtures_re_renders_as_committed() -> None:
    a, b = (read_results(FIXTURES / n) for n in ("schema1-cpu.json", "schema1-gpu.json"))
    cmp = compare(a, b, "schema1-cpu.json", "schema1-gpu.json")
    assert compare_markdown(cmp) == (FIXTURES / "compare-schema1-cpu-vs-gpu.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["schema1-cpu.json", "schema2-sched.json"])
def test_run_ids_survive_the_schema_upgrade(name: str, tmp_path: Path) -> None:
    results = read_results(FIXTURES / name)
    # Re-written at the current schema (tier, label, fault events and attempts written out), the report is
    # still the same run.
    rewritten = tmp_path / "results.json"
    rewritten.write_text(json.dumps(results.to_dict()))
    again = read_results(rewritten)
    assert json.loads(rewritten.read_text())["schema_version"] == SCHEMA_VERSION == 3
    assert run_id_of(again) == run_id_of(results) and again.meta["migrated_from"] == results.meta["migrated_from"]


def test_a_non_default_new_axis_changes_the_run_id() -> None:
    cr = ran("0.21.0")
    sched = CellResult(cr.cell.replace(tier="scheduler"), cr.outcome, cr.summary, label=cr.label)
    created = "2026-11-30T00:00:00+00:00"
    assert run_id_of(report((cr,), created)) != run_id_of(report((sched,), created))
    assert "tier" not in identity_form(cr.to_dict())["cell"]
    assert identity_form(sched.to_dict())["cell"]["tier"] == "scheduler"


# ---------------------------------------------------------------------- schema check and migration


def test_schema_check_reads_every_version_up_to_the_current_one() -> None:
    assert RESULTS.check({"schema": RESULTS.name, "schema_version": 1}, "f") == 1
    assert LINE.check({"schema": LINE.name, "schema_version": 2}, "f") == 2
    for bad, match in ((99, "schema_version 99 is not supported .*reads 1 to 3.*upgrade vllm-repro"),
                       (0, "schema_version 0 .*damaged"), (True, "schema_version True"), (None, "None")):
        with pytest.raises(ResultsFileError, match=match):
            RESULTS.check({"schema": RESULTS.name, "schema_version": bad}, "f")
    with pytest.raises(ResultsFileError, match=r"f: not a vllm-repro/results document \(schema 'x'\)!"):
        RESULTS.check({"schema": "x"}, "f", lambda found: "!")
    with pytest.raises(ResultsFileError, match=r"not a vllm-repro/cell line \(schema 'list'\)"):
        LINE.check([], "f")
    with pytest.raises(ResultsFileError, match=r"run schema_version 2 is not supported .*reads 1\)"):
        Schema("vllm-repro/run", 1, label="run ").check({"schema": "vllm-repro/run", "schema_version": 2}, "f")


def test_migration_adds_tier_and_the_label_once() -> None:
    v1 = {"cell": {"version": "0.21.0", "executor": "mp", "async_scheduling": True, "mode": "keep",
                   "clear_cache": True}, "outcome": "LOSS", "summary": "LOSS(1,2) in 3/10 requests"}
    v3 = migrate_cell(v1, 1)
    assert v3["cell"]["tier"] == "engine" and v3["label"] == "LOSS(1,2)" and "tier" not in v1["cell"]
    assert migrate_cell(v3, 3) == v3
    assert CellResult.from_dict({**v3, "summary": "anything"}).label == "LOSS(1,2)"  # stored, not re-derived


def test_migration_to_3_recovers_fault_events_and_adds_no_attempts() -> None:
    loss = {"rid": "r0", "verdict": {"outcome": "LOSS", "label": "LOSS(1 at 6)", "at": 6, "k": 1}}
    dup = {"rid": "r1", "verdict": {"outcome": "DUPLICATE", "label": "DUPLICATE(2 at 5)", "at": 5, "k": 2}}
    div = {"rid": "r2", "verdict": {"outcome": "DIVERGED", "label": "DIVERGED(at 3)", "at": 3, "k": None}}
    unjudged = {"rid": "r3"}
    v2 = {"cell": {"version": "0.21.0", "executor": "mp", "async_scheduling": True, "mode": "keep",
                   "clear_cache": True, "tier": "engine"}, "outcome": "LOSS", "label": "LOSS(1,2)",
          "summary": "LOSS(1,2) in 2/4 requests", "requests": [loss, dup, div, unjudged]}
    v3 = migrate_cell(v2, 2)
    assert v3["attempts"] == [] and v3["requests"][3] == unjudged
    assert [r["verdict"]["events"] for r in v3["requests"][:3]] == [
        [{"kind": "LOSS", "k": 1, "at": 6}], [{"kind": "DUPLICATE", "k": 2, "at": 5}], []]
    assert identity_form(v3) == identity_form(v2) and "label" not in identity_form(v2)
    cr = CellResult.from_dict(v3)
    assert [r.verdict.short for r in cr.requests[:3]] == ["LOSS(1)", "DUPLICATE(2)", "DIVERGED"]


def test_results_files_of_both_versions_load(tmp_path: Path) -> None:
    cr = ran("0.21.0", lose=RUNNING)
    log = tmp_path / "results.jsonl"
    old = {"schema": LINE.name, "schema_version": 1, **cr.to_dict()}
    del old["label"], old["cell"]["tier"]
    log.write_text(json.dumps(old) + "\n")
    ResultsLog(log).append(cr)  # a resumed run appends schema-2 lines to a schema-1 log
    first, second = read_results(log).cells
    assert first == second == cr and cr.label == "LOSS(1)"


def test_a_gzipped_report_reads_as_the_file_inside(tmp_path: Path) -> None:
    doc = {"schema": RESULTS.name, "schema_version": SCHEMA_VERSION, "cells": [ran("0.21.0", lose=RUNNING).to_dict()]}
    plain, packed = tmp_path / "results.json", tmp_path / "results.json.gz"
    plain.write_text(json.dumps(doc))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_results(packed) == read_results(plain)
    log = tmp_path / "results.jsonl.gz"
    log.write_bytes(gzip.compress((json.dumps({"schema": LINE.name, "schema_version": SCHEMA_VERSION,
                                               **ran("0.21.0").to_dict()}) + "\n").encode()))
    assert [c.id for c in read_results(log).cells] == [ran("0.21.0").id]
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"not gzip")
    with pytest.raises(ResultsFileError, match=r"broken\.json\.gz"):
        read_results(broken)
    # The big committed reports are xz (ten times smaller than gzip for a GPU matrix).
    xz = tmp_path / "results.json.xz"
    xz.write_bytes(lzma.compress(plain.read_bytes()))
    assert read_results(xz) == read_results(plain)
    (tmp_path / "broken.json.xz").write_bytes(b"not xz")
    with pytest.raises(ResultsFileError, match=r"broken\.json\.xz"):
        read_results(tmp_path / "broken.json.xz")


def test_unreadable_cells_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "r.json"
    bad.write_text(json.dumps({"schema": RESULTS.name, "schema_version": 1,
                               "cells": [{**ran("0.21.0").to_dict(), "engine": "a string"}]}))
    with pytest.raises(ResultsFileError, match=r"r\.json: cells\[0\]\.engine: expected an object, found 'a string'"):
        read_results(bad)


# ---------------------------------------------------------------------- the records


@pytest.mark.parametrize("lose", [0, 1, RUNNING])
@pytest.mark.parametrize("k", [1, 2])
def test_the_oracle_label_is_what_schema_1_files_recover(lose: int, k: int) -> None:
    cr = ran("0.21.0", lose=lose, k=k)
    assert cr.label == legacy_label(cr.outcome.value, cr.summary) == ("OK" if not lose else f"LOSS({k})")
    down = infra("0.21.0", Outcome.TIMEOUT, "TIMEOUT(ish) after 5s")
    assert down.label == "TIMEOUT" and legacy_label("TIMEOUT", down.summary) == "TIMEOUT(ish)"


def test_records_read_their_json_form() -> None:
    raw = {"vllm_version": "0.21.0", "torch_version": "2.11.0", "device_name": "H200", "platform": "cuda",
           "effective": {"async_scheduling": True, "executor_class": "MultiprocExecutor"},
           "probe": {"core": {"inject": {"requested": ["vllm#42043"]}}}, "extra": [1]}
    exp = {"status": "UNEXPECTED", "expected": "LOSS(1)", "bug": "vllm#42043", "message": "m"}
    cr = CellResult(Cell("0.21.0", "mp", True, "keep", True), Outcome.OK, "OK 10/10", engine=raw,
                    expectation=exp, repeats={"n": 2, "outcomes": {"OK": 2}})
    assert isinstance(cr.engine, EngineInfo) and cr.engine["extra"] == [1] and dict(cr.engine) == raw
    assert (cr.engine.vllm_version, cr.engine.device_name, cr.engine.effective_async, cr.engine.executor_class,
            cr.engine.inject) == ("0.21.0", "H200", True, "MultiprocExecutor", ("vllm#42043",))
    assert cr.expectation == ExpectationRecord("UNEXPECTED", "LOSS(1)", "vllm#42043", "m")
    assert cr.expectation.describe() == "UNEXPECTED (expected LOSS(1) from vllm#42043)"
    assert cr.repeats == RepeatSummary(2, {"OK": 2})
    d = cr.to_dict()
    assert (d["engine"], d["expectation"], d["label"]) == (raw, exp, "OK")
    assert CellResult.from_dict(json.loads(json.dumps(d))) == cr
    assert Results((cr,)).to_dict()["schema_version"] == SCHEMA_VERSION


def test_expectation_descriptions() -> None:
    assert ExpectationRecord("as expected", "LOSS(1)", "vllm#42043").describe() == "as expected (vllm#42043)"
    assert ExpectationRecord("as expected", "OK").describe() == "as expected"
    assert ExpectationRecord("UNEXPECTED", "OK").describe() == "UNEXPECTED (expected OK)"
    assert ExpectationRecord(None).describe() == ""


def test_request_records_are_typed_and_kept_whole() -> None:
    cr = ran("0.21.0", lose=1)
    first, late = cr.requests[0], cr.requests[-1]
    assert isinstance(first, RequestRecord) and first.rid == first["rid"] and first.submit == "start"
    v = first.verdict
    assert isinstance(v, RequestVerdictRecord)
    assert (v.outcome, v.k, v.short, v.running_at_pause) == ("LOSS", 1, "LOSS(1)", True)
    assert v.first_post_resume is not None and v.first_post_resume["expected"] != v.first_post_resume["observed"]
    assert late.verdict is not None and (late.verdict.short, late.verdict.running_at_pause) == ("OK", False)
    raw = cr.to_dict()["requests"]
    assert [dict(r) for r in cr.requests] == raw and cr.requests == tuple(raw)  # a record equals its JSON
    assert CellResult(cr.cell, cr.outcome, cr.summary, requests=({"rid": "r0"},)).requests[0].verdict is None


def test_results_pickle_as_they_are() -> None:
    # Ray tasks and pytest-xdist workers send cell results by pickle.
    import copy
    import pickle

    cr = ran("0.21.0", lose=2)
    back = pickle.loads(pickle.dumps(cr))
    assert back == cr and isinstance(back.engine, EngineInfo) and isinstance(back.requests[0], RequestRecord)
    assert copy.deepcopy(cr) == cr


def test_repeat_labels_are_what_schema_1_files_recover() -> None:
    from harness.verdicts.repeat import aggregate

    lossy, ok = ran("0.21.0", lose=RUNNING), ran("0.21.0")
    down = infra("0.21.0", Outcome.TIMEOUT, "hang")
    for runs, label in (([lossy, lossy], "LOSS(1)"), ([ok, lossy], "FLAKY"), ([ok, down], "TIMEOUT")):
        res = aggregate(runs)
        assert res.label == legacy_label(res.outcome.value, res.summary) == label


def test_an_axis_value_from_a_newer_writer_is_refused_by_name(tmp_path: Path) -> None:
    d = ran("0.21.0").to_dict()
    bad = tmp_path / "r.json"
    bad.write_text(json.dumps({"schema": RESULTS.name, "schema_version": 2,
                               "cells": [{**d, "cell": {**d["cell"], "executor": "ray-v3"}}]}))
    with pytest.raises(ResultsFileError, match=r"r\.json: cells\[0\]\.cell\.executor: expected one of mp, uni, "
                                               r"ray-v1, ray-v2, found 'ray-v3'"):
        read_results(bad)
