"""The weight-sync scenario (repro.scenarios.rlhf_weight_sync) without vLLM.

Two layers: the pure reference computation (A's cycle before the swap, B's
after) judged by the unchanged oracle, and the whole scenario driven against
a fake AsyncLLM whose "weights" are the permutation of the checkpoint it last
loaded.  The fake can re-create vLLM #42043 (drop the first token after a
keep + clear_cache resume), deliver a frame computed before the swap after it (vLLM
0.16.0's keep pause) or load the wrong weights, so the tests see LOSS(1), DIVERGED,
OK, and the cross-check/restore errors come out of the real code paths.
"""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fake_engine import SP, Completion, Output
from hypothesis import given
from hypothesis import strategies as st

import repro.scenarios.runs as runs
from harness.core.cell import Cell
from harness.core.oracle import Outcome, cell_verdict, classify_request
from harness.core.recorded_streams import StreamRecord, stream_records
from harness.verdicts.known_bugs import check, load_known_bugs
from harness.verdicts.results import judged_result
from repro.models.deterministic import (
    BigramCycleSpec,
    build_checkpoint,
    cycle_permutation,
    expected_continuation,
    load_perm,
    swap_partner,
)
from repro.scenarios import RUNNERS, SCENARIOS, rlhf_weight_sync, weight_transfer
from repro.scenarios.rlhf_weight_sync import (
    WeightSyncParams,
    computed_reference,
    cross_check_request,
    disagreements,
    swap_index,
)
from repro.scenarios.vocab import REFERENCE_MARGIN, EngineContext, ScenarioFailed, ScenarioUnsupported
from repro.scenarios.weight_transfer import reload_unsupported

# Marked per test: `unit` ones are pure and fast, `integration` ones start the trainer process.
typed = StreamRecord.from_json  # the oracle judges typed request records


# --------------------------------------------------------------------------- the reference


def _record(prompt: list[int], observed: list[int], *, submit: Any = "start", pause_at: int | None = 8,
            max_tokens: int = 24, preempted: bool = True) -> dict[str, Any]:
    pauses = [] if pause_at is None else [{
        "k": 0, "mode": "keep", "clear_cache": True, "client_tokens": pause_at, "engine_tokens": pause_at,
        "engine_status": "PREEMPTED" if preempted else "RUNNING", "engine_preemptions": int(preempted),
        "frozen": True}]
    return {"rid": "r", "submit": submit, "prompt": prompt, "max_tokens": max_tokens, "observed": observed,
            "finish_reason": "length", "error": None, "pauses": pauses, "reference_matches_model": True}


@pytest.mark.unit
def test_swap_index_follows_when_each_request_ran() -> None:
    assert swap_index(_record([5], [], pause_at=8)) == 8
    assert swap_index(_record([5], [], pause_at=0)) == 0
    # Submitted during the pause: every token is generated after the swap.
    assert swap_index(_record([5], [], submit=["during", 0], pause_at=None)) == 0
    # Ended before the pause: all A (the whole reference, margin included).
    assert swap_index(_record([5], [], pause_at=None, max_tokens=24)) == 24 + REFERENCE_MARGIN


@pytest.mark.unit
@given(st.integers(8, 300), st.integers(0, 1000), st.data())
def test_computed_reference_is_a_then_b_from_the_last_pre_pause_token(v: int, seed: int, data: st.DataObject) -> None:
    pa, pb = cycle_permutation(v, seed), cycle_permutation(v, seed + 1)
    prompt = [data.draw(st.integers(0, v - 1)) for _ in range(3)]
    max_tokens = data.draw(st.integers(1, 40))
    i = data.draw(st.integers(0, max_tokens))
    ref = computed_reference(_record(prompt, [], pause_at=i, max_tokens=max_tokens), pa, pb)
    assert len(ref) == max_tokens + REFERENCE_MARGIN
    assert ref[:i] == expected_continuation(pa, prompt[-1], i)
    last = ref[i - 1] if i else prompt[-1]
    assert ref[i] == pb[last]  # the first post-resume token
    assert ref[i:] == expected_continuation(pb, last, len(ref) - i)


