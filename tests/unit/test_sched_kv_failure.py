"""The ``kv-load-recompute`` scenario (repro/sched/kv_failure.py; vllm#45138, vllm#49250 part 2): its script, the
worker side of the failing connector (``fail_loads``), its precondition, and the verdicts a stream of the recompute
gets (a lost first token is LOSS; an unmet precondition leaves the cell unjudged)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.core.events import as_scenario_event
from harness.core.oracle import Outcome
from harness.core.records import CellResult, EngineInfo
from harness.run.scenario_results import scenario_result
from harness.sched.tier import SHAPES, sched_result
from repro.sched.kv_failure import fail_loads, scenario_facts
from repro.sched.script import ScriptError, reference_stream
from repro.sched.upstream import build_any_script

pytestmark = pytest.mark.unit

VOCAB = 64
CELL = Cell("0.34.0", "mp", True, scenario="kv-load-recompute", tier="scheduler")
ASYNC_CLS = "vllm.v1.core.sched.async_scheduler.AsyncScheduler"


def _sched(promised: dict[str, int], recompute: bool = True) -> Any:
    conn = SimpleNamespace(promised=dict(promised), block_size=16, failed=[])
    blocks = {"f0": [7, 8, 9], "r0": [3, 4, 5]}
    kv = SimpleNamespace(get_block_ids=lambda rid: (blocks[rid],))
    return SimpleNamespace(connector=conn, kv_cache_manager=kv, recompute_kv_load_failures=recompute)


def test_the_script_names_the_failing_request_and_needs_the_failing_connector() -> None:
    script = build_any_script("kv_load_recompute", {}, VOCAB, 0)
    assert [r.rid for r in script.requests] == ["f0", "r0"]
    assert script.setup.kv_consumer and script.setup.kv_load_failure and script.setup.depth == 2
    with pytest.raises(ScriptError, match="kv_load_failure needs kv_consumer"):
        build_any_script("kv_load_recompute", {"kv_consumer": False}, VOCAB, 0)
    assert SHAPES["kv-load-recompute"].for_async(False) == {"scheduler": "sync", "depth": 1}


def test_fail_loads_reports_the_promised_blocks_once_in_the_frame_that_schedules_the_request() -> None:
    sched = _sched({"f0": 32})
    out = SimpleNamespace(kv_connector_output=SimpleNamespace(invalid_block_ids=set()))
    fail_loads(sched, ["r0"], out, 0)
    assert out.kv_connector_output.invalid_block_ids == set() and sched.connector.failed == []
    fail_loads(sched, ["r0", "f0"], out, 3)
    assert out.kv_connector_output.invalid_block_ids == {7, 8}
    assert sched.connector.failed == [{"rid": "f0", "frame": 3, "blocks": [7, 8]}] and not sched.connector.promised
    later = SimpleNamespace(kv_connector_output=SimpleNamespace(invalid_block_ids=set()))
    fail_loads(sched, ["f0"], later, 4)
    assert later.kv_connector_output.invalid_block_ids == set()


def test_the_precondition_needs_a_reported_failure_and_the_recompute_policy() -> None:
    sched = _sched({"f0": 32})
    assert not scenario_facts(sched)["precondition"]["met"]
    fail_loads(sched, ["f0"], SimpleNamespace(kv_connector_output=SimpleNamespace(invalid_block_ids=set())), 0)
    pre = scenario_facts(sched)["precondition"]
    assert pre["met"] and "f0 (2 block(s)) reported failed in frame(s) [0]" in pre["what"]
    sched.recompute_kv_load_failures = False
    assert "does not recompute" in scenario_facts(sched)["precondition"]["what"]


def _event(f0_observed: list[int], met: bool = True) -> dict[str, Any]:
    prompt = list(range(2, 42))
    ref = reference_stream([*range(1, VOCAB), 0], prompt, 7)
    rec = {"rid": "f0", "submit": "start", "prompt": prompt, "max_tokens": 6, "reference": ref,
           "observed": f0_observed, "finish_reason": "length", "error": None, "pauses": [],
           "reference_matches_model": True, "frames": []}
    return {"event": "scenario", "id": "kv", "status": "ran", "records": [rec], "scheduler_class": ASYNC_CLS,
            "ops_log": [], "stalled": None, "frames": 9,
            "precondition": {"met": met, "what": "the load of f0 reported failed" if met else
                             "precondition not met: no load was promised and failed", "evidence": {}}}


def _judge(ev: dict[str, Any]) -> CellResult:
    return sched_result(CELL, as_scenario_event(ev), EngineInfo({"tier": "scheduler"}), scenario_result)


def test_a_recompute_that_samples_past_the_prompt_loses_the_first_token() -> None:
    ref = _event([])["records"][0]["reference"]
    assert _judge(_event(ref[:6])).outcome is Outcome.OK
    # 0.34.0's async cell: the recompute scheduled num_tokens + the stale placeholder, sampling index 1 first
    lost = _judge(_event(ref[1:7]))
    assert lost.outcome is Outcome.LOSS, lost.summary
    assert _judge(_event(ref[:6], met=False)).outcome is Outcome.UNSUPPORTED


def test_the_known_bug_row_expects_the_loss_in_f0_only() -> None:
    from harness.verdicts.known_bugs import check, load_known_bugs

    bugs = load_known_bugs()
    ref = _event([])["records"][0]["reference"]
    assert check(_judge(_event(ref[1:7])), bugs).status == "as expected"
    assert check(_judge(_event(ref[:6])), bugs).status == "UNEXPECTED"  # the row says the token is lost
    ev = _event(ref[1:7])
    ev["records"][0]["rid"] = "r0"  # the same loss in a request whose load never failed
    res = check(_judge(ev), bugs)
    assert res.status == "UNEXPECTED" and "r0: expected OK" in res.message
