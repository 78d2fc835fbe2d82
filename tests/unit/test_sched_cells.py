"""Scheduler-tier cells on the harness side (harness.sched.tier, the tier axis in planning and verdicts)."""

from __future__ import annotations

from typing import Any

import pytest
from synthetic import request_record

from harness.core.cell import Cell
from harness.core.events import as_scenario_event
from harness.core.oracle import Outcome
from harness.core.scenarios import SCENARIO_TABLE
from harness.plan.matrix import unsupported_reason
from harness.run.scenario_results import scenario_result
from harness.sched.tier import SHAPES, sched_result, sched_scenario, sched_spec
from harness.verdicts.workarounds import workaround_verdicts
from repro.sched.script import SCHEMA_VERSION, build_script
from repro.sched.upstream import build_any_script

pytestmark = pytest.mark.unit

SCHED = Cell("0.21.0", "mp", True, "keep", True, tier="scheduler")
ASYNC_CLS = "vllm.v1.core.sched.async_scheduler.AsyncScheduler"


def test_only_keep_mode_pauses_with_default_engine_axes_are_expressed() -> None:
    assert unsupported_reason(SCHED, "cpu") is None
    assert unsupported_reason(SCHED.replace(async_on=False, clear_cache=False), "cuda", n_gpus=0) is None
    for other in (SCHED.replace(executor="ray-v2"), SCHED.replace(tp=2), SCHED.replace(model_runner="v2")):
        assert "no executor, TP, model runner" in (unsupported_reason(other, "cpu") or "")
    assert "keep-mode pauses only" in (unsupported_reason(SCHED.replace(mode="wait"), "cpu") or "")
    assert "not implemented on the scheduler tier" in (unsupported_reason(SCHED.replace(scenario="weight-sync"),
                                                                           "cpu") or "")


def test_every_scheduler_tier_scenario_has_a_script_for_each_async_setting_it_expresses() -> None:
    sched_scenarios = {s.name for s in SCENARIO_TABLE if "scheduler" in s.tiers} - {"pause"}
    assert sched_scenarios == set(SHAPES)
    for name in sorted(sched_scenarios):
        for async_on in (True, False):
            cell = Cell("0.21.0", "mp", async_on, scenario=name, tier="scheduler")
            reason = unsupported_reason(cell, "cpu")
            if reason is not None:
                # Only the async-off cell of an async-only shape is refused, with the shape's reason.
                assert not async_on and SHAPES[name].sync is None and reason == f"async off: {SHAPES[name].sync_reason}"
                continue
            sc = sched_scenario(cell, cell.scenario_id, 7)
            script = build_any_script(sc["scenario"], sc["params"], 512, 7)
            assert script.setup.is_async is async_on and sc["seed"] == 7 and sc["id"] == cell.scenario_id


def test_the_family_cells_play_their_shapes() -> None:
    def setup(name: str, async_on: bool = True) -> Any:
        sc = sched_scenario(SCHED.replace(scenario=name, async_on=async_on), "x", 0)
        return build_script(sc["scenario"], sc["params"], 512, 0)

    def reset_in_flight(script: Any) -> list[int | None]:
        return [op.in_flight for op in script.ops if op.op == "reset"]

    # PR #42117: one frame in flight at the reset (its flag's case), two (its other half); sync: none.
    assert (setup("reset-inflight").setup.depth, reset_in_flight(setup("reset-inflight"))) == (2, [1])
    assert (setup("reset-deep").setup.depth, reset_in_flight(setup("reset-deep"))) == (3, [2])
    assert (setup("reset-inflight", False).setup.scheduler, reset_in_flight(setup("reset-inflight", False))) == \
        ("sync", [0])
    # PR #48245: memory pressure (7 KV blocks for 4 requests) with two frames in flight and drafts rejected.
    deep = setup("preempt-deep").setup
    assert (deep.depth, deep.num_blocks, deep.spec_tokens, deep.spec_accepted) == (3, 7, 2, 0)
    assert (setup("preempt").setup.depth, setup("preempt").setup.spec_tokens, setup("preempt", False).setup.depth) \
        == (2, 0, 1)
    # PRs #42117, #46066, #48245: resets with a frame in flight, every draft rejected; once, or twice.
    assert reset_in_flight(setup("spec-reset")) == [1] and reset_in_flight(setup("spec-reset-twice")) == [1, 1]
    assert setup("spec-reset").setup.spec_tokens == 2 and setup("spec-reset").setup.spec_accepted == 0
    assert setup("spec-reset-partial").setup.spec_accepted == 1 and reset_in_flight(setup("spec-reset-partial")) == [1]
    assert [op.op for op in setup("abort-some").ops].count("abort") == 1
    assert len(setup("abort-some").requests) == 3


def test_the_spec_a_cell_runs_builds_a_script() -> None:
    sc = sched_scenario(SCHED, "keep-clear", 3)
    assert sc == {"id": "keep-clear", "scenario": "drained_reset", "seed": 3,
                  "params": {"scheduler": "async", "depth": 2, "reset": True}}
    ops = [o.op for o in build_script(sc["scenario"], sc["params"], 512, 3).ops]
    assert "reset" in ops and "drain" in ops
    plain = sched_scenario(SCHED.replace(async_on=False, clear_cache=False), "keep-noclear", 3)
    assert plain["params"] == {"scheduler": "sync", "depth": 1, "reset": False}
    assert "reset" not in [o.op for o in build_script("drained_reset", plain["params"], 512, 3).ops]
    spec = sched_spec(SCHED.engine, [sc], "/cache", {})
    assert spec["schema_version"] == SCHEMA_VERSION and spec["version_label"] == "0.21.0" and spec["scenarios"] == [sc]