def _streams(v: int = 512, i: int = 8, max_tokens: int = 24) -> tuple[list[int], list[int], list[int], list[int]]:
    spec = BigramCycleSpec(vocab_size=v)
    pa, pb = cycle_permutation(v, spec.seed), cycle_permutation(v, swap_partner(spec).seed)
    prompt = [3, 7, 11]
    ref = computed_reference(_record(prompt, [], pause_at=i, max_tokens=max_tokens), pa, pb)
    return pa, pb, prompt, ref


@pytest.mark.unit
def test_the_oracle_sees_the_lost_first_post_swap_token_as_loss_1() -> None:
    _, pb, prompt, ref = _streams()
    i, n = 8, 24
    lost = ref[:i] + ref[i + 1 : n + 1]  # vLLM #42043: the first post-resume token never arrives
    rec = _record(prompt, lost, pause_at=i, max_tokens=n)
    rec["reference"] = ref
    v = classify_request(typed(rec))
    assert v.outcome is Outcome.LOSS and v.verdict.label == f"LOSS(1 at {i})"
    assert v.first_post_resume == {"index": i, "expected": pb[ref[i - 1]], "observed": ref[i + 1]}


@pytest.mark.unit
def test_the_oracle_passes_the_exact_a_then_b_stream_and_catches_a_missed_swap() -> None:
    pa, _, prompt, ref = _streams()
    i, n = 8, 24
    ok = _record(prompt, ref[:n], pause_at=i, max_tokens=n)
    ok["reference"] = ref
    assert classify_request(typed(ok)).outcome is Outcome.OK
    # Weights never changed: the stream keeps walking A, which differs from B at every token.
    stale = _record(prompt, expected_continuation(pa, prompt[-1], n), pause_at=i, max_tokens=n)
    stale["reference"] = ref
    v = classify_request(typed(stale))
    assert v.outcome is Outcome.DIVERGED and v.verdict.at == i


@pytest.mark.unit
def test_cross_check_request_is_prompt_plus_pre_swap_tokens() -> None:
    pa, pb, prompt, ref = _streams()
    rec = _record(prompt, [], pause_at=8, max_tokens=24)
    req, want = cross_check_request("x", rec, ref)  # type: ignore[misc]
    assert req.prompt == prompt + ref[:8]
    assert req.max_tokens == len(ref) - 8
    assert want == ref[8:] == expected_continuation(pb, ref[7], len(ref) - 8)
    ended = _record(prompt, [], pause_at=None, max_tokens=24)
    assert cross_check_request("y", ended, computed_reference(ended, pa, pb)) is None


@pytest.mark.unit
def test_disagreements_name_both_sequences() -> None:
    assert disagreements([("a", [1, 2, 3], [1, 2, 3])]) == []
    (line,) = disagreements([("a", [1, 2, 3], [1, 2, 3]), ("b", [1, 2, 3], [1, 9, 3])])
    assert line.startswith("b: computed [1, 2, 3] but the engine holding B gave [1, 9, 3]")
    assert "first difference at 1" in line
    (short,) = disagreements([("c", [1, 2, 3], [1, 2])])
    assert "first difference at 2" in short


# --------------------------------------------------------------------------- parameters and plan


@pytest.mark.unit
def test_params_validate_names_and_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown weight_sync parameters \['bogus'\]"):
        WeightSyncParams.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="keep mode only"):
        WeightSyncParams.from_dict({"mode": "wait"})
    with pytest.raises(ValueError, match="unknown weight_transfer 'ipc'; valid: reload, nccl"):
        WeightSyncParams.from_dict({"weight_transfer": "ipc"})
    p = WeightSyncParams.from_dict({"mode": "keep", "clear_cache": False, "weight_transfer": "nccl", "max_tokens": 30})
    assert p.pause_params().clear_cache is False and p.pause_params().max_tokens == 30


@pytest.mark.unit
def test_registered_and_planned_like_the_keep_scenario() -> None:
    assert SCENARIOS["weight_sync"] is rlhf_weight_sync.build and RUNNERS["weight_sync"] is rlhf_weight_sync.run
    plan = rlhf_weight_sync.build("ws", {"clear_cache": True}, 512, 3)
    assert len(plan.requests) == 10
    assert [r.submit for r in plan.requests].count("start") == 8
    (pause,) = plan.pauses
    assert (pause.mode, pause.clear_cache, pause.after_tokens) == ("keep", True, 8)


# --------------------------------------------------------------------------- support detection


class ForwardingWorker:
    def reload_weights(self, *args: Any, **kwargs: Any) -> None: ...


