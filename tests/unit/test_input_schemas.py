"""Every input file is checked at the edge (issue 21, part 5): a malformed one is one line naming the file, the
JSON path, what was expected and what was found; exit 2; no env built, no engine started, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from synthetic_runs import ran

from harness.core.errors import BadInput, ReproError
from harness.core.records import RESULTS
from harness.core.schema import AnyOf, Choice, Int, ListOf, MapOf, Obj, Str, Tuple, validate
from harness.frontends.cli import main
from harness.plan.engine_args import ENGINE_ARGS, PRESETS
from harness.verdicts.known_bugs import load_known_bugs

pytestmark = pytest.mark.unit

REQ = {"rid": "r0", "prompt": [5, 7], "max_tokens": 8}
PAUSE = {"mode": "keep", "clear_cache": True, "after_tokens": 4}
SCRIPT = {"requests": [REQ], "ops": [{"op": "add", "rid": "r0"}, {"op": "run"}]}


@pytest.fixture(autouse=True)
def _nothing_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Building an env, starting an engine or a scheduler run fails the test; the working folder is empty."""
    def never(*_a: Any, **_k: Any) -> Any:
        pytest.fail("an env was built or an engine started for a malformed input")

    monkeypatch.setattr("harness.run.context.RunContext.env", never)
    monkeypatch.setattr("harness.envbuild.envs.ensure_env", never)
    monkeypatch.setattr("harness.run.session.EngineSession.start", never)
    monkeypatch.setattr("harness.run.replay.run_sched", never)
    monkeypatch.chdir(tmp_path)