def _ran(cls: str = ASYNC_CLS, **extra: Any) -> dict[str, Any]:
    ref = list(range(10, 30))
    rec = request_record("r0", ref[:4] + ref[5:16], ref, running=True, pause_at=4, max_tokens=15)
    return {"event": "scenario", "id": "keep-clear", "status": "ran", "records": [rec], "scheduler_class": cls,
            **extra}


def test_streams_are_judged_by_the_oracle_with_the_scheduler_as_effective_setting() -> None:
    res = sched_result(SCHED, as_scenario_event(_ran()), {"tier": "scheduler"}, scenario_result)
    assert res.outcome is Outcome.LOSS and res.label == "LOSS(1)"
    assert res.engine is not None and res.engine["effective"] == {
        "async_scheduling": True, "executor_class": "AsyncScheduler",
        # The tier's one engine setting in the engine tier's settings table (repro.settings.declared).
        "settings": [{"name": "async_scheduling", "requested": True, "source": "axis async_scheduling",
                      "effective": True, "read": "the scheduler class repro.sched built", "why": "",
                      "status": "effective"}]}


def test_a_crash_in_vllm_is_crash_a_stall_is_stall_a_wrong_scheduler_is_unsupported() -> None:
    crash = {"event": "scenario", "id": "x", "status": "crash", "scheduler_class": ASYNC_CLS,
             "reason": "AssertionError:  at vllm/v1/core/sched/async_scheduler.py:53:_update_request_with_output",
             "vllm_source": "assert request.num_output_placeholders >= 0"}
    res = sched_result(SCHED, as_scenario_event(crash), None, scenario_result)
    assert res.outcome is Outcome.CRASH and "num_output_placeholders >= 0" in res.summary
    spec = sched_result(SCHED.replace(scenario="spec-reset"), as_scenario_event({**crash, "spec_method": "eagle"}),
                        None, scenario_result)
    assert spec.outcome is Outcome.CRASH and spec.engine is not None
    assert spec.engine["effective"]["spec_method"] == "eagle"
    stalled = as_scenario_event(_ran(stalled="r0 never finished"))
    stall = sched_result(SCHED, stalled, None, scenario_result)
    assert stall.outcome is Outcome.STALL and stall.outcome.is_finding and not stall.outcome.is_retryable
    wrong = sched_result(SCHED, as_scenario_event(_ran(cls="vllm.v1.core.sched.scheduler.Scheduler")), None,
                         scenario_result)
    assert wrong.outcome is Outcome.UNSUPPORTED and "asked for async on" in wrong.summary


def test_the_workaround_verdict_prefers_the_engine_tier_and_keeps_the_tiers_apart() -> None:
    from harness.verdicts.results import CellResult

    engine_on, engine_off = Cell("0.21.0", "mp", True, "keep", True), Cell("0.21.0", "mp", False, "keep", True)
    cells = [CellResult(engine_on, Outcome.OK, "OK 10/10"), CellResult(engine_off, Outcome.OK, "OK 10/10"),
             CellResult(SCHED, Outcome.LOSS, "LOSS(1) in 4/4 requests", label="LOSS(1)"),
             CellResult(SCHED.replace(async_on=False), Outcome.OK, "OK 4/4")]
    (v,) = workaround_verdicts(cells)
    assert v.status.value == "REMOVABLE" and v.executor == "mp"
    (alone,) = workaround_verdicts(cells[2:])
    assert alone.status.value == "NEEDED" and alone.executor == "mp-sched"


def test_a_preemption_cell_in_which_nothing_was_preempted_is_unsupported_not_ok() -> None:
    cell = SCHED.replace(scenario="preempt")
    ev = _ran()
    ev["records"][0]["observed"] = ev["records"][0]["reference"][:15]
    ev["records"][0]["pauses"] = []
    none = as_scenario_event({**ev, "records": [{**ev["records"][0], "num_preemptions": 0}]})
    assert "preempted no request" in sched_result(cell, none, None, scenario_result).summary
    two = as_scenario_event({**ev, "records": [{**ev["records"][0], "num_preemptions": 2}]})
    assert sched_result(cell, two, None, scenario_result).outcome is Outcome.OK
    # Shapes about resets do not ask for it.
    reset_deep = SCHED.replace(scenario="reset-deep")
    assert sched_result(reset_deep, as_scenario_event(ev), None, scenario_result).outcome is Outcome.OK


def test_one_scenario_event_judged_on_its_own_as_plan_and_fuzz_judge_it() -> None:
    from harness.sched.tier import sched_verdict

    assert sched_verdict(as_scenario_event(_ran())).label == "LOSS(1)"
    crash = sched_verdict(as_scenario_event({"status": "crash", "reason": "AssertionError:  at vllm/x.py:1:f",
                                             "vllm_source": "assert n >= 0"}))
    assert crash.outcome is Outcome.CRASH
    assert crash.summary == "CRASH: AssertionError:  at vllm/x.py:1:f (assert n >= 0)"
    # A scheduler that stops making progress is STALL (a finding; the matrix agrees); the streams' own verdict
    # stays in the summary.
    hang = "run to completion: nothing scheduled or delivered in 64 iterations"
    stalled = sched_verdict(as_scenario_event(_ran(stalled=hang)))
    assert stalled.outcome is Outcome.STALL and stalled.summary.startswith("STALL: vLLM's scheduler never")
    assert stalled.summary.endswith("streams: LOSS(1) in 1/1 requests (1/1 running at pause)")
    assert sched_result(SCHED, as_scenario_event(_ran(stalled="x")), None, scenario_result).summary == \
        "vLLM's scheduler never finished a request: x"
    refused = sched_verdict(as_scenario_event({"status": "unsupported", "reason": "no pause state"}))
    assert (refused.outcome, refused.summary) == (Outcome.UNSUPPORTED, "no pause state")
