"""The engine-tier reset and abort scenarios (reset-inflight, manual-reset, manual-reset-reload, abort-some) without
vLLM.

Three layers: the catalogue and the harness's mapping of a cell to its ``repro.scenarios`` name and parameters
(which the engine side must accept); each scenario's plan; the oracle's rule for in-flight operations on
synthetic records; and each scenario played by the real driver against a fake AsyncLLM that can re-create
the faults the scenarios hunt (a reset that discards a frame that is not in flight, or keeps one that is; an
abort that shifts the survivors), so LOSS, DUPLICATE, TRUNCATED and OK come out of the real code paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fake_engine import SP, Completion, Output

import repro.scenarios.runs as runs
import repro.scenarios.vocab as base
from harness.core.cell import Cell, parse_cell_id
from harness.core.oracle import Outcome, cell_verdict, classify_request
from harness.core.recorded_streams import StreamRecord, stream_records
from harness.core.scenarios import BY_SCENARIO
from harness.plan.matrix import Selection, plan_matrix
from harness.run.spec import RunConfig, scenario_entry
from harness.verdicts.known_bugs import expectation, load_known_bugs
from repro.models.deterministic import BigramCycleSpec, cycle_permutation, expected_continuation
from repro.scenarios import RUNNERS, SCENARIOS, abort_some, manual_reset, pauses, reset_inflight
from repro.scenarios.cell_run import run_scenario
from repro.scenarios.vocab import EngineContext, InflightSpec, ScenarioUnsupported

pytestmark = pytest.mark.unit
typed = StreamRecord.from_json  # the oracle judges typed request records

VOCAB = 512
FAMILY = ("reset-inflight", "manual-reset", "manual-reset-reload", "abort-some")


def _cfg(tmp_path: Path, **kw: Any) -> RunConfig:
    # The scenario parameters every matrix run passes (harness.frontends.commands.invocation.run_config).
    return RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "m",
                     scenario_params={"num_requests": 8, "max_tokens": 48, "pause_after": 8}, **kw)


# --------------------------------------------------------------------------- catalogue and mapping


def test_catalogue_shapes_and_ids() -> None:
    assert not BY_SCENARIO["reset-inflight"].pauses and not BY_SCENARIO["abort-some"].pauses
    for name in ("manual-reset", "manual-reset-reload"):
        assert (BY_SCENARIO[name].modes, BY_SCENARIO[name].clear_caches) == (("keep",), (False,))
    assert all(BY_SCENARIO[n].profile == "default" for n in FAMILY)  # they share the pause cells' engine
    cells = Selection(versions=("0.21.0",), executors=("mp",), asyncs=(True,), scenarios=FAMILY).cells()
    ids = [c.id for c in cells]
    assert sorted(ids) == sorted([
        "vllm0.21.0-mp-async_on-reset_inflight", "vllm0.21.0-mp-async_on-abort_some",
        "vllm0.21.0-mp-async_on-keep-noclear-manual_reset", "vllm0.21.0-mp-async_on-keep-noclear-manual_reset_reload",
    ])
    assert all(parse_cell_id(c.id) == c for c in cells)


def test_family_runs_on_the_engine_of_the_pause_cells() -> None:
    sel = Selection(versions=("0.21.0", "0.32.0"), executors=("mp",), scenarios=("pause", *FAMILY))
    plan = plan_matrix(sel, "cpu")
    assert not plan.unsupported
    assert len(plan.engines) == 4  # two versions x async on/off, as the pause cells alone need


def test_cells_map_to_engine_scenarios_whose_plans_build(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    want = {
        "reset-inflight": ("reset_inflight", {"num_requests": 8, "max_tokens": 48, "pause_after": 8}),
        "abort-some": ("abort_some", {"num_requests": 8, "max_tokens": 48, "pause_after": 8}),
        "manual-reset": ("manual_reset", {"num_requests": 8, "max_tokens": 48, "pause_after": 8,
                                          "clear_cache": False}),
        "manual-reset-reload": ("weight_sync", {"num_requests": 8, "max_tokens": 48, "pause_after": 8,
                                                "clear_cache": False, "mode": "keep", "weight_transfer": "reload",
                                                "explicit_reset": True}),
    }
    for name, (engine_name, params) in want.items():
        shape = BY_SCENARIO[name]
        cell = Cell("0.21.0", "mp", True, "keep", not shape.pauses, scenario=name)
        entry = scenario_entry(cell, cfg)
        assert (entry["scenario"], entry["params"]) == (engine_name, params), name
        # The engine side accepts exactly these parameters.
        assert SCENARIOS[engine_name](entry["id"], entry["params"], VOCAB, entry["seed"]).requests
    assert pauses("reset_inflight", {}, VOCAB) is False and pauses("abort_some", {}, VOCAB) is False
    assert all(pauses(n, {}, VOCAB) for n in ("keep", "manual_reset", "weight_sync"))


def test_the_42043_keep_rule_does_not_cover_the_non_pausing_cells() -> None:
    bugs = load_known_bugs()
    for name in ("reset-inflight", "abort-some"):
        # Non-pausing cells carry the default mode (keep) and clear_cache (true) without playing them.
        assert expectation(Cell("0.21.0", "mp", True, scenario=name), bugs).outcome is Outcome.OK
    assert expectation(Cell("0.21.0", "mp", True, "keep", True), bugs).label == "LOSS(1)"
    assert expectation(Cell("0.21.0", "mp", True, "keep", True, scenario="weight-sync"), bugs).label == "LOSS(1)"
    # The manual reset: bisected window 0.17.0..0.21.0, async on only.
    for name in ("manual-reset", "manual-reset-reload"):
        got = {(v, a): expectation(Cell(v, "mp", a, "keep", False, scenario=name), bugs).label
               for v in ("0.16.0", "0.17.0", "0.21.0", "0.22.0") for a in (True, False)}
        assert {k for k, label in got.items() if label != "OK"} == {("0.17.0", True), ("0.21.0", True)}
        assert got[("0.21.0", True)] == "LOSS(1)"


# --------------------------------------------------------------------------- plans


def test_reset_inflight_plan() -> None:
    plan = reset_inflight.build("ri", {"pause_after": 8, "max_tokens": 48}, VOCAB, 3)
    assert plan.pauses == []
    assert [(op.op, op.after_tokens) for op in plan.inflight] == [("reset", 8), ("reset", 28)]
    assert len(plan.requests) == 9 and all(r.submit == "start" for r in plan.requests)
    assert len(plan.requests[-1].prompt) == 64 and plan.requests[-1].rid == "ri-long"
    custom = reset_inflight.build("ri", {"pause_after": 4, "reset_at": [12, 4, 30], "long_prompt_len": 0}, VOCAB, 3)
    assert [op.after_tokens for op in custom.inflight] == [4, 12, 30] and len(custom.requests) == 8
    with pytest.raises(ValueError, match=r"reset points \[8, 48\] must lie in \[1, max_tokens=48\)"):
        reset_inflight.build("ri", {"reset_at": [48]}, VOCAB, 3)
    with pytest.raises(ValueError, match="exceeds the engine's max_model_len=256"):
        reset_inflight.build("ri", {"long_prompt_len": 201}, VOCAB, 3)
    with pytest.raises(ValueError, match=r"unknown reset_inflight parameters \['clear_cache'\]"):
        reset_inflight.build("ri", {"clear_cache": True}, VOCAB, 3)


def test_abort_some_plan() -> None:
    plan = abort_some.build("as", {"num_requests": 6, "extra_requests": 2}, VOCAB, 3)
    (op,) = plan.inflight
    assert (op.op, op.after_tokens, op.targets) == ("abort", 8, ("as-r01", "as-r03", "as-r05"))
    assert [r.submit for r in plan.requests] == ["start"] * 6 + [("after_op", 0)] * 2
    with pytest.raises(ValueError, match="needs one request to abort and one to keep"):
        abort_some.build("as", {"num_requests": 1}, VOCAB, 3)
    with pytest.raises(ValueError, match=r"pause_after=48 must lie in \[1, max_tokens=48\)"):
        abort_some.build("as", {"pause_after": 48}, VOCAB, 3)


def test_manual_reset_plan_and_runner() -> None:
    assert RUNNERS["manual_reset"] is manual_reset.run
    (pause,) = manual_reset.build("mr", {"clear_cache": False}, VOCAB, 3).pauses
    assert (pause.mode, pause.clear_cache, pause.after_tokens, pause.action) == ("keep", False, 8, None)
    with pytest.raises(ValueError, match="clear_cache=False"):
        manual_reset.build("mr", {"clear_cache": True}, VOCAB, 3)


def test_inflight_spec_validates() -> None:
    with pytest.raises(ValueError, match="unknown in-flight operation 'sleep'"):
        InflightSpec("sleep", 3)
    with pytest.raises(ValueError, match="an abort names the requests it aborts"):
        InflightSpec("abort", 3)
    with pytest.raises(ValueError, match="a reset names none"):
        InflightSpec("reset", 3, ("r0",))


# --------------------------------------------------------------------------- the oracle's in-flight rule


def _rec(observed: list[int], ref: list[int], interrupts: list[dict[str, Any]] | None,
         finish: str = "length", max_tokens: int = 20) -> dict[str, Any]:
    rec = {"rid": "r", "submit": "start", "prompt": [1], "max_tokens": max_tokens, "observed": observed,
           "reference": ref, "reference_matches_model": True, "finish_reason": finish, "error": None, "pauses": []}
    if interrupts is not None:
        rec["interrupts"] = interrupts
    return rec


def _op(op: str, at: int, target: bool = True) -> dict[str, Any]:
    return {"k": 0, "op": op, "target": target, "client_tokens": at, "client_tokens_after": at + 1,
            "engine_tokens": at + 1, "engine_status": "RUNNING", "engine_preemptions": 1}


REF = list(range(100, 128))


def test_a_request_reset_in_flight_must_equal_its_reference() -> None:
    ok = classify_request(typed(_rec(REF[:20], REF, [_op("reset", 8)])))
    assert ok.outcome is Outcome.OK and ok.running_at_pause and ok.pause_index == 8
    lost = classify_request(typed(_rec(REF[:9] + REF[10:21], REF, [_op("reset", 8)])))
    assert lost.verdict.label == "LOSS(1 at 9)" and lost.running_at_pause
    dup = classify_request(typed(_rec(REF[:9] + REF[8:19], REF, [_op("reset", 8)])))
    assert dup.verdict.label == "DUPLICATE(1 at 9)"
    short = classify_request(typed(_rec(REF[:12], REF, [_op("reset", 8)], finish="abort")))
    assert short.outcome is Outcome.TRUNCATED, "a reset is no abort: a short stream is a fault"


def test_aborted_requests_may_end_early_and_the_others_may_not() -> None:
    aborted = classify_request(typed(_rec(REF[:9], REF, [_op("abort", 8)], finish="abort")))
    assert aborted.outcome is Outcome.OK and aborted.running_at_pause
    not_told = classify_request(typed(_rec(REF[:9], REF, [_op("abort", 8)], finish="length")))
    assert not_told.outcome is Outcome.TRUNCATED and "not 'abort'" in not_told.verdict.detail
    wrong = classify_request(typed(_rec([*REF[:8], 999], REF, [_op("abort", 8)], finish="abort")))
    assert wrong.outcome is Outcome.DIVERGED
    survivor = classify_request(typed(_rec(REF[:9], REF, [_op("abort", 8, target=False)], finish="abort")))
    assert survivor.outcome is Outcome.TRUNCATED, "a survivor must run to max_tokens"
    newcomer = classify_request(typed(_rec(REF[:20], REF, [])))
    assert newcomer.outcome is Outcome.OK and not newcomer.running_at_pause
    # Records without the key (every pause scenario) judge as before.
    assert classify_request(typed(_rec(REF[:20], REF, None))).running_at_pause is False


# --------------------------------------------------------------------------- played on a fake engine


# The sampling parameters and outputs an AsyncLLM takes and yields, shared with the profile tests.
_SP, _Completion, _Output = SP, Completion, Output


class FakeLLM:
    """Greedy decoding over a permutation, with keep pauses, running-request resets and aborts.

    ``reset_bug``: what a reset does to each running request besides preempting it: ``drop`` (discard a frame
    that is not in flight: its next token never arrives, vLLM #42043's shape) or ``repeat`` (keep a stale frame:
    its last token arrives twice).  ``abort_bug``: an abort makes every survivor lose its next token.
    """

    def __init__(self, perm: list[int], reset_bug: str | None = None, abort_bug: bool = False) -> None:
        self.perm, self.reset_bug, self.abort_bug = perm, reset_bug, abort_bug
        self.running = asyncio.Event()
        self.running.set()
        self.reqs: dict[str, dict[str, Any]] = {}
        self.engine_core = self
        self.calls: list[str] = []

    async def generate(self, prompt: dict[str, list[int]], sp: _SP, request_id: str) -> AsyncIterator[_Output]:
        st = {"n": 0, "last": prompt["prompt_token_ids"][-1], "status": "RUNNING", "pre": 0, "fault": None,
              "aborted": False}
        self.reqs[request_id + "-0badcafe"] = st
        try:
            while st["n"] < sp.max_tokens:
                await self.running.wait()
                if st["aborted"]:
                    yield _Output([_Completion([], "abort")])
                    return
                fault, st["fault"] = st["fault"], None
                if fault == "repeat":
                    yield _Output([_Completion([st["last"]], None)])
                    continue
                tok = self.perm[st["last"]]
                st["last"], st["n"], st["status"] = tok, st["n"] + 1, "RUNNING"
                if fault != "drop":
                    yield _Output([_Completion([tok], "length" if st["n"] >= sp.max_tokens else None)])
                await asyncio.sleep(0)
        finally:
            del self.reqs[request_id + "-0badcafe"]

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        assert mode == "keep" and not clear_cache
        self.calls.append("pause")
        self.running.clear()

    async def resume_generation(self) -> None:
        self.calls.append("resume")
        self.running.set()

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        assert reset_running_requests
        self.calls.append("reset")
        for st in self.reqs.values():
            st["pre"] += 1
            st["status"] = "PREEMPTED"
            st["fault"] = self.reset_bug
        return True

    async def abort(self, request_ids: list[str]) -> None:
        self.calls.append("abort")
        for rid, st in self.reqs.items():
            if rid.rsplit("-", 1)[0] in request_ids:
                st["aborted"] = True
            elif self.abort_bug:
                st["fault"] = "drop"

    async def call_utility_async(self, name: str) -> dict[str, Any]:
        assert name == "repro_request_progress"
        return {rid: {"num_output_tokens": st["n"], "status": st["status"], "num_preemptions": st["pre"]}
                for rid, st in self.reqs.items()}


class OldLLM(FakeLLM):
    """A vLLM whose reset cannot preempt running requests."""

    async def reset_prefix_cache(self) -> bool:  # type: ignore[override]
        return False


PERM = cycle_permutation(VOCAB, BigramCycleSpec().seed)


def _play(llm: FakeLLM, scenario: str, params: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
          bigram: bool = True) -> dict[str, Any]:
    """``bigram=False``: the engine's model is another one (``--model``): its stream is not known in advance."""
    monkeypatch.setattr(runs, "_vllm_api", lambda: (_SP, "DELTA"))
    ctx = EngineContext(model_spec=BigramCycleSpec(), model_dir=Path("/nonexistent"), perm=PERM if bigram else None,
                        model_cache=Path("/nonexistent"), work_dir=Path("/nonexistent"), tensor_parallel_size=1,
                        start_engine=lambda d: pytest.fail("no engine start expected"),
                        model_kind="bigram-cycle" if bigram else "qwen3-random", vocab_size=VOCAB)
    sc = {"id": scenario, "scenario": scenario, "params": {"max_tokens": 24, **params}, "seed": 11}
    return asyncio.run(run_scenario(llm, sc, ctx, 30))


