"""The scheduler fuzzer's operation model (repro.sched.opmodel), without vLLM: setups, requests, rule
preconditions, the replayable script, and the oracle of positions."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.models.deterministic import cycle_permutation
from repro.sched.opmodel import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    MIN_BLOCKS,
    PROMPT_ALPHABET,
    FuzzState,
    failure_kind,
    finish_fault,
    fit_request,
    minimise,
    prompt_tokens,
    reductions,
    setup_for,
    stream_fault,
    without,
)
from repro.sched.script import REFERENCE_SLACK, Op, Script, build_script, reference_stream, token_at

pytestmark = pytest.mark.unit

VOCAB = 64
PERM = cycle_permutation(VOCAB, 0)


@given(st.sampled_from((1, 2, 3)), st.integers(MIN_BLOCKS, 80), st.integers(0, 4), st.integers(0, 4))
def test_a_drawn_setup_is_one_an_engine_starts_with(depth: int, blocks: int, k: int, accepted: int) -> None:
    s = setup_for(depth, blocks, k, accepted)
    # D=1 is the sync Scheduler, D=2,3 the AsyncScheduler (Setup refuses the other pairings).
    assert s.scheduler == ("sync" if depth == 1 else "async") and s.depth == depth
    # max_model_len tokens fit the blocks left beside vLLM's null block: no request can outgrow the cache.
    assert s.max_model_len <= (blocks - 1) * BLOCK_SIZE and s.max_model_len <= MAX_MODEL_LEN
    assert s.max_model_len == min(MAX_MODEL_LEN, (blocks - 1) * BLOCK_SIZE)
    # Drafts are scripted for both schedulers (the sync one gets them as the worker's draft ids), unless the
    # release's sync Scheduler cannot draft; never more accepted than drafted.
    assert s.spec_tokens == k and s.spec_accepted <= s.spec_tokens
    assert setup_for(depth, blocks, k, accepted, sync_spec=False).spec_tokens == (k if depth > 1 else 0)


def test_too_few_blocks_for_any_request_is_refused() -> None:
    with pytest.raises(ValueError, match="null block"):
        setup_for(2, MIN_BLOCKS - 1)


@given(st.sampled_from((1, 2, 3)), st.integers(MIN_BLOCKS, 20), st.integers(0, PROMPT_ALPHABET - 1),
       st.integers(1, 300), st.integers(1, 300))
def test_a_drawn_request_fits_max_model_len(depth: int, blocks: int, first: int, length: int, max_tokens: int
                                            ) -> None:
    setup = setup_for(depth, blocks)
    req = fit_request(setup, "r0", prompt_tokens(first, length), max_tokens)
    assert len(req.prompt) >= 1 and 1 <= req.max_tokens <= max_tokens
    assert len(req.prompt) + req.max_tokens <= setup.max_model_len
    # Nothing is cut that fits already.
    if length + max_tokens <= setup.max_model_len:
        assert (len(req.prompt), req.max_tokens) == (length, max_tokens)


def test_prompts_share_prefixes_and_avoid_bos_eos() -> None:
    a, b = prompt_tokens(3, 20), prompt_tokens(3, 5)
    assert a[:5] == b and min(a) >= 2 and max(a) < 2 + PROMPT_ALPHABET
    assert prompt_tokens(4, 5) != b


def _state(depth: int = 2, pause: bool = True, max_requests: int = 3) -> FuzzState:
    return FuzzState(setup_for(depth, 8), pause, max_requests)


def test_add_precondition_counts_requests_and_names_them_in_order() -> None:
    state = _state(max_requests=2)
    assert state.can_add()
    op, req = state.add((5, 6), 4)
    assert op == Op("add", rid="r0") and req.rid == "r0" and req.prompt == (5, 6)
    state.add((5,), 1)
    assert not state.can_add() and [r.rid for r in state.requests] == ["r0", "r1"]


def test_pause_and_resume_preconditions_follow_the_pause_state_and_the_release() -> None:
    state = _state()
    assert state.can_pause() and not state.can_resume()
    state.record(Op("pause"))
    assert state.paused and not state.can_pause() and state.can_resume()
    # The teardown resumes a paused scheduler before running it to completion (it schedules nothing paused).
    assert state.teardown_ops() == [Op("resume"), Op("run")]
    state.record(Op("resume"))
    assert not state.paused and state.teardown_ops() == [Op("run")]
    assert not _state(pause=False).can_pause(), "no set_pause_state before 0.19: never drawn"


@given(st.sampled_from((1, 2, 3)), st.one_of(st.none(), st.integers(0, 5)))
def test_a_reset_has_at_most_d_minus_1_frames_in_flight(depth: int, in_flight: int | None) -> None:
    op = _state(depth).reset(in_flight)
    assert op.op == "reset"
    if in_flight is None:
        assert op.in_flight is None, "as it is: whatever the iterations left in flight"
    else:
        # EngineCore processes the oldest frame as soon as D are in flight: between iterations (where a reset
        # runs) at most D-1 are; the sync scheduler (D=1) never has one.
        assert op.in_flight == min(in_flight, depth - 1)


def test_abort_picks_a_running_request_or_nothing() -> None:
    assert FuzzState.abort([], 3) is None
    assert FuzzState.abort(["r0", "r2"], 3) == Op("abort", rid="r2")
    assert FuzzState.abort(["r0", "r2"], 0) == Op("abort", rid="r0")


def test_a_batched_abort_names_two_or_more_requests_once() -> None:
    assert FuzzState.abort_many([], [0, 1]) is None
    assert FuzzState.abort_many(["r0", "r1"], [0, 2]) is None, "both picks are r0: one id is a plain abort"
    assert FuzzState.abort_many(["r0", "r1", "r2"], [2, 0, 5]) == Op("abort_many", rids=("r2", "r0"))


def test_the_script_replays_what_the_example_did_and_runs_to_completion() -> None:
    state = _state(depth=3)
    for op in (state.add((5, 6), 4)[0], Op("step", n=2), state.reset(2), Op("pause")):
        state.record(op)
    script = state.script()
    assert [o.op for o in script.ops] == ["add", "step", "reset", "pause", "resume", "run"]
    # The ops scenario reads it back exactly (what `vllm-repro plan` replays).
    assert build_script("ops", json.loads(json.dumps(script.to_dict())), VOCAB) == script
    for op in state.tear_down():
        state.record(op)
    assert state.script().ops == script.ops, "the teardown's ops are not appended twice"


@given(st.lists(st.integers(2, VOCAB - 1), min_size=1, max_size=4), st.integers(1, 20), st.data())
def test_the_oracle_of_positions(prompt: list[int], max_tokens: int, data: st.DataObject) -> None:
    ref = reference_stream(PERM, prompt, max_tokens + REFERENCE_SLACK)
    assert ref[:5] == [token_at(PERM, prompt, p) for p in range(min(5, len(ref)))]
    n = data.draw(st.integers(0, max_tokens))
    assert stream_fault(ref, ref[:n], max_tokens) is None, "every prefix is the tokens of its positions"
    if n >= 2:
        i = data.draw(st.integers(0, n - 2))
        lost = ref[:i] + ref[i + 1: n + 1]
        assert f"position {i}:" in (stream_fault(ref, lost, max_tokens) or ""), "a lost token shows where"
        repeated = ref[: i + 1] + ref[i: n - 1]
        assert f"position {i + 1}:" in (stream_fault(ref, repeated, max_tokens) or "")
    assert "max_tokens" in (stream_fault(ref, ref[: max_tokens + 1], max_tokens) or "")


def test_finish_fault() -> None:
    assert finish_fault(4, 4, "length", aborted=False) is None
    assert finish_fault(2, 4, None, aborted=True) is None, "an aborted request is done"
    assert finish_fault(2, 4, None, aborted=False) == "never finished (2 of 4 tokens delivered)"
    assert finish_fault(3, 4, "length", aborted=False) == "finished (length) with 3 of 4 tokens"


def test_failure_kinds_tell_what_a_smaller_script_must_hit() -> None:
    assert failure_kind("r0: position 2: delivered 9, ...", None) == "stream"
    assert failure_kind("r0: 5 tokens delivered, max_tokens=4", None) == "stream"
    assert failure_kind("stalled: run to completion: nothing scheduled", None) == "stall"
    assert failure_kind("r1: never finished (2 of 4 tokens delivered)", None) == "finish"
    assert failure_kind("", "vllm/v1/core/sched/async_scheduler.py:53:f") == \
        "crash at vllm/v1/core/sched/async_scheduler.py:53:f"


def test_minimise_drops_what_the_failure_does_not_need() -> None:
    state = _state(depth=2, max_requests=4)
    for op in (state.add((5,), 4)[0], Op("pause"), Op("resume"), state.add((6,), 4)[0], Op("step", n=2),
               Op("drain"), state.reset(0), Op("pause")):
        state.record(op)
    script = state.script()
    # A stand-in failure: it needs r1 added and a reset with nothing in flight, nothing else.
    needs = {Op("add", rid="r1"), Op("reset", in_flight=0)}

    def fails(s: Script) -> bool:
        return needs <= set(s.ops)

    small = minimise(script, fails)
    assert [o.op for o in small.ops] == ["add", "reset", "run"] and [r.rid for r in small.requests] == ["r1"]
    assert small.ops[-1] == Op("run"), "the teardown's run stays: a replay still runs to completion"
    assert minimise(script, lambda s: False) == script
    # A batched abort loses the id of a request cut away, and becomes a single abort with one id left.
    assert list(without([Op("abort_many", rids=("r0", "r1", "r2")), Op("add", rid="r1")], "r1")) == \
        [Op("abort_many", rids=("r0", "r2"))]
    assert list(without([Op("abort_many", rids=("r0", "r1"))], "r0")) == [Op("abort", rid="r1")]
    for smaller in reductions(script):
        assert len(smaller.ops) < len(script.ops)
        build_script("ops", smaller.to_dict(), VOCAB)  # every reduction is a valid script


def test_a_session_is_fed_within_max_model_len_and_closed_at_teardown() -> None:
    state = _state(depth=2, max_requests=4)
    op, req = state.add((5,) * 10, 16, session=True)
    state.record(op)
    assert req.session and state.open_sessions() == ["r0"]
    # max_model_len 112 (8 blocks): every turn so far, outputs included, stays within it.
    fed = state.feed("r0", (6,) * 200, 16)
    assert fed is not None and fed[0] == Op("feed", rid="r0")
    state.record(fed[0])
    turns = state.requests[0].turns
    assert sum(len(p) + m for p, m in turns) <= state.setup.max_model_len and len(turns) == 2
    assert state.feed("r0", (6,), 4) is None, "no room is left"
    script = state.script()
    assert script.ops[-2:] == (Op("close", rid="r0"), Op("run")), "an open session is closed before the run"
    assert all(Op("close", rid="r0") in s.ops for s in reductions(script)), "a close is never cut alone"
    build_script("ops", script.to_dict(), VOCAB)
    state.record(state.close("r0"))
    assert state.open_sessions() == [] and state.script().ops[-1] == Op("run")


def test_a_short_session_chunk_after_accepted_drafts_is_drawn_as_drawn() -> None:
    # Issue 38: it meets vLLM <= 0.32's assert num_new_tokens > 0 (session-spec, a known row), which the fuzzer now
    # reports KNOWN instead of never drawing it (chunks were lengthened to k tokens before).
    for setup in (setup_for(1, 8, spec_tokens=2, spec_accepted=2), setup_for(2, 8, spec_tokens=2, spec_accepted=2)):
        state = FuzzState(setup, True, 4)
        state.record(state.add((5,) * 4, 2, session=True)[0])
        fed = state.feed("r0", (6,), 2)
        assert fed is not None and fed[1].chunks[-1][0] == (6,)


def test_a_reset_with_a_consumer_kv_connector_keeps_its_frames_in_flight() -> None:
    # Issue 38: with frames in flight it raises "Failed to reset KV cache" from 0.24.0 (reset-kv, a known row),
    # reported KNOWN now; it was forced drained before.
    state = FuzzState(replace(setup_for(3, 8), kv_consumer=True), True, 4)
    assert state.reset(2) == Op("reset", in_flight=2) and state.reset(None) == Op("reset")


def test_an_n_gt_1_request_is_its_children_and_its_abort_theirs() -> None:
    state = _state(depth=2, max_requests=5)
    state.record(state.add((5, 6), 4)[0])
    kids = state.add_group((7, 8, 9), 3, 0, 4)
    assert [req.rid for _, req in kids] == ["0_g1", "1_g1", "2_g1", "3_g1"]
    assert {req.prompt for _, req in kids} == {(7, 8, 9)} and all(op.op == "add" for op, _ in kids)
    assert state.groups == {"g1": ["0_g1", "1_g1", "2_g1", "3_g1"]} and not state.can_add()
    assert state.add_group((7,), 3, 0, 4) == [], "no room: no child"
    assert FuzzState.abort_children(["0_g1", "2_g1"]) == Op("abort_many", rids=("0_g1", "2_g1"))
    assert FuzzState.abort_children(["3_g1"]) == Op("abort", rid="3_g1") and FuzzState.abort_children([]) is None
    for op, _ in kids:
        state.record(op)
    build_script("ops", state.script().to_dict(), VOCAB)
