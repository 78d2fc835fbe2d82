"""The command line: bad input is one line naming the valid choices, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.core.recorded_streams import StreamRecord
from harness.frontends.cli import main

typed = StreamRecord.from_json  # the oracle judges typed request records

# Marked per test: `unit` ones are pure and fast, `integration` ones start a process
# (`python -m harness.frontends.cli`).


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "must_name"),
    [
        (["matrix", "--mode", "sideways"], ["'sideways'", "keep", "wait", "abort"]),
        (["matrix", "--executor", "ray-v3"], ["'ray-v3'", "mp", "uni", "ray-v1", "ray-v2"]),
        (["matrix", "--async", "maybe"], ["'maybe'", "on", "off", "both"]),
        (["matrix", "--clear-cache", "yes"], ["'yes'", "true", "false"]),
        (["matrix", "--platform", "tpu"], ["'tpu'", "cpu", "cuda"]),
        (["matrix", "--versions", "latest!"], ["'latest!'", "0.21.0"]),
        (["matrix", "--pause-after", "60", "--max-tokens", "48"], ["--pause-after 60", "--max-tokens 48"]),
        (["matrix", "--inject", "vllm#1"], ["'vllm#1'", "vllm#42043"]),
        (["matrix", "--scenario", "rlhf"], ["'rlhf'", "pause", "weight-sync"]),
        (["matrix", "--model-runner", "v3"], ["'v3'", "v1", "v2"]),
        (["matrix", "--tp", "0"], ["'0'", "--tp"]),
        (["matrix", "--repeat", "0"], ["--repeat", "at least 1"]),
        (["matrix", "--engine-timeout", "-1"], ["--engine-timeout", "above 0", "-1"]),
        # Issue 35: a reports folder that cannot be made, a fraction out of range (on cpu too), a bad --bind.
        (["matrix", "--reports", "/proc/nope"], ["--reports /proc/nope", "cannot make"]),
        (["matrix", "--platform", "cpu", "--gpu-memory-utilization", "2.0"], ["--gpu-memory-utilization 2.0",
                                                                              "(0, 1]"]),
        (["matrix", "--gpu-memory-utilization", "0"], ["--gpu-memory-utilization 0.0", "(0, 1]"]),
        (["matrix", "--bind", "every"], ["--bind 'every'", "IP address", "127.0.0.1"]),
        (["fuzz", "--versions", "0.21.0", "--reports", "/proc/nope"], ["--reports /proc/nope", "cannot make"]),
        (["frameworks", "check", "--versions", "0.21.0", "--scenario-timeout", "0"], ["--scenario-timeout", "above 0"]),
        (["matrix", "--platform", "cpu", "--weight-transfer", "nccl"], ["nccl", "reload"]),
        (["matrix", "--platform", "cpu", "--wheelhouse", "/no/wh"], ["/no/wh", "does not exist", "build one"]),
        (["envs", "build", "--versions", "0.21.0", "--wheelhouse", "/no/wh"], ["/no/wh", "vllm-repro wheelhouse"]),
        (["bisect", "--platform", "cuda", "--versions", "0.20.0..0.22.0", "--wheelhouse", "/no/wh"],
         ["/no/wh", "vllm-repro wheelhouse"]),
        (["bisect", "--platform", "cuda", "--commits-file", "/no/c.txt", "--wheelhouse", "/no/wh"],
         ["--wheelhouse", "--commits"]),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_choices(
    argv: list[str], must_name: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for word in must_name:
        assert word in err


@pytest.mark.unit
def test_bad_input_found_after_the_reports_check_leaves_no_folder_behind(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    reports = tmp_path / "new" / "deep"
    # --versions is read after the reports folder was proven writable: the proof must leave nothing.
    assert main(["matrix", "--platform", "cpu", "--reports", str(reports), "--versions", "latest!"]) == 2
    assert "'latest!'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_console_script_module_exits_2_on_unknown_mode() -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.frontends.cli", "matrix", "--mode", "sideways"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "keep, wait, abort" in proc.stderr


@pytest.mark.unit
def test_matrix_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["matrix", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--versions", "--executor", "--async", "--mode", "--clear-cache", "--platform", "--reports",
                "--engine-timeout", "--scenario-timeout", "--index-url", "--find-links", "--resolve-as-of"):
        assert opt in out


@pytest.mark.unit
def test_report_on_corrupt_file_is_a_clear_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "results.json"
    bad.write_text("{not json")
    assert main(["report", str(bad)]) == 2
    assert "corrupt JSON" in capsys.readouterr().err
    future = tmp_path / "future.json"
    future.write_text('{"schema": "vllm-repro/results", "schema_version": 99, "cells": []}')
    assert main(["report", str(future)]) == 2
    assert "schema_version 99" in capsys.readouterr().err


def _bad_files(tmp_path):  # type: ignore[no-untyped-def]
    import json

    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"schema": "vllm-repro/results", "cells": [')
    future = tmp_path / "future.json"
    future.write_text(json.dumps({"schema": "vllm-repro/results", "schema_version": 99, "cells": []}))
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"schema": "vllm-repro/cell", "schema_version": 1, "id"\n')
    return {"corrupt": (corrupt, "corrupt JSON"), "future": (future, "schema_version 99"),
            "torn": (torn, "torn.jsonl:1")}


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["corrupt", "future", "torn"])
@pytest.mark.parametrize("command", ["report", "history-add", "compare"])
def test_bad_results_files_are_one_clear_error(kind: str, command: str, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path, words = _bad_files(tmp_path)[kind]
    argv = {"report": ["report", str(path)],
            "history-add": ["history", "add", str(path), "--history", str(tmp_path / "h.jsonl")],
            "compare": ["compare", str(path), str(path)]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and words in err, err
    assert not (tmp_path / "h.jsonl").exists() or (tmp_path / "h.jsonl").read_text() == ""


@pytest.mark.unit
@pytest.mark.parametrize("content", ['{"schema": "vllm-repro/history", "schema_version": 1, "run', "not json\n",
                                     '{"schema": "vllm-repro/history", "schema_version": 7}\n'])
def test_bad_history_files_are_one_clear_error(content: str, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    hist = tmp_path / "history.jsonl"
    hist.write_text(content)
    before = hist.read_text()
    assert main(["history", "show", "--history", str(hist)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(hist) in err, err
    assert main(["history", "plot", "--history", str(hist), "--out", str(tmp_path / "h.png")]) == 2
    assert hist.read_text() == before and not (tmp_path / "h.png").exists()


@pytest.mark.unit
def test_report_merges_partial_runs_later_file_wins(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from harness.core.cell import Cell
    from harness.core.oracle import Outcome
    from harness.verdicts.results import CellResult, Results, ResultsLog, read_results

    a, b = Cell("0.21.0", "mp", True, "keep", True), Cell("0.21.0", "mp", False, "keep", True)
    first = tmp_path / "one.jsonl"
    ResultsLog(first).append(CellResult(a, Outcome.TIMEOUT, "hang"))
    second = tmp_path / "two.json"
    second.write_text(json.dumps(Results((CellResult(a, Outcome.LOSS, "LOSS(1) in 8/10"),
                                          CellResult(b, Outcome.OK, "OK 10/10")),
                                         {"platform": "cuda", "created": "2026-11-30T10:00:00+00:00"}).to_dict()))
    assert main(["report", str(first), str(second), "--out", str(tmp_path / "out"), "--meta", "driver=580"]) == 0
    merged = read_results(tmp_path / "out" / "results.json")
    assert {c.id: c.outcome for c in merged.cells} == {a.id: Outcome.LOSS, b.id: Outcome.OK}
    assert merged.meta["driver"] == "580" and len(merged.meta["sources"]) == 2
    assert "- driver: 580" in (tmp_path / "out" / "results.md").read_text()
    assert main(["report", str(first), "--meta", "novalue"]) == 2


def _fake_run(outcome_for):  # type: ignore[no-untyped-def]
    """An execute_plan stand-in: judges every planned cell with ``outcome_for(cell)`` (no engine)."""
    from harness.plan.faults import annotate_injected
    from harness.run.execute import run_meta
    from harness.verdicts.known_bugs import load_known_bugs
    from harness.verdicts.results import CellResult, Results, infra_result

    def run(plan, ctx, backend=None):  # type: ignore[no-untyped-def]
        from datetime import datetime

        cfg, log = ctx.cfg, ctx.log
        from harness.core.oracle import Outcome

        cells = [infra_result(c, Outcome.UNSUPPORTED, r) for c, r in plan.unsupported]
        for _, cs in plan.engines:
            for c in cs:
                outcome, reqs = outcome_for(c)
                cells.append(CellResult(c, outcome, outcome.value, requests=reqs, engine={"vllm_version": c.version}))
        cells = [annotate_injected(c, cfg.inject, load_known_bugs()) for c in cells]
        for c in cells:
            log.append(c)
        return Results(tuple(cells), run_meta(cfg, datetime.now(), [], {}, len(plan.engines)))

    return run


@pytest.mark.unit
@pytest.mark.parametrize(("lost", "rc"), [(True, 0), (False, 1)])
def test_inject_self_test_sets_the_exit_code(lost: bool, rc: int, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from synthetic import request_record

    import harness.run.execute
    from harness.core.oracle import Outcome, classify_request

    ref = list(range(10, 40))
    obs = ref[:6] + ref[7:20] if lost else ref[:19]
    rec = request_record("r0", obs, ref, running=True, max_tokens=19)
    judged = ({**rec, "verdict": classify_request(typed(rec)).to_dict()},)

    def outcome_for(cell):  # type: ignore[no-untyped-def]
        covered = cell.async_on and cell.clear_cache
        return (Outcome.LOSS if covered and lost else Outcome.OK), (judged if covered else ())

    monkeypatch.setattr(harness.run.execute, "execute_plan", _fake_run(outcome_for))
    argv = ["matrix", "--platform", "cpu", "--versions", "0.32.0", "--inject", "vllm#42043", "--async", "on",
            "--mode", "keep", "--scenario", "pause", "--reports", str(tmp_path)]
    assert main(argv) == rc
    err = capsys.readouterr().err
    assert ("SENSITIVITY SELF-TEST FAILED" in err) is (not lost)
    assert "FAULT INJECTED" in (tmp_path / "results.md").read_text()


@pytest.mark.unit
def test_fail_on_unexpected(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import harness.run.execute
    from harness.core.oracle import Outcome

    # 0.32.0 cells all OK except one surprise LOSS: exit 0 normally, 1 with --fail-on-unexpected.
    def outcome_for(cell):  # type: ignore[no-untyped-def]
        return (Outcome.LOSS if cell.mode == "wait" else Outcome.OK), ()

    monkeypatch.setattr(harness.run.execute, "execute_plan", _fake_run(outcome_for))
    argv = ["matrix", "--platform", "cpu", "--versions", "0.32.0", "--async", "on", "--scenario", "pause",
            "--executor", "mp"]
    assert main([*argv, "--reports", str(tmp_path / "a")]) == 0
    assert main([*argv, "--reports", str(tmp_path / "b"), "--fail-on-unexpected"]) == 1


@pytest.mark.unit
def test_resume_reruns_only_unfinished_cells_and_merges(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import harness.run.execute
    from harness.core.oracle import Outcome
    from harness.verdicts.results import read_results

    planned: list[list[str]] = []

    def fake(outcome_for):  # type: ignore[no-untyped-def]
        inner = _fake_run(outcome_for)

        def run(plan, *a, **kw):  # type: ignore[no-untyped-def]
            planned.append([c.id for c in plan.cells])
            return inner(plan, *a, **kw)

        return run

    argv = ["matrix", "--platform", "cpu", "--versions", "0.32.0", "--async", "on", "--scenario", "pause",
            "--executor", "mp", "--reports", str(tmp_path)]
    monkeypatch.setattr(harness.run.execute, "execute_plan",
                        fake(lambda c: ((Outcome.ERROR if c.mode == "wait" else Outcome.OK), ())))
    assert main(argv) == 1
    first = read_results(tmp_path / "results.json")
    errors = [c.id for c in first.cells if c.outcome is Outcome.ERROR]
    assert errors and len(errors) < len(first.cells)
    monkeypatch.setattr(harness.run.execute, "execute_plan", fake(lambda c: (Outcome.OK, ())))
    assert main([*argv, "--resume"]) == 0
    assert sorted(planned[1]) == sorted(errors)
    merged = read_results(tmp_path / "results.json")
    assert [c.id for c in merged.cells] == [c.id for c in first.cells]
    assert {c.outcome for c in merged.cells} == {Outcome.OK}
    assert merged.meta["resumed"] == {"kept": len(first.cells) - len(errors)}
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines at 80 columns
    assert f"{len(first.cells) - len(errors)} finished cell(s) kept" in err


@pytest.mark.unit
def test_interrupt_exits_130_naming_the_partial_results(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import harness.run.execute

    def run(*a, **kw):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.run.execute, "execute_plan", run)
    argv = ["matrix", "--platform", "cpu", "--versions", "0.32.0", "--reports", str(tmp_path)]
    assert main(argv) == 130
    # The console wraps long lines, a long path even inside a word (as under xdist's popen-gwN folders).
    want = f"interrupted; results of finished cells are in {tmp_path / 'results.jsonl'}"
    assert "".join(want.split()) in "".join(capsys.readouterr().err.split())
