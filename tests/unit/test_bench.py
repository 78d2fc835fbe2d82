"""vllm-repro bench: an engine's start-up split by vLLM's own log lines, scenarios and the harness's gaps placed on
one time axis, the run's JSON, and bad input."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from harness.bench.phases import read_events, read_log, timeline
from harness.bench.run import PHASES, load_run
from harness.frontends.cli import main

pytestmark = pytest.mark.unit

# vLLM 0.21.0's words on an H200 (docs/results/gpu-h200-034-2026-12-04, engine.log), trimmed.
LOG = """(Worker pid=4184) INFO [default_loader.py:397] Loading weights took 0.01 seconds
(Worker pid=4184) INFO [gpu_model_runner.py:4959] Model loading took 0.0 GiB memory and 0.197939 seconds
(EngineCore pid=3590) INFO [core.py:306] init engine (profile, create kv cache, warmup model) took 1.46 s
"""


def _events(t0: float) -> list[dict[str, object]]:
    return [{"event": "start", "t": t0 + 2.0}, {"event": "engine", "t": t0 + 12.0, "startup_s": 10.0},
            {"event": "scenario", "t": t0 + 13.0, "id": "keep-clear", "duration_s": 1.0},
            {"event": "scenario", "t": t0 + 15.5, "id": "keep-noclear", "duration_s": 2.0}]


def test_start_up_splits_by_vllms_log_and_scenarios_leave_the_harness_gaps() -> None:
    tl = timeline("e", _events(1000.0), LOG, 1000.0)
    assert [(s.phase, s.start, s.end) for s in tl.spans] == [
        ("import+construct", 2.0, 10.342061), ("model load", 10.342061, 10.54), ("kv cache+warm-up", 10.54, 12.0),
        ("scenario", 12.0, 13.0), ("harness", 13.0, 13.5), ("scenario", 13.5, 15.5)]
    assert tl.seconds("scenario") == 3.0 and tl.seconds("harness") == 0.5 and tl.startup_s == 10.0
    assert not tl.problems


def test_a_gated_engines_wait_for_its_turn_is_its_own_span() -> None:
    events = _events(1000.0)
    events.insert(2, {"event": "turn", "t": 1012.75, "waited_s": 0.75})  # ready at 12.0, its turn at 12.75
    tl = timeline("e", events, LOG, 1000.0)
    assert [(s.phase, s.start, round(s.end, 3)) for s in tl.spans][3:] == [
        ("turn wait", 12.0, 12.75), ("scenario", 12.75, 13.0), ("harness", 13.0, 13.5), ("scenario", 13.5, 15.5)]
    assert "turn wait" in PHASES


def test_the_time_from_spawn_to_the_start_event_is_its_own_span() -> None:
    tl = timeline("e", _events(1000.0), LOG, 1000.0, spawned=1000.5)
    assert (tl.spans[0].phase, tl.spans[0].start, tl.spans[0].end) == ("spawn+import", 0.5, 2.0)
    assert timeline("e", _events(1000.0), LOG, 1000.0).spans[0].phase == "import+construct"  # no spawned.json
    assert "spawn+import" in PHASES


def test_a_log_without_vllms_lines_is_not_split_and_says_so() -> None:
    tl = timeline("e", _events(0.0), "nothing here", 0.0)
    assert tl.spans[0].phase == "start-up" and tl.spans[0].seconds == 10.0
    assert "lacks its model-load or init-engine line" in tl.problems[0]
    dead = timeline("e", [{"event": "start", "t": 1.0}], LOG, 0.0)
    assert dead.spans == () and "never answered" in dead.problems[0]


def test_half_lines_and_non_events_are_skipped() -> None:
    assert [e["event"] for e in read_events('{"event": "start", "t": 1}\n{"event": "eng\n[1]\n')] == ["start"]
    assert read_log(LOG).model_load == 0.197939 and read_log(LOG).init == 1.46


def test_a_reports_folder_becomes_the_runs_json(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"created": "2027-01-15T08:00:00+00:00",
                                                       "finished": "2027-01-15T08:00:20+00:00", "argv": ["matrix"]}))
    start = load_run(tmp_path).run_s
    assert start == 20.0
    eng = tmp_path / "engines" / "vllm0.21.0-mp-async_on"
    eng.mkdir(parents=True)
    base = datetime.fromisoformat("2027-01-15T08:00:00+00:00").timestamp()
    (eng / "events.jsonl").write_text("\n".join(json.dumps(e) for e in _events(base)) + "\n")
    (eng / "engine.log").write_text(LOG)
    run = load_run(tmp_path, "repro", wall_s=25.0)
    doc = run.to_json()
    assert doc["schema"] == "vllm-repro/bench" and set(doc["phases"]) <= set(PHASES)
    assert doc["phases"]["environments"] == 2.0 and doc["phases"]["scenario"] == 3.0
    assert doc["engines"][0]["spans"][0]["phase"] == "import+construct"


def test_a_server_doors_start_up_splits_by_the_servers_log(tmp_path: Path) -> None:
    """On the server and client doors vLLM logs its start-up in ``server.log``; ``engine.log`` has none of it."""
    (tmp_path / "results.json").write_text(json.dumps({"created": "2027-01-15T08:00:00+00:00",
                                                       "finished": "2027-01-15T08:00:20+00:00"}))
    eng = tmp_path / "engines" / "vllm0.21.0-mp-async_on-server"
    eng.mkdir(parents=True)
    base = datetime.fromisoformat("2027-01-15T08:00:00+00:00").timestamp()
    (eng / "events.jsonl").write_text("\n".join(json.dumps(e) for e in _events(base)) + "\n")
    (eng / "engine.log").write_text("the engine process's own lines\n")
    (eng / "server.log").write_text(LOG)
    (engine,) = load_run(tmp_path).engines
    assert [s.phase for s in engine.spans][:3] == ["import+construct", "model load", "kv cache+warm-up"]
    assert not engine.problems


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "nonsense"]) == 2
    assert "repro, sched, frameworks" in capsys.readouterr().err
    assert main(["bench", "--from", str(tmp_path), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds no results.json" in err
    assert not (tmp_path / "b").exists()


def test_a_workload_reports_option_is_refused_before_anything_runs(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Bench reads the workload's reports back from OUT/reports: a --reports of the workload's own would run it
    whole and then find nothing (seen: 218 s, then exit 2); refused first, nothing started or written."""
    out = tmp_path / "b"
    for extra in (["--reports", str(tmp_path / "r")], [f"--reports={tmp_path / 'r'}"]):
        assert main(["bench", "frameworks", "--out", str(out), "--", *extra, "--versions", "0.21.0"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "leave --reports out" in err
    assert main(["bench", "post-resume", "--out", str(out), "--", "--repro-reports", str(tmp_path / "r")]) == 2
    assert "leave --repro-reports out" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "r").exists()