class RunnerWithPath:
    def reload_weights(self, weights_iterator: Any = None, weights_path: str | None = None) -> None: ...


class RunnerWithoutPath:  # vLLM 0.14/0.15
    def reload_weights(self) -> None: ...


class NoReload:
    pass


def _probe(worker: type, runner: type) -> dict[str, str]:
    return {"worker_class": f"{__name__}.{worker.__name__}", "model_runner_class": f"{__name__}.{runner.__name__}"}


@pytest.mark.unit
def test_reload_support_is_read_from_the_classes_the_workers_run() -> None:
    assert reload_unsupported([_probe(ForwardingWorker, RunnerWithPath)]) is None
    assert reload_unsupported([_probe(RunnerWithPath, NoReload)]) is None  # the worker takes it itself
    why = reload_unsupported([_probe(ForwardingWorker, RunnerWithoutPath)])
    assert why is not None and "RunnerWithoutPath.reload_weights() takes no weights_path=" in why
    why = reload_unsupported([_probe(NoReload, RunnerWithPath)])
    assert why is not None and "NoReload has no reload_weights()" in why
    assert "worker probe unavailable" in str(reload_unsupported([]))
    assert "cannot import" in str(reload_unsupported([{"worker_class": "no.such.Mod", "model_runner_class": "x.Y"}]))


