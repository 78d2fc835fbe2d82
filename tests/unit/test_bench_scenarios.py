"""vllm-repro bench per scenario and per engine profile (issue 37's "the stale-KV cells share the engines started
for their engine configuration"), and the post-resume workload: a pytest run's engine sessions on one time axis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bench.per_scenario import profile_of_engine, profile_totals, scenario_of, scenario_totals
from harness.bench.phases import EngineTimeline, Span
from harness.bench.pytest_run import SESSION_SPAN_FILE, load_pytest
from harness.frontends.cli import main
from harness.frontends.commands import bench

pytestmark = pytest.mark.unit


def test_a_span_label_names_its_scenario_and_an_engine_id_its_profile() -> None:
    assert [scenario_of(x) for x in ("keep-clear", "keep-clear-sampled", "weight_sync-keep-noclear",
                                     "manual_reset-keep-noclear", "manual_reset_reload-keep-noclear", "preempt",
                                     "stale_kv_keep-keep-noclear", "stale_kv_clear-keep-clear")] == [
        "pause", "pause", "weight-sync", "manual-reset", "manual-reset-reload", "preempt", "stale-kv-keep",
        "stale-kv-clear"]
    assert [profile_of_engine(x) for x in ("vllm0.21.0-mp-async_on", "vllm0.32.0-mp-async_off-tiny_kv",
                                           "gw1/vllm0.21.0-mp-async_on-prefix_cache", "vllm0.21.0-ray-async_on-tp2")
            ] == ["default", "tiny-kv", "prefix-cache", "default"]


def _engine(name: str, start: float, scenarios: list[tuple[str, float]]) -> EngineTimeline:
    spans, t = [Span("import+construct", start, start + 10.0)], start + 10.0
    for label, secs in scenarios:
        spans += [Span("harness", t, t + 0.5), Span("scenario", t + 0.5, t + 0.5 + secs, label)]
        t += 0.5 + secs
    return EngineTimeline(name, tuple(spans), 10.0)


ENGINES = (
    _engine("vllm0.21.0-mp-async_on", 0.0, [("keep-clear", 1.0), ("weight_sync-keep-clear", 2.0)]),
    _engine("vllm0.32.0-mp-async_on", 5.0, [("keep-clear", 1.5)]),
    _engine("vllm0.21.0-mp-async_on-prefix_cache", 20.0, [("stale_kv_keep-keep-noclear", 3.0),
                                                          ("stale_kv_reset-wait-noclear", 4.0)]),
)


def test_per_scenario_cells_seconds_engines_and_who_shares_them() -> None:
    totals = scenario_totals(ENGINES)
    assert list(totals) == ["pause", "weight-sync", "stale-kv-keep", "stale-kv-reset"]
    assert totals["pause"] == {"cells": 2, "scenario_s": 2.5, "profile": "default", "shared_with": ["weight-sync"],
                               "engines": ["vllm0.21.0-mp-async_on", "vllm0.32.0-mp-async_on"]}
    assert totals["stale-kv-keep"]["shared_with"] == ["stale-kv-reset"]  # the five share their profile's engines
    assert totals["stale-kv-keep"]["engines"] == ["vllm0.21.0-mp-async_on-prefix_cache"]


def test_per_profile_engines_their_start_up_and_scenarios() -> None:
    totals = profile_totals(ENGINES)
    assert totals["default"] == {"engines": 2, "engine_s": 26.0, "startup_s": 21.0, "scenario_s": 4.5,
                                 "scenarios": ["pause", "weight-sync"]}
    assert totals["prefix-cache"] == {"engines": 1, "engine_s": 18.0, "startup_s": 10.5, "scenario_s": 7.0,
                                      "scenarios": ["stale-kv-keep", "stale-kv-reset"]}


def _session(reports: Path, worker: str, folder: str, t: float, scenarios: list[tuple[str, float]]) -> None:
    d = reports / ".run-ab12cd34" / worker / "sessions" / folder
    d.mkdir(parents=True)
    (d / "spawned.json").write_text(json.dumps({"t": t}))
    events = [{"event": "start", "t": t + 1.0}, {"event": "engine", "t": t + 9.0, "startup_s": 8.0}]
    end = t + 9.0
    for sid, secs in scenarios:
        end += secs + 0.2
        events.append({"event": "scenario", "t": end, "id": sid, "duration_s": secs})
    (d / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    (d / "engine.log").write_text("nothing of vLLM's\n")


def test_a_pytest_runs_sessions_are_its_engines(tmp_path: Path) -> None:
    _session(tmp_path, "gw0", "vllm0.21.0-mp-async_on-4242", 1000.0, [("keep-clear", 1.0), ("wait-clear", 1.0)])
    _session(tmp_path, "gw1", "vllm0.32.0-mp-async_off-4343", 1000.5, [("keep-clear", 2.0)])
    run = load_pytest(tmp_path, wall_s=20.0, started=998.0, argv=("tests/integration/test_post_resume.py",))
    assert [e.engine for e in run.engines] == ["gw0/vllm0.21.0-mp-async_on", "gw1/vllm0.32.0-mp-async_off"]
    assert run.engines[0].spans[0].phase == "spawn+import" and run.engines[0].spans[0].start == 2.0
    assert run.before_engines_s == 2.0 and run.run_s == 20.0  # collection and environments before the first spawn
    assert run.phase_seconds()["scenario"] == 4.0
    assert "start-up not split" in run.engines[0].problems[0]  # the log lacks vLLM's lines: said, not guessed
    assert run.to_json()["scenarios"]["pause"]["cells"] == 3
    with pytest.raises(Exception, match="holds no engine sessions"):
        load_pytest(tmp_path / "nothing")


def test_from_a_kept_run_the_time_axis_starts_when_pytest_started(tmp_path: Path) -> None:
    _session(tmp_path, "gw0", "vllm0.21.0-mp-async_on-4242", 1000.0, [("keep-clear", 1.0)])
    assert load_pytest(tmp_path).before_engines_s == 0.0  # no span written: the first spawn is the origin
    (tmp_path / ".run-ab12cd34" / SESSION_SPAN_FILE).write_text(json.dumps({"started": 990.0, "finished": 1030.5}))
    run = load_pytest(tmp_path)
    assert run.before_engines_s == 10.0 and run.run_s == 40.5 and run.wall_s == 40.5
    (tmp_path / ".run-ab12cd34" / SESSION_SPAN_FILE).write_text("{not json")
    assert load_pytest(tmp_path).before_engines_s == 0.0  # a broken span is no span


def test_post_resume_runs_the_test_file_as_tox_does_and_keeps_the_engines(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    argv = bench._workload_argv("post-resume", ["--vllm-versions", "0.21.0"], tmp_path / "r")
    assert argv[1:] == ["-m", "pytest", "tests/integration/test_post_resume.py", "-n", "auto", "--dist",
                        "loadgroup", "--repro-reports", str(tmp_path / "r"), "--repro-keep-engines",
                        "--vllm-versions", "0.21.0"]
    tox = (Path(__file__).parents[2] / "tox.ini").read_text()
    assert "pytest tests/integration/test_post_resume.py -n auto --dist loadgroup {posargs}" in tox  # the same run
    monkeypatch.chdir(tmp_path)  # not the checkout: no test file to run
    assert main(["bench", "post-resume", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "from the checkout's root" in err and not (tmp_path / "b").exists()
    _session(tmp_path / "old", "main", "vllm0.21.0-mp-async_on-1", 50.0, [("keep-clear", 1.0)])
    assert main(["bench", "post-resume", "--from", str(tmp_path / "old"), "--out", str(tmp_path / "b")]) == 0
    doc = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert doc["workload"] == "post-resume" and doc["engines"][0]["engine"] == "main/vllm0.21.0-mp-async_on"
    assert (tmp_path / "b" / "timeline.svg").is_file()


def test_cpu_is_sampled_per_engine_folder_and_for_the_workload(tmp_path: Path) -> None:
    """The sampler's grouping, and one real pass: this test's own process as the workload."""
    import os

    from harness.bench.cpu import WORKLOAD, CpuSampler, engine_of

    assert engine_of(("engines", "vllm0.21.0-mp-async_on-tiny_kv", "x")) == "vllm0.21.0-mp-async_on-tiny_kv"
    assert engine_of(("engines", "vllm0.21.0-mp-async_on")) == "vllm0.21.0-mp-async_on"  # an engine runs there
    assert engine_of((".run-ab", "gw0", "sessions", "vllm0.21.0-mp-async_on-4242")) == "gw0/vllm0.21.0-mp-async_on"
    assert engine_of(("fuzz.json",)) is None
    sampler = CpuSampler(tmp_path, os.getpid())
    sampler.sample()
    assert list({g for _, g in sampler.seen.values()}) == [WORKLOAD] and sampler.seen