@pytest.mark.parametrize(("bug", "label"), [(None, "OK"), ("drop", "LOSS(1)"), ("repeat", "DUPLICATE(1)")])
def test_reset_inflight_on_a_fake_engine(bug: str | None, label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = FakeLLM(PERM, reset_bug=bug)
    out = _play(llm, "reset_inflight", {"pause_after": 4, "reset_at": [], "long_prompt_len": 16}, monkeypatch)
    assert llm.calls == ["reset"], "no pause: the engine only resets"
    verdict = cell_verdict(stream_records(out["records"]))
    assert verdict.label == label, verdict.summary
    for rec, rv in zip(out["records"], verdict.requests, strict=True):
        assert rec["reference"][:24] == expected_continuation(PERM, rec["prompt"][-1], 24)
        (op,) = rec["interrupts"]
        assert (op["op"], op["target"], op["engine_preemptions"]) == ("reset", True, 1)
        assert op["client_tokens"] >= 4 and rv.running_at_pause and rv.pause_index == op["client_tokens"]
        if bug:  # the fault lies after the tokens the client held when it called the reset
            assert rv.verdict.at is not None and rv.verdict.at >= op["client_tokens"]
    assert [e["event"] for e in out["events"]] == ["reset", "reset_done"]


@pytest.mark.parametrize("bug", [None, "drop", "repeat"])
def test_two_resets_in_flight(bug: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = FakeLLM(PERM, reset_bug=bug)
    out = _play(llm, "reset_inflight", {"pause_after": 4, "reset_at": [12], "long_prompt_len": 16}, monkeypatch)
    assert llm.calls == ["reset", "reset"]
    verdict = cell_verdict(stream_records(out["records"]))
    # Two faults per stream: a token fault whatever label the oracle gives a stream with two of them.
    assert verdict.outcome.is_token_fault if bug else verdict.outcome is Outcome.OK, verdict.summary
    for rec in out["records"]:
        ops = rec["interrupts"]
        assert [i["k"] for i in ops] == [0, 1] and ops[1]["client_tokens"] >= 12 and ops[1]["engine_preemptions"] == 2
    assert [e["event"] for e in out["events"]] == ["reset", "reset_done", "reset", "reset_done"]


@pytest.mark.parametrize(("bug", "label"), [(None, "OK"), ("drop", "LOSS(1)")])
def test_manual_reset_on_a_fake_engine(bug: str | None, label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = FakeLLM(PERM, reset_bug=bug)
    out = _play(llm, "manual_reset", {"clear_cache": False}, monkeypatch)
    assert llm.calls == ["pause", "reset", "resume"]
    verdict = cell_verdict(stream_records(out["records"]))
    assert verdict.label == label, verdict.summary
    if bug:
        assert verdict.summary == "LOSS(1) in 8/10 requests (8/8 running at pause)"
        for rv in verdict.requests:
            fpr = rv.first_post_resume
            assert fpr is not None
            if rv.running_at_pause:  # the frozen requests lose exactly the first post-resume token
                assert rv.verdict.label == f"LOSS(1 at {fpr['index']})"
    (action,) = [e for e in out["events"] if e["event"] == "pause_action"]
    assert action["explicit_reset"] is True and action["reset_ok"] is True
    assert {v["status"] for v in action["before_reset"].values()} == {"RUNNING"}
    assert {v["status"] for v in action["after_reset"].values()} == {"PREEMPTED"}


@pytest.mark.parametrize(("abort_bug", "label"), [(False, "OK"), (True, "LOSS(1)")])
def test_abort_some_on_a_fake_engine(abort_bug: bool, label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = FakeLLM(PERM, abort_bug=abort_bug)
    out = _play(llm, "abort_some", {}, monkeypatch)
    assert llm.calls == ["abort"]
    verdict = cell_verdict(stream_records(out["records"]))
    assert verdict.label == label, verdict.summary
    by_rid = {r["rid"]: r for r in out["records"]}
    aborted = {f"abort_some-r{i:02d}" for i in (1, 3, 5, 7)}
    for rid, rec in by_rid.items():
        if rid in aborted:
            assert rec["finish_reason"] == "abort" and 8 <= len(rec["observed"]) < 24
            assert rec["interrupts"][0]["target"] is True
        elif rid.startswith("abort_some-x"):
            assert rec["submit"] == ["after_op", 0] and rec["interrupts"] == []
            assert rec["observed"] == rec["reference"][:24]
        else:
            assert rec["interrupts"][0]["target"] is False
            assert len(rec["observed"]) == 24 - abort_bug


def test_no_running_request_reset_is_unsupported_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    for scenario in ("reset_inflight", "manual_reset"):
        llm = OldLLM(PERM)
        with pytest.raises(ScenarioUnsupported, match=r"reset_prefix_cache\(\) takes no reset_running_requests="):
            _play(llm, scenario, {"clear_cache": False} if scenario == "manual_reset" else {}, monkeypatch)
        assert llm.calls == [] and llm.reqs == {}


def test_reports_show_no_mode_for_a_scenario_that_does_not_pause() -> None:
    from harness.verdicts.report.markdown import markdown
    from harness.verdicts.results import Results, judged_result

    recs = stream_records([{**_rec(REF[:20], REF, [_op("reset", 8)]), "rid": "reset_inflight-r00"}])
    cells = tuple(judged_result(Cell("0.21.0", "mp", True, scenario=name), cell_verdict(recs), recs, None, 1.0)
                  for name in ("reset-inflight", "pause"))
    text = markdown(Results(cells, {"platform": "cpu"}))
    assert "| `vllm0.21.0-mp-async_on-reset_inflight` | 0.21.0 | mp | on | - | - | OK |" in text
    assert "| `vllm0.21.0-mp-async_on-keep-clear` | 0.21.0 | mp | on | keep | true | OK |" in text


@pytest.mark.parametrize(("scenario", "params", "bug", "label"), [
    ("abort_some", {}, {"abort_bug": True}, "LOSS(1)"), ("abort_some", {}, {}, "OK"),
    ("reset_inflight", {"pause_after": 4, "reset_at": [], "long_prompt_len": 16}, {"reset_bug": "drop"}, "LOSS(1)"),
])
def test_another_model_gets_a_second_reference_batched_as_the_run(scenario: str, params: dict[str, Any],
                                                                  bug: dict[str, Any], label: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the bigram cycle to check it against, the reference is run twice, the second time with the requests
    submitted after an in-flight operation joining at its trigger; this engine's numerics do not depend on the
    batch, so the two agree and the verdict is the bigram model's."""
    out = _play(FakeLLM(PERM, **bug), scenario, params, monkeypatch, bigram=False)
    for rec in out["records"]:
        assert "reference_matches_model" not in rec
        assert rec["reference_repeat"] == rec["reference"] and len(rec["reference"]) == 24 + base.REFERENCE_MARGIN
    verdict = cell_verdict(stream_records(out["records"]))
    assert verdict.label == label and not any(r.reference_split is not None for r in verdict.requests)
