"""The ``inflight-add-abort`` scenario (repro/sched/inflight.py, harness/sched/inflight.py) against toy schedulers:
its script, its precondition, and an oracle that fails on a token after an abort and on a request or block left
behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from toy_sched import ToyAdapter, ToyScheduler

from harness.core.cell import Cell
from harness.core.events import as_scenario_event
from harness.core.oracle import Outcome
from harness.core.records import CellResult, EngineInfo
from harness.run.scenario_results import scenario_result
from harness.sched.inflight import leaks
from harness.sched.tier import sched_result, sched_scenario
from repro.models.deterministic import cycle_permutation
from repro.sched.inflight import precondition
from repro.sched.scenario import run_scenario
from repro.sched.upstream import build_any_script

pytestmark = pytest.mark.unit

VOCAB = 64
PERM = cycle_permutation(VOCAB, 0)
CELL = Cell("0.34.0", "mp", True, scenario="inflight-add-abort", tier="scheduler")
ASYNC_CLS = "vllm.v1.core.sched.async_scheduler.AsyncScheduler"


class FreeingScheduler(ToyScheduler):
    """The toy with vLLM's bookkeeping of finished requests: a finished request leaves ``requests`` (vLLM's
    ``_free_blocks``); a request added in the middle waits for the next schedule()."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted: set[str] = set()

    def update_from_output(self, so: Any, out: dict[str, list[int]]) -> dict[int, Any]:
        result = super().update_from_output(so, {r: t for r, t in out.items() if r in self.requests})
        self._sweep()
        return result

    def finish_requests(self, rids: Any, status: Any) -> None:
        super().finish_requests(rids, status)
        self.aborted = self.aborted | set([rids] if isinstance(rids, str) else rids or ())
        self._sweep()

    def _sweep(self) -> None:
        for rid in [r for r, req in self.requests.items() if req.finished]:
            del self.requests[rid]


class LateScheduler(FreeingScheduler):
    """Delivers one frame's token to a request aborted while that frame was in flight (a bug)."""

    def update_from_output(self, so: Any, out: dict[str, list[int]]) -> dict[int, Any]:
        result = super().update_from_output(so, out)
        late = [SimpleOut(r, toks) for r, toks in out.items() if r not in self.requests and toks and r == "r0"]
        if late:
            result.setdefault(0, type("O", (), {"outputs": []})()).outputs.extend(late)
        return result


class SimpleOut:
    def __init__(self, rid: str, toks: list[int]) -> None:
        self.request_id, self.new_token_ids, self.finish_reason = rid, toks, None


class LeakyScheduler(FreeingScheduler):
    """Keeps every aborted request in its table forever (a leak)."""

    def _sweep(self) -> None:
        for rid in [r for r, req in self.requests.items() if req.finished and r not in self.aborted]:
            del self.requests[rid]


def _event(sched: ToyScheduler, async_on: bool = True) -> dict[str, Any]:
    sc = sched_scenario(CELL.replace(async_on=async_on), "inflight", 0)
    if not async_on:
        sched.async_ = False
    ev = run_scenario(ToyAdapter(sched), sc, Path("."), PERM)
    assert ev["status"] == "ran", ev.get("reason")
    return {"event": "scenario", "id": "inflight", **ev, "scheduler_class": ASYNC_CLS if async_on else
            "vllm.v1.core.sched.scheduler.Scheduler"}


def _judge(ev: dict[str, Any], async_on: bool = True) -> CellResult:
    return sched_result(CELL.replace(async_on=async_on), as_scenario_event(ev), EngineInfo({"tier": "scheduler"}),
                        scenario_result)


def test_the_script_adds_and_aborts_at_two_points_with_the_queue_full() -> None:
    script = build_any_script("inflight_add_abort", {}, VOCAB, 0)
    ops = [(op.op, op.rid or ",".join(op.rids or ())) for op in script.ops]
    fill = ops.index(("fill", ""))
    assert ops[fill + 1:fill + 8] == [("abort_many", "r0"), ("add", "n0"), ("add", "n1"), ("add", "x0"),
                                      ("abort_many", "x0"), ("abort_many", "r1"), ("add", "r1b")]
    assert ops[fill + 8:] == [("pop", ""), ("fill", ""), ("abort_many", "n1"), ("add", "n2"), ("run", "")]
    specs = {r.rid: r for r in script.requests}
    assert specs["r1b"].prompt == specs["r1"].prompt and len({r.prompt for r in script.requests}) == 8


@pytest.mark.parametrize("async_on", [True, False])
def test_a_faithful_scheduler_is_ok_with_the_precondition_met(async_on: bool) -> None:
    ev = _event(FreeingScheduler(), async_on)
    pre = ev["precondition"]
    assert pre["met"], pre
    assert pre["evidence"]["aborted_in_a_frame_in_flight"] == ["r0", "r1", "n1"]
    assert pre["evidence"]["aborted_never_scheduled"] == ["x0"] and pre["evidence"]["adds_in_flight"] == 5
    assert ev["end_state"]["requests"] == [] and leaks(ev["end_state"]) == []
    res = _judge(ev, async_on)
    assert res.outcome is Outcome.OK and res.summary.endswith("; nothing held at the end"), res.summary
    assert "with 2 frame(s) in flight" in res.summary if async_on else "with 1 frame(s)" in res.summary
    by_rid = {r["rid"]: r for r in ev["records"]}
    assert by_rid["r1b"]["observed"] == by_rid["r1"]["reference"][:12]  # the retry is r1's solo stream
    assert by_rid["x0"]["observed"] == [] and by_rid["n1"]["observed"] == []


def test_a_token_after_an_abort_is_diverged_though_the_stream_is_a_prefix() -> None:
    res = _judge(_event(LateScheduler()))
    # one token per frame r0 was in when it was aborted
    assert res.outcome is Outcome.DIVERGED and "r0: 2 token(s)" in res.summary and "after its abort" in res.summary


def test_a_request_left_in_the_scheduler_is_a_stall() -> None:
    res = _judge(_event(LeakyScheduler()))
    assert res.outcome is Outcome.STALL and "still holds requests ['n1', 'r0', 'r1', 'x0']" in res.summary


def test_kv_blocks_never_freed_and_a_missing_end_state_are_named() -> None:
    end = {"requests": [], "waiting": 0, "running": 0, "free_blocks": 250, "usable_blocks": 255}
    assert leaks(end) == ["5 of 255 KV-cache blocks never freed"]
    assert leaks(None) == ["no end_state recorded: the scheduler's final state is unknown"]


def test_an_add_without_frames_in_flight_fails_the_precondition_and_leaves_the_cell_unjudged() -> None:
    ev = _event(FreeingScheduler())
    log = [dict(e, in_flight_before=0) if e["op"] == {"op": "add", "rid": "n2"} else e for e in ev["ops_log"]]
    pre = precondition(log, ev["records"], 2)
    assert not pre["met"] and "add n2 ran with 0 frame(s) in flight, not 2" in pre["what"]
    res = _judge({**ev, "precondition": pre})
    assert res.outcome is Outcome.UNSUPPORTED and "precondition not met" in res.summary


def test_x0_scheduled_before_its_abort_fails_the_precondition() -> None:
    ev = _event(FreeingScheduler())
    records = [dict(r, frames=[{"frame": 99, "positions": [], "delivered": []}]) if r["rid"] == "x0" else r
               for r in ev["records"]]
    assert "x0 was scheduled before its abort" in precondition(ev["ops_log"], records, 2)["what"]

