"""The scheduler tier's pure half (repro.sched.script): the token oracle, the operation model, scenarios."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.models.deterministic import cycle_permutation, expected_continuation
from repro.sched.script import (
    OP_KINDS,
    REFERENCE_SLACK,
    SCENARIOS,
    Op,
    RequestSpec,
    Script,
    ScriptError,
    Setup,
    build_script,
    reference_stream,
    token_at,
    with_setup,
)

pytestmark = pytest.mark.unit

VOCAB = 64
PERM = cycle_permutation(VOCAB, 0)


@given(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=5), st.integers(0, 3 * VOCAB))
@settings(max_examples=min(50, settings.default.max_examples), deadline=None)
def test_token_at_is_the_checkpoints_greedy_stream(prompt: list[int], n: int) -> None:
    # The scripted executor's answer for position p equals what the bigram checkpoint decodes.
    ref = reference_stream(PERM, prompt, n)
    assert ref == expected_continuation(PERM, prompt[-1], n)
    assert [token_at(PERM, prompt, p) for p in range(n)] == ref


def test_reference_has_no_repeat_within_a_cycle() -> None:
    # A stream shorter than the vocabulary never repeats a token, so a loss or a duplicate is visible.
    ref = reference_stream(PERM, [5], VOCAB)
    assert len(set(ref)) == VOCAB
    with pytest.raises(ValueError):
        token_at(PERM, [5], -1)


def test_setup_validation() -> None:
    assert Setup().is_async and Setup().depth == 2
    for bad in ({"scheduler": "fast"}, {"depth": 0}, {"depth": 4}, {"scheduler": "sync", "depth": 2},
                {"num_blocks": 0}, {"spec_tokens": 1, "spec_accepted": 2},
                {"scheduler": "async", "depth": 1}):
        with pytest.raises(ScriptError):
            Setup(**bad)  # type: ignore[arg-type]
    # The sync Scheduler drafts too: the executor hands it the worker's draft ids (update_draft_token_ids).
    assert Setup(scheduler="sync", depth=1, spec_tokens=2, spec_accepted=1).spec_tokens == 2


def test_op_model_round_trips_through_json() -> None:
    ops = [Op("add", rid="a"), Op("step", n=3), Op("step_until", tokens=4), Op("reset", in_flight=2),
           Op("pause", optional=True), Op("drain"), Op("abort", rid="a"), Op("run"),
           Op("abort_many", rids=("a", "b")), Op("abort_all"), Op("reset", connector=True)]
    for op in ops:
        assert Op.from_dict(json.loads(json.dumps(op.to_dict()))) == op
    assert Op("run").to_dict() == {"op": "run"}
    assert Op("add", rid="a").to_dict() == {"op": "add", "rid": "a"}
    assert Op("abort_many", rids=("a", "b")).to_dict() == {"op": "abort_many", "rids": ["a", "b"]}
    assert Op("abort_many", rids=("a", "b")).named == ("a", "b") and Op("abort", rid="a").named == ("a",)
    for bad in ({"op": "explode"}, {"op": "add"}, {"op": "step", "n": 0}, {"rid": "a"},
                {"op": "run", "when": "now"}, {"op": "abort_many"}, {"op": "abort", "rid": "a", "rids": ["b"]},
                {"op": "step", "connector": True}):
        with pytest.raises(ScriptError):
            Op.from_dict(bad)
    assert set(OP_KINDS) == {"add", "step", "step_until", "fill", "pop", "drain", "reset", "pause", "resume",
                             "abort", "abort_many", "abort_all", "feed", "close", "run"}


def test_script_checks_requests_and_ops() -> None:
    req = RequestSpec("a", (3, 4), 5)
    with pytest.raises(ScriptError, match="duplicate"):
        Script(Setup(), (req, req), ())
    with pytest.raises(ScriptError, match="unknown request"):
        Script(Setup(), (req,), (Op("add", rid="b"),))
    with pytest.raises(ScriptError, match="unknown request 'b'"):
        Script(Setup(), (req,), (Op("abort_many", rids=("a", "b")),))
    with pytest.raises(ScriptError, match="added twice"):
        Script(Setup(), (req,), (Op("add", rid="a"), Op("add", rid="a")))
    with pytest.raises(ScriptError, match="depth >= 2"):
        Script(Setup(scheduler="sync", depth=1), (req,), (Op("reset", in_flight=1),))
    for bad in ({"rid": "", "prompt": (1,), "max_tokens": 1}, {"rid": "a", "prompt": (), "max_tokens": 1},
                {"rid": "a", "prompt": (1,), "max_tokens": 0}):
        with pytest.raises(ScriptError):
            RequestSpec(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - {"ops"}))
def test_named_scenarios_replay_exactly_as_ops(name: str) -> None:
    script = build_script(name, {}, VOCAB, seed=3)
    again = build_script("ops", json.loads(json.dumps(script.to_dict())), VOCAB)
    assert again == script
    assert all(op.rid in {r.rid for r in script.requests} for op in script.ops if op.rid)
    # Every request is submitted and the script ends by running everything to completion.
    assert {op.rid for op in script.ops if op.op == "add"} == {r.rid for r in script.requests}
    assert script.ops[-1] == Op("run")


def test_drained_reset_is_a_keep_pause_then_a_reset_with_nothing_in_flight() -> None:
    # vllm#42043: drain every in-flight frame (keep pause), reset with running requests, then resume.
    script = build_script("drained_reset", {"reset_after": 5, "n_requests": 2}, VOCAB)
    kinds = [op.op for op in script.ops]
    assert kinds == ["add", "add", "step_until", "pause", "drain", "reset", "resume", "run"]
    assert script.ops[2].tokens == 5 and script.ops[5].in_flight is None
    assert script.setup.is_async and script.setup.depth == 2
    sync = build_script("drained_reset", {"scheduler": "sync"}, VOCAB)
    assert sync.setup.scheduler == "sync" and sync.setup.depth == 1
    assert with_setup(sync, scheduler="async", depth=3).setup.depth == 3


def test_inflight_reset_defaults_to_what_an_engine_holds_between_iterations() -> None:
    script = build_script("inflight_reset", {}, VOCAB)
    reset = next(op for op in script.ops if op.op == "reset")
    assert script.setup.depth == 3 and reset.in_flight == 2
    assert next(op for op in build_script("inflight_reset", {"depth": 2}, VOCAB).ops
                if op.op == "reset").in_flight == 1
    with pytest.raises(ScriptError, match="exceeds"):
        build_script("inflight_reset", {"in_flight": 3, "depth": 2}, VOCAB)


def test_spec_reset_resets_with_frames_in_flight_or_drained() -> None:
    script = build_script("spec_reset", {}, VOCAB)
    assert script.setup.spec_tokens == 2 and script.setup.spec_accepted == 1
    assert [op.op for op in script.ops[-2:]] == ["reset", "run"] and script.ops[-2].in_flight == 1
    drained = build_script("spec_reset", {"in_flight": 0}, VOCAB)
    assert [op.op for op in drained.ops[-3:]] == ["drain", "reset", "run"]
    assert all(op.op != "reset" for op in build_script("spec_decode", {}, VOCAB).ops)


def test_scenario_parameters_are_checked() -> None:
    with pytest.raises(ScriptError, match="unknown scenario"):
        build_script("nope", {}, VOCAB)
    with pytest.raises(ScriptError, match="unknown parameters"):
        build_script("drained_reset", {"resetafter": 3}, VOCAB)
    with pytest.raises(ScriptError, match="outside the vocabulary"):
        build_script("ops", {"requests": [{"rid": "a", "prompt": [VOCAB], "max_tokens": 2}], "ops": []}, VOCAB)
    with pytest.raises(ScriptError, match="needs requests"):
        build_script("ops", {"ops": []}, VOCAB)
    with pytest.raises(ScriptError):
        build_script("preempt_pressure", {"n_requests": 0}, VOCAB)


def test_prompts_are_distinct_and_clear_of_bos_eos() -> None:
    script = build_script("preempt_pressure", {"n_requests": 6}, VOCAB, seed=1)
    prompts = [r.prompt for r in script.requests]
    assert len(set(prompts)) == 6 and all(min(p) >= 2 for p in prompts)
    assert build_script("preempt_pressure", {"n_requests": 6}, VOCAB, seed=1) == script
    assert REFERENCE_SLACK >= 8  # the oracle tries shifts up to 8
