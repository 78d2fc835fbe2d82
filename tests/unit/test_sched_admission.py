"""The ``max-seqs-admission`` scenario (repro/sched/admission.py, harness/sched/admission.py; vllm#45257) against
toy schedulers with a ``max_num_seqs`` cap: its script, its precondition, and an oracle that fails when a step
admits fewer requests than the cap while one waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from toy_sched import ToyAdapter, ToyRequest, ToyScheduler

from harness.core.cell import Cell
from harness.core.events import as_scenario_event
from harness.core.oracle import Outcome
from harness.core.records import CellResult, EngineInfo
from harness.run.scenario_results import scenario_result
from harness.sched.admission import underfilled
from harness.sched.tier import sched_result, sched_scenario
from repro.models.deterministic import cycle_permutation
from repro.sched.admission import precondition
from repro.sched.scenario import run_scenario
from repro.sched.script import ScriptError
from repro.sched.upstream import build_any_script

pytestmark = pytest.mark.unit

VOCAB = 64
PERM = cycle_permutation(VOCAB, 0)
CELL = Cell("0.34.0", "mp", True, scenario="max-seqs-admission", tier="scheduler")
CLASSES = {True: "vllm.v1.core.sched.async_scheduler.AsyncScheduler", False: "vllm.v1.core.sched.scheduler.Scheduler"}


class CappedScheduler(ToyScheduler):
    """The toy with a waiting queue and ``max_num_seqs``: each step schedules at most ``cap`` requests.  Faithful
    (``count_running=False``): a running request whose last token is in flight does not count.  ``count_running``:
    vLLM's admission gate ``len(self.running) >= max_num_seqs`` (vllm#45257), which counts it."""

    def __init__(self, cap: int, count_running: bool, async_: bool = True) -> None:
        super().__init__(async_=async_)
        self.cap, self.count_running = cap, count_running
        self.waiting: list[ToyRequest] = []

    def add_request(self, req: ToyRequest) -> None:
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def has_requests(self) -> bool:
        return bool(self.running or self.waiting)

    def schedule(self) -> Any:
        busy = len(self.running) if self.count_running else sum(
            1 for r in self.running if len(r.output) + r.placeholders < r.max_tokens)
        while self.waiting and busy < self.cap:
            self.running.append(self.waiting.pop(0))
            busy += 1
        # vLLM's "Avoid scheduling an extra step" skip (scheduler.py:815-831 in 0.34.0): a request whose last
        # token is in flight is not scheduled again; the base toy schedules whatever is running.
        done = [r for r in self.running if len(r.output) + r.placeholders >= r.max_tokens]
        kept, self.running = self.running, [r for r in self.running if r not in done]
        try:
            return super().schedule()
        finally:
            self.running = kept


def _event(sched: ToyScheduler, async_on: bool = True) -> dict[str, Any]:
    sc = sched_scenario(CELL.replace(async_on=async_on), "admission", 0)
    ev = run_scenario(ToyAdapter(sched), sc, Path("."), PERM)
    assert ev["status"] == "ran", ev.get("reason")
    return {"event": "scenario", "id": "admission", **ev, "scheduler_class": CLASSES[async_on]}


def _judge(ev: dict[str, Any], async_on: bool = True) -> CellResult:
    return sched_result(CELL.replace(async_on=async_on), as_scenario_event(ev), EngineInfo({"tier": "scheduler"}),
                        scenario_result)


def test_the_script_adds_three_caps_of_one_token_requests_before_the_first_step() -> None:
    script = build_any_script("max_seqs_admission", {}, VOCAB, 0)
    assert script.setup.max_num_seqs == 4 and len(script.requests) == 12
    assert {r.max_tokens for r in script.requests} == {1}
    assert [op.op for op in script.ops] == ["add"] * 12 + ["run"]
    with pytest.raises(ScriptError, match="exceed the step budget"):
        build_any_script("max_seqs_admission", {"max_num_batched_tokens": 16}, VOCAB, 0)


@pytest.mark.parametrize("async_on", [True, False])
def test_a_scheduler_that_admits_past_finishing_requests_is_ok(async_on: bool) -> None:
    ev = _event(CappedScheduler(4, count_running=False, async_=async_on), async_on)
    assert ev["precondition"]["met"], ev["precondition"]
    res = _judge(ev, async_on)
    assert res.outcome is Outcome.OK and "every frame full while requests waited" in res.summary, res.summary


def test_counting_in_flight_finishers_against_the_cap_is_a_stall_with_async_on_only() -> None:
    res = _judge(_event(CappedScheduler(4, count_running=True)))
    assert res.outcome is Outcome.STALL, res.summary
    assert "frame 1: 0 scheduled, 8 waiting" in res.summary and "frame 3: 0 scheduled, 4 waiting" in res.summary
    # The sync Scheduler processes each frame before the next: the same gate never bites (the control).
    sync = _judge(_event(CappedScheduler(4, count_running=True, async_=False), False), False)
    assert sync.outcome is Outcome.OK, sync.summary


def test_underfilled_counts_only_frames_with_a_request_waiting() -> None:
    first = {"a": 0, "b": 0, "c": 2, "d": None}
    assert underfilled(4, first, {0: 2, 2: 1}, 2) == [(1, 0, 2), (2, 1, 1), (3, 0, 1)]
    assert underfilled(3, {"a": 0, "b": 1}, {0: 1, 1: 1}, 1) == []


def test_a_late_add_fails_the_precondition_and_the_rule_is_not_applied() -> None:
    ev = _event(CappedScheduler(4, count_running=True))
    log = [{"op": {"op": "run"}}, *ev["ops_log"]]
    pre = precondition(log, ev["records"], ev["setup"])
    assert not pre["met"] and "r0 was added after the first step" in pre["what"]
    res = _judge({**ev, "precondition": pre})
    assert res.outcome is Outcome.UNSUPPORTED and "precondition not met" in res.summary
    few = precondition(ev["ops_log"], ev["records"][:4], ev["setup"])
    assert "nothing ever waits" in few["what"]
