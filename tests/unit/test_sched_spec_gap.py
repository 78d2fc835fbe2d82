"""The ``spec_gap`` probe scenario (repro/sched/spec_gap.py; vllm#37159): its script, the schedule recorder, and
the rule that finds a ``-1`` draft sent for a request that was not in the previous batch (a planted one is found,
a continuing request's is not)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from repro.sched.spec_gap import record_spec, scenario_facts, stale_drafts
from repro.sched.upstream import build_any_script

pytestmark = pytest.mark.unit


def _step(req_ids: list[str], spec: dict[str, list[int]], restarted: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"req_ids": sorted(req_ids), "restarted": sorted(restarted), "spec": spec}


def test_the_script_runs_three_requests_with_two_drafts_in_a_tight_budget() -> None:
    script = build_any_script("spec_gap", {}, 64, 0)
    assert (script.setup.spec_tokens, script.setup.spec_accepted, script.setup.max_num_batched_tokens) == (2, 0, 7)
    assert [r.rid for r in script.requests] == ["r0", "r1", "r2"] and script.setup.is_async


def test_a_minus_one_draft_after_a_gap_is_stale_and_a_continuing_one_is_not() -> None:
    log = [_step(["r0", "r1", "r2"], {}, ("r0", "r1", "r2")),
           _step(["r0", "r1", "r2"], {"r0": [-1, -1], "r1": [-1, -1]}),  # continuing: the worker fills them
           _step(["r0", "r1"], {"r0": [-1, -1], "r1": [-1, -1]}),  # r2 sits out a step
           _step(["r0", "r2"], {"r0": [-1, -1], "r2": [-1, -1]})]  # planted: r2's drafts survived the gap
    assert stale_drafts(log) == [{"step": 3, "rid": "r2", "drafts": [-1, -1], "restarted": False}]
    facts = scenario_facts(log)
    assert facts["precondition"]["met"] and facts["precondition"]["evidence"]["gaps"] == [{"step": 3, "rid": "r2"}]
    assert facts["spec_steps"]["stale"][0]["rid"] == "r2"
    clean = [*log[:3], _step(["r0", "r2"], {"r0": [-1, -1], "r2": [5, 6]})]
    assert stale_drafts(clean) == [] and scenario_facts(clean)["precondition"]["met"]
    assert not scenario_facts(log[:2])["precondition"]["met"]


def test_record_spec_wraps_schedule_and_records_only_steps_that_ran() -> None:
    outs = iter([SimpleNamespace(total_num_scheduled_tokens=0, num_scheduled_tokens={}),
                 SimpleNamespace(total_num_scheduled_tokens=3, num_scheduled_tokens={"r0": 3},
                                 scheduled_spec_decode_tokens={"r0": [-1, -1]},
                                 scheduled_new_reqs=[SimpleNamespace(req_id="r0")], scheduled_cached_reqs=None)])
    sched = SimpleNamespace(schedule=lambda: next(outs))
    log = record_spec(sched)
    sched.schedule()
    sched.schedule()
    assert log == [{"req_ids": ["r0"], "restarted": ["r0"], "spec": {"r0": [-1, -1]}}]