def _one_line(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def test_the_issue_plan_exits_2_in_one_line_and_starts_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Measured before: env built, engine started, "ERROR: AttributeError: 'str' object has no attribute 'get'",
    # exit 1 and a reports/ folder.
    (tmp_path / "bad.json").write_text(json.dumps({"requests": "nope"}))
    assert main(["plan", "bad.json", "--versions", "0.21.0", "--platform", "cpu"]) == 2
    _one_line(capsys, "bad.json: requests: expected a non-empty list of requests, found 'nope' (a string)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]  # no reports/


PLANS: list[tuple[Any, list[str]]] = [
    ({"requests": "nope"}, ["requests:", "'nope'"]),
    ([REQ], ["top level:", "a plan object", "found a list of 1 item"]),
    ({"pauses": []}, ["requests: missing"]),
    ({"requests": []}, ["requests:", "non-empty list", "found an empty list"]),
    ({"requests": [{**REQ, "pause_at": 3}]}, ["requests[0].pause_at: unknown key", "rid, prompt, max_tokens, submit"]),
    ({"requests": [{"rid": "r0", "prompt": [5]}]}, ["requests[0].max_tokens: missing", "integer >= 1"]),
    ({"requests": [{**REQ, "prompt": []}]}, ["requests[0].prompt:", "non-empty list of integers >= 0"]),
    ({"requests": [{**REQ, "prompt": [5, "x"]}]}, ["requests[0].prompt[1]:", "'x' (a string)"]),
    ({"requests": [{**REQ, "prompt": [5, 600]}]}, ["requests[0].prompt[1]:", "0 to 511", "600"]),
    ({"requests": [{**REQ, "max_tokens": 0}]}, ["requests[0].max_tokens:", "found 0"]),
    ({"requests": [{**REQ, "max_tokens": 300}]}, ["requests[0].max_tokens:", "at most 246", "max_model_len 256"]),
    ({"requests": [{**REQ, "max_tokens": True}]}, ["requests[0].max_tokens:", "true (a boolean)"]),
    ({"requests": [{**REQ, "submit": "later"}]}, ["requests[0].submit:", '"start", ["during", k]', "'later'"]),
    ({"requests": [{**REQ, "submit": ["during", 1]}], "pauses": [PAUSE]},
     ["requests[0].submit[1]:", "pause index from 0 to 0", "found 1"]),
    ({"requests": [REQ, REQ]}, ["requests[1].rid:", "not used before", "'r0'"]),
    ({"requests": [REQ], "pauses": {"mode": "keep"}}, ["pauses:", "a list of pauses", "an object"]),
    ({"requests": [REQ], "pauses": [{**PAUSE, "mode": "sideways"}]},
     ["pauses[0].mode:", "one of keep, wait, abort", "'sideways'"]),
    ({"requests": [REQ], "pauses": [{**PAUSE, "clear_cache": "yes"}]}, ["pauses[0].clear_cache:", "true or false"]),
    ({"requests": [REQ], "pauses": [{"mode": "keep", "clear_cache": True}]}, ["pauses[0].after_tokens: missing"]),
    ({"tier": "model", "requests": [REQ]}, ["tier:", "one of engine, scheduler", "'model'"]),
    ({"tier": "scheduler"}, ["script: missing"]),
    ({"tier": "scheduler", "script": "ops"}, ["script:", "an op script object"]),
    ({"tier": "scheduler", "script": {**SCRIPT, "ops": [{"op": "explode"}]}},
     ["script.ops[0].op:", "one of abort, abort_all, abort_many, add", "'explode'"]),
    ({"tier": "scheduler", "script": {**SCRIPT, "ops": [{"op": "step", "n": 0}]}}, ["script.ops[0].n:", "found 0"]),
    ({"tier": "scheduler", "script": {**SCRIPT, "depth": 7}}, ["script.depth:", "from 1 to 3", "found 7"]),
    ({"tier": "scheduler", "script": {**SCRIPT, "scheduler": "fifo"}}, ["script.scheduler:", "one of async, sync"]),
    ({"tier": "scheduler", "script": {**SCRIPT, "dpeth": 2}}, ["script.dpeth: unknown key", "depth"]),
    ({"tier": "scheduler", "script": {**SCRIPT, "requests": [{"rid": "r0", "prompt": [999], "max_tokens": 4}]}},
     ["script.requests[0].prompt[0]:", "from 0 to 511"]),
    ({"tier": "scheduler", "script": {**SCRIPT, "ops": [{"op": "add", "rid": "zz"}]}},
     ["script:", "unknown request 'zz'"]),
]


@pytest.mark.parametrize(("doc", "needles"), PLANS, ids=[str(i) for i in range(len(PLANS))])
def test_malformed_plans_exit_2_in_one_line(doc: Any, needles: list[str], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.json").write_text(json.dumps(doc))
    assert main(["plan", "p.json", "--versions", "0.21.0", "--platform", "cpu"]) == 2
    _one_line(capsys, "p.json: ", *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_unreadable_plans_exit_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.json").write_text("{not json")
    assert main(["plan", "p.json", "--versions", "0.21.0", "--platform", "cpu"]) == 2
    _one_line(capsys, "p.json: not JSON")
    assert main(["plan", "missing.json", "--versions", "0.21.0", "--platform", "cpu"]) == 2
    _one_line(capsys, "cannot read plan missing.json")


ENGINE_ARGS_FILES: list[tuple[Any, list[str]]] = [
    ([1, 2], ["top level:", "a JSON object of engine arguments", "a list of 2 items"]),
    ({"bad key": 1}, ['["bad key"]:', "not an AsyncEngineArgs field name"]),
    ({"async_scheduling": False}, ["async_scheduling is decided by the cell", "--async"]),
]


@pytest.mark.parametrize(("doc", "needles"), ENGINE_ARGS_FILES, ids=["list", "key", "owned"])
def test_malformed_engine_args_files_exit_2_in_one_line(doc: Any, needles: list[str], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ea.json").write_text(json.dumps(doc))
    (tmp_path / "p.json").write_text(json.dumps({"requests": [REQ]}))
    assert main(["plan", "p.json", "--versions", "0.21.0", "--platform", "cpu", "--engine-args", "ea.json"]) == 2
    _one_line(capsys, "--engine-args ea.json", *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ea.json", "p.json"]


def test_every_preset_passes_the_engine_args_schema() -> None:
    for p in PRESETS.values():
        validate(ENGINE_ARGS, dict(p.engine_args), p.name)
        validate(ENGINE_ARGS, dict(p.cuda_engine_args), p.name)


def _results(**cell: Any) -> dict[str, Any]:
    return {"schema": RESULTS.name, "schema_version": RESULTS.version, "cells": [{**ran("0.21.0").to_dict(), **cell}]}


RESULTS_FILES: list[tuple[Any, list[str]]] = [
    ({"schema": RESULTS.name, "schema_version": 3, "cells": "all"}, ["cells:", "a list of cell results", "'all'"]),
    ({"schema": RESULTS.name, "schema_version": 3, "cells": [7]}, ["cells[0]:", "a cell result object", "7"]),
    (_results(outcome="LOST"), ["cells[0].outcome:", "one of OK,", "'LOST'"]),
    (_results(summary=None), ["cells[0].summary:", "a string", "null"]),
    (_results(duration_s="slow"), ["cells[0].duration_s:", "a number >= 0"]),
    (_results(attempts=[{"n": 0, "outcome": "OK"}]), ["cells[0].attempts[0].n:", "integer >= 1"]),
    (_results(cell={"version": "0.21.0", "executor": "mp", "async_scheduling": "on", "mode": "keep",
                    "clear_cache": True}), ["cells[0].cell.async_scheduling:", "true or false", "'on'"]),
]


@pytest.mark.parametrize(("doc", "needles"), RESULTS_FILES, ids=[str(i) for i in range(len(RESULTS_FILES))])
@pytest.mark.parametrize("command", ["report", "compare", "history-add"])
def test_malformed_results_files_exit_2_in_one_line(doc: Any, needles: list[str], command: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r.json").write_text(json.dumps(doc))
    argv = {"report": ["report", "r.json", "--out", "out"], "compare": ["compare", "r.json", "r.json"],
            "history-add": ["history", "add", "r.json", "--history", "h.jsonl"]}[command]
    assert main(argv) == 2
    _one_line(capsys, "r.json: ", *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_malformed_results_line_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = {"schema": "vllm-repro/cell", "schema_version": 3, **ran("0.21.0").to_dict(), "outcome": 3}
    (tmp_path / "r.jsonl").write_text(json.dumps(line) + "\n")
    assert main(["report", "r.jsonl"]) == 2
    _one_line(capsys, "r.jsonl:1: outcome: expected one of OK,", "found 3 (an integer)")


HISTORY_LINES: list[tuple[dict[str, Any], list[str]]] = [
    ({"run_id": "x", "added": "2026-01-01", "cells": {}}, ["h.jsonl:1: cells:", "a list of", "an empty object"]),
    ({"run_id": "x", "cells": []}, ["h.jsonl:1: added: missing"]),
    ({"run_id": "x", "added": "t", "meta": [], "cells": []}, ["h.jsonl:1: meta:", "found an empty list"]),
    ({"run_id": "x", "added": "t", "cells": [{"id": "c", "version": "0.21.0", "executor": "mp", "async": True,
                                              "mode": "hold", "clear_cache": True, "outcome": "OK"}]},
     ["h.jsonl:1: cells[0].mode:", "one of keep, wait, abort", "'hold'"]),
]


@pytest.mark.parametrize(("line", "needles"), HISTORY_LINES, ids=[str(i) for i in range(len(HISTORY_LINES))])
def test_malformed_history_lines_exit_2_in_one_line(line: dict[str, Any], needles: list[str], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    text = json.dumps({"schema": "vllm-repro/history", "schema_version": 1, **line}) + "\n"
    (tmp_path / "h.jsonl").write_text(text)
    assert main(["history", "show", "--history", "h.jsonl"]) == 2
    _one_line(capsys, *needles)
    assert (tmp_path / "h.jsonl").read_text() == text


LEDGERS: list[tuple[str, list[str]]] = [
    ('workaround = "x"\n', ["workaround:", "a non-empty list of [[workaround]] tables"]),
    ('[[workaround]]\nid = "w"\nissue = "vllm#1"\nnote = "?"\n[workaround.cell]\nmode = "keep"\n'
     '[workaround.applied]\nasync_scheduling = false\n', ["workaround[0].note: unknown key", "id, issue"]),
    ('[[workaround]]\nid = "w"\nissue = 1\n[workaround.cell]\nmode = "keep"\n[workaround.applied]\nmode = "wait"\n',
     ["workaround[0].issue:", "a non-empty string", "1 (an integer)"]),
]


@pytest.mark.parametrize(("text", "needles"), LEDGERS, ids=[str(i) for i in range(len(LEDGERS))])
def test_malformed_ledgers_exit_2_in_one_line(text: str, needles: list[str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "l.toml").write_text(text)
    assert main(["workarounds", "check", "--ledger", "l.toml", "--versions", "0.21.0", "--platform", "cpu"]) == 2
    _one_line(capsys, "l.toml: ", *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.toml"]


KNOWN_BUG_TABLES: list[tuple[str, list[str]]] = [
    ('bug = 3\n', ["bug:", "a list of [[bug]] tables", "3 (an integer)"]),
    ('[[bug]]\nid = "x"\naffected = ">=1"\nfixed = "0.22.0"\n', ["bug[0].fixed: unknown key", "fixed_in"]),
    ('[[bug]]\nid = "x"\naffected = ">=1"\n[[bug.cells]]\nexpect = "LOSS"\nk = 0\n',
     ["bug[0].cells[0].k:", "integer >= 1", "found 0"]),
    ('[[bug]]\nid = "x"\naffected = ">=1"\n[[bug.cells]]\nexpect = "LOSS"\nexecutor = ["mp", "gpu"]\n',
     ["bug[0].cells[0].executor:", "one of mp, uni, ray-v1, ray-v2, or a non-empty list of them"]),
    ('[[bug]]\nid = "x"\naffected = "soon"\n', ["bug[0].affected:", "PEP 440", "'soon'"]),
]


@pytest.mark.parametrize(("text", "needles"), KNOWN_BUG_TABLES, ids=[str(i) for i in range(len(KNOWN_BUG_TABLES))])
def test_malformed_known_bug_tables_are_one_line(text: str, needles: list[str], tmp_path: Path) -> None:
    # A user passes one to the pytest face (--known-bugs FILE); the CLI prints any BadInput as one line.
    (tmp_path / "b.toml").write_text(text)
    with pytest.raises(BadInput) as exc:
        load_known_bugs(tmp_path / "b.toml")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path / "b.toml") + ": ")
    for n in needles:
        assert n in msg, msg


RUN_RECORDS: list[tuple[dict[str, Any], list[str]]] = [
    ({"platform": "cpu", "settings": {}}, ["run.json: cells: missing", "a list of cell ids"]),
    ({"platform": "cpu", "cells": "all", "settings": {}}, ["run.json: cells:", "'all'"]),
    ({"platform": "cpu", "cells": [], "settings": []}, ["run.json: settings:", "an object of run settings"]),
]


@pytest.mark.parametrize(("doc", "needles"), RUN_RECORDS, ids=[str(i) for i in range(len(RUN_RECORDS))])
def test_a_malformed_run_record_refuses_resume_in_one_line(doc: dict[str, Any], needles: list[str], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "reports").mkdir()
    text = json.dumps({"schema": "vllm-repro/run", "schema_version": 1, **doc})
    (tmp_path / "reports" / "run.json").write_text(text)
    assert main(["matrix", "--resume", "--versions", "0.21.0", "--platform", "cpu", "--executor", "mp"]) == 2
    _one_line(capsys, *needles)
    assert [p.name for p in (tmp_path / "reports").iterdir()] == ["run.json"]
    assert (tmp_path / "reports" / "run.json").read_text() == text


# --------------------------------------------------------------------------- the validator itself


SPEC = Obj({"a": ListOf(Obj({"b": Int(lo=0), "c": Choice(("x", "y"))}, required=("b",))),
            "d": MapOf(Str(), Str(pattern=r"[a-z]+", what="a lower-case word")),
            "e": AnyOf((Choice(("start",)), Tuple((Str(), Int()))))})


@pytest.mark.parametrize(("doc", "line"), [
    ("x", "f: top level: expected an object, found 'x' (a string)"),
    ({"z": 1}, "f: z: unknown key; valid keys: a, d, e"),
    ({"a": [{"b": 0}, {"c": "x"}]}, "f: a[1].b: missing (expected an integer >= 0)"),
    ({"a": [{"b": -1}]}, "f: a[0].b: expected an integer >= 0, found -1 (an integer)"),
    ({"a": [{"b": 1, "c": "q"}]}, "f: a[0].c: expected one of x, y, found 'q' (a string)"),
    ({"d": {"OK": "v"}}, "f: d.OK: key 'OK' is not a lower-case word"),
    ({"d": {"ok": 2}}, "f: d.ok: expected a string, found 2 (an integer)"),
    ({"e": ["s", "1"]}, "f: e: expected one of start or [a string, an integer], found a list of 2 items"),
])
def test_the_validator_names_path_expected_and_found(doc: Any, line: str) -> None:
    with pytest.raises(ReproError) as exc:
        validate(SPEC, doc, "f")
    assert str(exc.value) == line


def test_a_valid_document_is_returned_as_it_is() -> None:
    doc = {"a": [{"b": 0, "c": "y"}], "d": {"ok": "v"}, "e": ["s", 1]}
    assert validate(SPEC, doc, "f") is doc


def test_every_setup_field_the_fuzzer_writes_reads_back() -> None:
    """The fuzzer's richer rules (issue 23) write these into its falsifying plans; ``vllm-repro plan`` must read
    them (it refused ``policy: "fcfs"`` as "an integer", so no such plan could be replayed)."""
    from harness.plan.plan_file import check_plan

    plan = {"tier": "scheduler", "script": {
        "policy": "priority", "long_prefill_token_threshold": 0, "log_stats": True, "kv_consumer": False,
        "enable_prefix_caching": False, "requests": [{"rid": "r0", "prompt": [3, 5], "max_tokens": 4, "priority": 2}],
        "ops": [{"op": "add", "rid": "r0"}, {"op": "pause", "mode": "new"}, {"op": "resume"}, {"op": "run"}]}}
    assert check_plan(plan, "p.json")["script"]["policy"] == "priority"
    with pytest.raises(BadInput, match="policy"):
        check_plan({**plan, "script": {**plan["script"], "policy": "lifo"}}, "p.json")


def test_the_sessions_batched_aborts_and_connector_resets_the_fuzzer_writes_read_back() -> None:
    from harness.plan.plan_file import check_plan

    reqs = [{"rid": "r0", "prompt": [3], "max_tokens": 2, "session": True, "chunks": [[[4, 5], 3]]},
            {"rid": "r1", "prompt": [6], "max_tokens": 2}]
    ops = [{"op": "add", "rid": "r0"}, {"op": "add", "rid": "r1"}, {"op": "feed", "rid": "r0"},
           {"op": "reset", "in_flight": 0, "connector": True}, {"op": "abort_many", "rids": ["r0", "r1"]},
           {"op": "abort_all"}, {"op": "close", "rid": "r0"}, {"op": "run"}]
    plan = {"tier": "scheduler", "script": {"scheduler": "sync", "depth": 1, "spec_tokens": 2, "kv_consumer": True,
                                            "requests": reqs, "ops": ops}}
    assert check_plan(plan, "p.json")["script"]["ops"] == ops
    with pytest.raises(BadInput, match="not a streaming-input session"):
        check_plan({**plan, "script": {**plan["script"], "ops": [*ops[:2], {"op": "feed", "rid": "r1"}]}}, "p.json")
    with pytest.raises(BadInput, match="chunks"):
        check_plan({**plan, "script": {**plan["script"], "requests": [{**reqs[0], "chunks": [[[4], 0]]}]}}, "p.json")
