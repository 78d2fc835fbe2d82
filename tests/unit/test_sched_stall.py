"""The scheduler state a STALL's reason quotes (repro.sched.stall), read from a scheduler-like object (no vLLM)."""

from __future__ import annotations

import enum
from collections import deque
from types import SimpleNamespace

import pytest

from repro.sched.stall import scheduler_state, state_text

pytestmark = pytest.mark.unit


class Status(enum.Enum):
    RUNNING = 2
    WAITING = 1


def _req(rid: str, status: Status, computed: int, placeholders: int | None) -> SimpleNamespace:
    req = SimpleNamespace(request_id=rid, status=status, num_computed_tokens=computed, num_tokens=7,
                          num_prompt_tokens=3)
    if placeholders is not None:  # releases before async scheduling have no placeholder count
        req.num_output_placeholders = placeholders
    return req


def test_the_state_names_the_step_the_queues_and_each_requests_counts() -> None:
    r0, r1 = _req("r0", Status.RUNNING, 6, 1), _req("r1", Status.WAITING, 0, None)
    sched = SimpleNamespace(requests={"r0": r0, "r1": r1}, running=[r0], waiting=deque([r1]))
    state = scheduler_state(sched, 70, 0)
    assert state == {"step": 70, "in_flight": 0, "waiting": ["r1"], "running": ["r0"], "requests": {
        "r0": {"status": "RUNNING", "num_computed_tokens": 6, "num_tokens": 7, "num_prompt_tokens": 3,
               "num_output_placeholders": 1},
        "r1": {"status": "WAITING", "num_computed_tokens": 0, "num_tokens": 7, "num_prompt_tokens": 3}}}
    assert state_text(state) == ("step 70, 0 frame(s) in flight; waiting [r1], running [r0]; "
                                 "r0 RUNNING computed 6 tokens 7 prompt 3 placeholders 1; "
                                 "r1 WAITING computed 0 tokens 7 prompt 3")


def test_a_scheduler_without_readable_queues_still_gives_a_state() -> None:
    state = scheduler_state(SimpleNamespace(waiting=3), 5, 2)
    assert state == {"step": 5, "in_flight": 2, "waiting": [], "running": [], "requests": {}}
    assert state_text(state) == "step 5, 2 frame(s) in flight; waiting [], running []"