@pytest.mark.unit
def test_a_forwarding_runner_is_judged_by_the_v1_runner_it_forwards_to(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("vllm.v1.worker.gpu_model_runner")
    mod.GPUModelRunner = RunnerWithoutPath  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", mod)
    why = reload_unsupported([_probe(ForwardingWorker, ForwardingWorker)])
    assert why is not None and "forwards to GPUModelRunner.reload_weights" in why
    mod.GPUModelRunner = RunnerWithPath  # type: ignore[attr-defined]
    assert reload_unsupported([_probe(ForwardingWorker, ForwardingWorker)]) is None


# --------------------------------------------------------------------------- the scenario on a fake engine


# The sampling parameters and outputs an AsyncLLM takes and yields, shared with the profile tests.
_SP, _Completion, _Output = SP, Completion, Output


class FakeLLM:
    """Greedy decoding over the permutation of the checkpoint last loaded; keep-mode pauses.

    ``bug``: a keep pause with clear_cache force-preempts running requests and
    drops the first token each produces after resume (vLLM #42043).
    ``load_instead``: reload_weights of that folder loads another one.
    ``stale``: a keep pause returns with one frame of each running request in flight, computed with the
    weights of that moment and delivered after resume (vLLM 0.16.0 under async scheduling).
    """

    def __init__(self, model_dir: Path, *, bug: bool = False, load_instead: dict[str, Path] | None = None,
                 stale: bool = False) -> None:
        self.weights = model_dir
        self.bug = bug
        self.stale = stale
        self.load_instead = load_instead or {}
        self.running = asyncio.Event()
        self.running.set()
        self.reqs: dict[str, dict[str, Any]] = {}
        self.engine_core = self
        self.loads: list[Path] = []
        self.resumes = 0

    def perm(self) -> list[int]:
        return load_perm(self.weights)

    async def generate(self, prompt: dict[str, list[int]], sp: _SP, request_id: str) -> AsyncIterator[_Output]:
        st = {"n": 0, "last": prompt["prompt_token_ids"][-1], "status": "RUNNING", "pre": 0, "drop": False}
        self.reqs[request_id + "-0badcafe"] = st
        try:
            while st["n"] < sp.max_tokens:
                await self.running.wait()
                stale = st.pop("in_flight", None)
                tok = self.perm()[st["last"]] if stale is None else stale
                st["last"], st["n"], st["status"] = tok, st["n"] + 1, "RUNNING"
                if st["drop"]:
                    st["drop"] = False
                    continue
                yield _Output([_Completion([tok], "length" if st["n"] >= sp.max_tokens else None)])
                await asyncio.sleep(0)  # let the other requests decode too
        finally:
            del self.reqs[request_id + "-0badcafe"]

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        assert mode == "keep"
        self.running.clear()
        if self.stale:
            for st in self.reqs.values():
                st["in_flight"] = self.perm()[st["last"]]
        if self.bug and clear_cache:
            for st in self.reqs.values():
                st["pre"] += 1
                st["status"] = "PREEMPTED"
                st["drop"] = True

    async def resume_generation(self) -> None:
        self.resumes += 1
        self.running.set()

    async def call_utility_async(self, name: str) -> dict[str, Any]:
        assert name == "repro_request_progress"
        return {rid: {"num_output_tokens": st["n"], "status": st["status"], "num_preemptions": st["pre"]}
                for rid, st in self.reqs.items()}

    async def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> Any:
        if method == "repro_worker_probe":
            return [_probe(ForwardingWorker, RunnerWithPath)]
        assert method == "reload_weights" and kwargs is not None
        path = Path(kwargs["weights_path"])
        self.loads.append(path)
        self.weights = self.load_instead.get(str(path), path)
        return [None]

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cache = tmp_path_factory.mktemp("models")
    spec = BigramCycleSpec()
    return {"cache": cache, "spec": spec, "a": build_checkpoint(spec, cache),
            "b": build_checkpoint(swap_partner(spec), cache),
            "c": build_checkpoint(BigramCycleSpec(seed=swap_partner(spec).seed + 40), cache)}


def _ctx(ck: dict[str, Any], tmp_path: Path, start_engine: Any = None) -> EngineContext:
    return EngineContext(model_spec=ck["spec"], model_dir=ck["a"], perm=load_perm(ck["a"]), model_cache=ck["cache"],
                         work_dir=tmp_path, tensor_parallel_size=1,
                         start_engine=start_engine or (lambda d: pytest.fail("no fresh engine was asked for")))


def _play(llm: FakeLLM, ctx: EngineContext, params: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(runs, "_vllm_api", lambda: (_SP, "DELTA"))
    sc = {"id": "weight_sync-keep-clear", "scenario": "weight_sync", "params": params, "seed": 17}
    return asyncio.run(rlhf_weight_sync.run(llm, sc, ctx, timeout=30))


@pytest.mark.unit
def test_bug_shows_as_loss_1_on_every_request_running_at_the_pause(
    checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = FakeLLM(checkpoints["a"], bug=True)
    out = _play(llm, _ctx(checkpoints, tmp_path), {"clear_cache": True, "max_tokens": 24}, monkeypatch)
    verdict = cell_verdict(stream_records(out["records"]))
    assert verdict.outcome is Outcome.LOSS, verdict.summary
    assert verdict.summary == "LOSS(1) in 8/10 requests (8/8 running at pause)"
    perm_b = load_perm(checkpoints["b"])
    for rec, rv in zip(out["records"], verdict.requests, strict=True):
        ws = rec["weight_sync"]
        if rec["submit"] == "start":
            i = ws["swap_index"]
            assert i >= 8 and rv.verdict.label == f"LOSS(1 at {i})"
            assert ws["expected_first_post_swap"] == perm_b[ws["last_pre_swap_token"]] == rec["reference"][i]
            assert ws["observed_first_post_swap"] == rec["reference"][i + 1]
        else:
            assert rv.outcome is Outcome.OK and ws["swap_index"] == 0
        assert ws["cross_check_engine"] is True and ws["engine_a_stream_matches"] is True
    # B was loaded at the pause, A afterwards, and the engine follows A again.
    assert llm.loads == [checkpoints["b"], checkpoints["a"]] and llm.weights == checkpoints["a"]
    ws = out["weight_sync"]
    assert ws["transfer"] == "reload" and ws["restore"]["verified"] is True
    assert ws["checkpoint_b"]["seed"] == swap_partner(checkpoints["spec"]).seed
    (action,) = [e for e in out["events"] if e["event"] == "pause_action"]
    kinds = [e["event"] for e in out["events"]]
    assert kinds.index("paused") < kinds.index("pause_action") < kinds.index("resume")
    assert action["checkpoint"] == str(checkpoints["b"])


@pytest.mark.unit
def test_a_frame_in_flight_at_the_swap_is_one_stale_token_and_the_known_bug_of_0_16_0(
    checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM 0.16.0's keep pause returns with a frame of each running request in flight (async scheduling): the
    # first post-resume token is weights A's, and B continues from it.
    llm = FakeLLM(checkpoints["a"], stale=True)
    out = _play(llm, _ctx(checkpoints, tmp_path), {"clear_cache": False, "max_tokens": 24}, monkeypatch)
    records = stream_records(out["records"])
    verdict = cell_verdict(records)
    assert verdict.outcome is Outcome.DIVERGED, verdict.summary
    perm_a = load_perm(checkpoints["a"])
    for rec, rv in zip(out["records"], verdict.requests, strict=True):
        ws = rec["weight_sync"]
        if rec["submit"] != "start":
            assert rv.outcome is Outcome.OK
            continue
        i = ws["swap_index"]
        assert ws["stale_first_post_swap"] == perm_a[ws["last_pre_swap_token"]] == rec["observed"][i]
        # DIVERGED there, or AMBIGUOUS where weights A's token lies a few steps ahead on B's cycle.
        assert (rv.outcome, rv.verdict.at) in ((Outcome.DIVERGED, i), (Outcome.AMBIGUOUS, i)), rv.verdict
        if rv.outcome is Outcome.DIVERGED:
            assert "the weights before the swap give" in rv.verdict.detail
    bugs = load_known_bugs()
    for version, status in (("0.16.0", "as expected"), ("0.17.0", "UNEXPECTED")):
        cell = Cell(version, "mp", True, "keep", False, scenario="weight-sync")
        result = judged_result(cell, verdict, records, None, 1.0)
        assert check(result, bugs).status == status, check(result, bugs).message


@pytest.mark.unit
def test_a_stale_token_that_reads_as_a_shift_is_ambiguous_not_a_loss() -> None:
    spec = BigramCycleSpec()
    pa, pb = cycle_permutation(512, spec.seed), cycle_permutation(512, swap_partner(spec).seed)
    i, n, kinds = 2, 16, set()
    for first in range(512):  # every last pre-swap token: weights A's token lies near or far on B's cycle
        prompt = [first]
        ref = computed_reference(_record(prompt, [], pause_at=i, max_tokens=n), pa, pb)
        stale = pa[ref[i - 1]]
        # Steps from the last pre-swap token to weights A's token on B's cycle, less one: the stream
        # ref[:i] + [stale] + B's cycle from it reads as that many tokens lost (the oracle tries up to 8).
        k = expected_continuation(pb, ref[i - 1], len(pb)).index(stale)
        observed = [*ref[:i], stale, *expected_continuation(pb, stale, n)][:n]
        rec = _record(prompt, observed, pause_at=i, max_tokens=n)
        rec["reference"] = ref
        before = classify_request(typed(rec)).verdict
        rec["weight_sync"] = {"swap_index": i, "stale_first_post_swap": stale}
        v = classify_request(typed(rec)).verdict
        if k <= 8 and i + k < len(ref):
            assert before.label == f"LOSS({k} at {i})"
            assert v.outcome is Outcome.AMBIGUOUS and f"fits LOSS({k} at {i}) and a stale token alike" in v.detail
        else:
            assert before.outcome is Outcome.DIVERGED
            assert v.outcome is Outcome.DIVERGED and v.at == i and f"give {stale} there" in v.detail
        kinds.add(v.outcome)
        # Another token there is no stale one: the reading without the swap's facts stands.
        rec["weight_sync"] = {"swap_index": i, "stale_first_post_swap": stale + 1}
        assert classify_request(typed(rec)).verdict.label == before.label
    assert kinds == {Outcome.AMBIGUOUS, Outcome.DIVERGED}  # both readings were exercised


@pytest.mark.unit
def test_fixed_engine_is_ok_and_the_fresh_engine_check_runs(
    checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    fresh: list[FakeLLM] = []

    def start_engine(d: Path) -> FakeLLM:
        fresh.append(FakeLLM(d))
        return fresh[-1]

    llm = FakeLLM(checkpoints["a"], bug=False)
    out = _play(llm, _ctx(checkpoints, tmp_path, start_engine),
                {"clear_cache": True, "max_tokens": 24, "fresh_engine_check": True}, monkeypatch)
    verdict = cell_verdict(stream_records(out["records"]))
    assert verdict.outcome is Outcome.OK, verdict.summary
    assert [f.weights for f in fresh] == [checkpoints["b"]]
    assert out["weight_sync"]["cross_check"] == {"same_engine": 10, "fresh_engine": 10, "agree": True}
    assert all(r["weight_sync"]["cross_check_fresh_engine"] for r in out["records"])


@pytest.mark.unit
def test_wrong_weights_are_an_error_with_both_sequences_and_a_is_restored(
    checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "Loading B" loads C: the engine's continuation disagrees with the computed reference.
    llm = FakeLLM(checkpoints["a"], load_instead={str(checkpoints["b"]): checkpoints["c"]})
    with pytest.raises(ScenarioFailed, match="cross-check against vLLM disagrees") as err:
        _play(llm, _ctx(checkpoints, tmp_path), {"clear_cache": False, "max_tokens": 24}, monkeypatch)
    assert "computed [" in str(err.value) and "but the engine holding B gave [" in str(err.value)
    assert llm.weights == checkpoints["a"]


@pytest.mark.unit
def test_a_restore_that_does_not_take_is_an_error(
    checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = FakeLLM(checkpoints["a"], load_instead={str(checkpoints["a"]): checkpoints["b"]})
    with pytest.raises(ScenarioFailed, match="weights A were not restored"):
        _play(llm, _ctx(checkpoints, tmp_path), {"clear_cache": True, "max_tokens": 24}, monkeypatch)


@pytest.mark.unit
def test_a_failing_swap_resumes_the_engine_and_restores_a(
    checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = FakeLLM(checkpoints["a"])
    real = llm.collective_rpc

    async def flaky(method: str, kwargs: dict[str, Any] | None = None) -> Any:
        if method == "reload_weights" and kwargs and kwargs["weights_path"] == str(checkpoints["b"]):
            raise RuntimeError("worker died while loading")
        return await real(method, kwargs)

    llm.collective_rpc = flaky  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="worker died while loading"):
        _play(llm, _ctx(checkpoints, tmp_path), {"max_tokens": 24}, monkeypatch)
    assert llm.running.is_set() and llm.resumes == 1  # not left paused for the next scenario
    assert llm.weights == checkpoints["a"]


@pytest.mark.unit
def test_the_trainer_takes_the_first_visible_gpu_after_the_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    assert weight_transfer.trainer_gpu_candidates(1) == ["5", "6"]
    assert weight_transfer.trainer_gpu_candidates(2) == ["6"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")
    assert weight_transfer.trainer_gpu_candidates(1) == []


@pytest.mark.unit
def test_unsupported_transfers_are_refused_before_anything_runs(
    checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = FakeLLM(checkpoints["a"])

    async def old_rpc(method: str, kwargs: dict[str, Any] | None = None) -> Any:
        assert method == "repro_worker_probe", "nothing may run on an engine that cannot swap weights"
        return [_probe(ForwardingWorker, RunnerWithoutPath)]

    llm.collective_rpc = old_rpc  # type: ignore[method-assign]
    with pytest.raises(ScenarioUnsupported, match="takes no weights_path="):
        _play(llm, _ctx(checkpoints, tmp_path), {}, monkeypatch)
    assert llm.reqs == {} and llm.loads == []


# --------------------------------------------------------------------------- the trainer's protocol


def _trainer(lines: list[str]) -> tuple[int, list[dict[str, Any]], str]:
    import json
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "repro.scenarios.weight_trainer"],
                          input="".join(x + "\n" for x in lines), capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    replies = [json.loads(x[len(weight_transfer.TRAINER_TAG):]) for x in proc.stdout.splitlines()
               if x.startswith(weight_transfer.TRAINER_TAG)]
    return proc.returncode, replies, proc.stderr


@pytest.mark.integration
def test_trainer_replies_with_the_tag_the_scenario_reads_and_stops_on_request() -> None:
    from repro.scenarios import weight_trainer

    assert weight_trainer.TAG == weight_transfer.TRAINER_TAG
    rc, replies, err = _trainer(['{"op": "stop"}', '{"op": "never-read"}'])
    assert (rc, replies) == (0, [{"ok": True}]), err


@pytest.mark.integration
@pytest.mark.parametrize(("cmd", "error"), [
    ('{"op": "bogus"}', "unknown op 'bogus'; valid: init, send, stop"),
    ('{"op": "send", "checkpoint": "/x", "names": [], "packed": true}', "send before init"),
])
def test_trainer_fails_loudly_and_exits(cmd: str, error: str) -> None:
    rc, replies, _ = _trainer([cmd, '{"op": "stop"}'])
    assert rc == 1
    (reply,) = replies
    assert reply["ok"] is False and error in reply["error"]
