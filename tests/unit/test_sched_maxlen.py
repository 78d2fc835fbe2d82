"""A streaming-input session whose own turns bring its context to max_model_len (repro.sched.fuzz_found
session_max_model_len, docs/results/maxlen-2026-12-04/): the scenario's shape, what a length-capped session turn
delivers (repro.sched.session_turns), the STALL the oracle gives the measured stall, and the known-bug signature that
files the fuzzer's 0.21.0 example under its row (repro.sched.known)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.core.events import as_scenario_event
from harness.core.oracle import Outcome
from harness.core.scenarios import BY_SCENARIO
from harness.run.scenario_results import scenario_result
from harness.sched.tier import SHAPES, sched_result
from repro.models.deterministic import cycle_permutation
from repro.sched.known import Match, Row, classify
from repro.sched.script import Script, build_script
from repro.sched.session_turns import session_expectation, turn_counts
from repro.sched.upstream import build_any_script

pytestmark = pytest.mark.unit

VOCAB = 512
ROOT = Path(__file__).resolve().parents[2]
FUZZ_PLAN = ROOT / "docs/results/fuzz-found-2026-12-04/fuzz-0.21.0/falsifying-0.21.0.json"
ROW = Row("session-max-model-len", False, "session stalled at max_model_len", "STALL")
CELL = Cell("0.32.0", "mp", False, "keep", True, tier="scheduler", scenario="session-max-model-len")
# The measured 0.32.0 stall (docs/results/maxlen-2026-12-04/matrix-cpu/): the chunk prefilled to 63 of 64.
STALLED = ("run to completion: nothing scheduled or delivered in 64 iterations; step 74, 0 frame(s) in flight; "
           "waiting [], running [s0]; s0 RUNNING computed 63 tokens 64 prompt 64 placeholders 0")


def _script(**params: Any) -> Script:
    return build_any_script("session_max_model_len", params, VOCAB, 0)


def _context_after_chunk(s: Script) -> int:
    [s0] = s.requests
    return len(s0.prompt) + s0.max_tokens - 1 + len(s0.chunks[0][0])


def test_the_scenario_brings_the_sessions_own_turns_to_the_limit_in_two_prefill_steps() -> None:
    s = _script()
    assert BY_SCENARIO["session-max-model-len"].tiers == ("scheduler",)
    assert SHAPES["session-max-model-len"].sync is not None and SHAPES["session-max-model-len"].excess_checks
    assert s.setup.max_model_len == 64 and _context_after_chunk(s) == 64
    assert len(s.requests[0].chunks[0][0]) > s.setup.max_num_batched_tokens, "the chunk is prefilled in two steps"
    assert [o.op for o in s.ops] == ["add", "feed", "close", "run"]
    assert _context_after_chunk(_script(over=1)) == 65 and _context_after_chunk(_script(over=-1)) == 63
    assert [o.op for o in _script(over=-2, then=1).ops] == ["add", "feed", "feed", "close", "run"]
    with pytest.raises(ValueError, match="over"):
        _script(over=-41)


def test_a_session_turn_is_length_capped_where_its_context_reaches_max_model_len() -> None:
    turns = [([2] * 16, 8), ([3] * 40, 4)]  # the control: context 63, room for one token
    assert turn_counts(turns) == [8, 4] and turn_counts(turns, 64) == [8, 1]
    assert turn_counts([([2] * 16, 8), ([3] * 39, 4)], 64) == [8, 2]  # the turn straddles the limit
    assert turn_counts([([2] * 16, 8), ([3] * 39, 4), ([4], 1)], 64) == [8, 2, 1]  # the chunk after it: at 64
    assert turn_counts([([2] * 16, 8), ([3] * 41, 4)], 64) == [8, 1], "at the limit: the token its prefill samples"
    perm = cycle_permutation(VOCAB, 0)
    n, ref = session_expectation(perm, turns, 64)
    assert n == 9 and len(ref) > n


def _event(observed_of: int, limit: int, stalled: str | None = None, finish: str | None = "length") -> Any:
    perm = cycle_permutation(VOCAB, 0)
    turns = [(list(range(2, 18)), 8), (list(range(20, 60)), 4)]
    n, ref = session_expectation(perm, turns, limit)
    record = {"rid": "s0", "submit": "start", "prompt": turns[0][0], "max_tokens": n, "reference": ref,
              "observed": ref[:observed_of], "finish_reason": finish, "error": None, "pauses": []}
    return as_scenario_event({"event": "scenario", "id": "s", "status": "ran", "stalled": stalled,
                              "records": [record], "scheduler_class": "vllm.v1.core.sched.scheduler.Scheduler"})


def test_the_oracle_calls_the_measured_stall_stall_and_the_length_capped_control_ok() -> None:
    stall = sched_result(CELL, _event(8, 64, stalled=STALLED, finish=None), None, scenario_result)
    assert stall.outcome is Outcome.STALL and "computed 63 tokens 64 prompt" in stall.summary
    ok = sched_result(CELL, _event(9, 64), None, scenario_result)
    assert ok.outcome is Outcome.OK, ok.summary
    # Without the cap the same 9 tokens read as a short stream: why the records count a turn to the limit.
    assert sched_result(CELL, _event(9, 0), None, scenario_result).outcome is Outcome.TRUNCATED
    # A turn that delivers past the limit is judged too (the excess check: DIVERGED).
    assert sched_result(CELL, _event(10, 64), None, scenario_result).outcome is Outcome.DIVERGED


def _fuzz_example() -> Script:
    return build_script("ops", json.loads(FUZZ_PLAN.read_text())["script"], VOCAB)


def test_the_fuzzers_0_21_0_example_is_the_max_model_len_row_its_control_leaves_the_turns() -> None:
    seen: list[Script] = []

    def control(s: Script) -> bool:
        seen.append(s)
        return False

    script = _fuzz_example()
    failure = "AssertionError: stalled: ... r5 RUNNING computed 255 tokens 256 prompt 256 placeholders 0"
    assert classify(script, "stall", failure, [ROW], control) == Match(ROW.bug, "session-max-model-len", "STALL")
    assert seen[-1].requests == script.requests and seen[-1].ops == script.ops, "the turns as the fuzzer drew them"
    assert seen[-1].setup.max_model_len > 256 + 16 and seen[-1].setup.num_blocks >= 64
    assert classify(script, "stall", failure, [ROW], lambda s: True) is None, "a stall that stays is new"
    assert classify(script, "stream", failure, [ROW], lambda s: False) is None, "only a stall is this row's"


def test_a_session_that_cannot_reach_the_limit_is_not_the_max_model_len_row() -> None:
    scenario = _script(scheduler="sync")
    assert classify(scenario, "stall", "stalled", [ROW], lambda s: False) is not None
    far = replace(scenario, setup=replace(scenario.setup, max_model_len=256))
    assert classify(far, "stall", "stalled", [ROW], lambda s: False) is None
    unfed = replace(scenario, ops=tuple(o for o in scenario.ops if o.op != "feed"))
    assert classify(unfed, "stall", "stalled", [ROW], lambda s: False) is None, "a plain prompt: the front end's"
