"""Issue 37 item 3: the other weight-update doors of the stale-kv scenarios: the native door
(repro.scenarios.native_update), the sleep door (repro.scenarios.stale_kv_sleep) and the LoRA door
(repro.scenarios.stale_kv_lora), their catalogue entries and what the oracle makes of their planted streams.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from harness.core.oracle import Outcome, classify_request
from harness.core.profiles import PROFILES
from harness.core.recorded_streams import StreamRecord
from harness.core.scenarios import BY_SCENARIO, scenario_words
from repro.models import context_cell as cm
from repro.models.deterministic import read_safetensors
from repro.scenarios import RUNNERS, SCENARIOS
from repro.scenarios import native_update as nu
from repro.scenarios import stale_kv as sk
from repro.scenarios import stale_kv_lora as sl
from repro.scenarios.vocab import ScenarioUnsupported
from repro.server.endpoints import SCENARIOS as SERVER_SCENARIOS

pytestmark = pytest.mark.unit

SPEC = cm.ContextCellSpec()
DOORS = scenario_words()["update-doors"]


def test_every_door_scenario_has_a_builder_a_runner_a_server_answer_and_the_context_model() -> None:
    assert {d.split("-")[0] for d in DOORS} == {"native", "sleep", "lora"}
    for name in DOORS:
        key = name.replace("-", "_")
        assert key in SCENARIOS and key in RUNNERS and isinstance(SERVER_SCENARIOS[key], str)
        s = BY_SCENARIO[name]
        assert s.model == "context-cell" and PROFILES[s.profile].model == "context-cell"
        assert ("enable_prefix_caching", True) in PROFILES[s.profile].engine_args
    # The must-show group keeps its five in-place-reload cells (its speed budget).
    assert all(n.startswith("stale-kv-") for n in scenario_words()["stale-kv"])


def test_the_sleep_variants_clear_the_cache_in_keep_mode() -> None:
    for variant in sk.SLEEP_VARIANTS:
        sk.StaleKvParams(variant=variant, mode="keep", clear_cache=True)
        with pytest.raises(ValueError, match="clear_cache=True"):
            sk.StaleKvParams(variant=variant, mode="keep", clear_cache=False)
    assert set(sk.SLEEP_SCENARIOS) == {"sleep_update_l1", "sleep_update_l1_reset", "sleep_update_l2",
                                       "sleep_update_l2_reset"}


# --------------------------------------------------------------------------- the native door


class FakeLLM:
    """What NativeTransfer calls, recorded; ``update_error``: what update_weights raises."""

    def __init__(self, update_error: Exception | None = None, backend: str = "repro_file") -> None:
        self.calls: list[str] = []
        self.update_error = update_error
        self.vllm_config = type("C", (), {"weight_transfer_config": type("W", (), {"backend": backend})()})()

    async def start_weight_update(self) -> None:
        self.calls.append("start")

    async def update_weights(self, request: Any) -> None:
        self.calls.append(f"update {request}")
        if self.update_error is not None:
            raise self.update_error

    async def finish_weight_update(self) -> None:
        self.calls.append("finish")


def _load(llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(nu, "_update_request", lambda info: info["path"])
    return asyncio.run(nu.NativeTransfer(llm).load(Path("/ckpt")))


def test_the_native_door_calls_start_update_finish_with_the_checkpoint_file(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = FakeLLM()
    facts = _load(llm, monkeypatch)
    assert llm.calls == ["start", "update /ckpt/model.safetensors", "finish"]
    assert facts["transfer"] == "native" and facts["checkpoint"] == "/ckpt"


def test_an_update_error_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="bad tensor"):
        _load(FakeLLM(ValueError("bad tensor")), monkeypatch)


def test_a_start_that_raises_on_the_cpu_platform_is_unsupported_with_vllms_words(
        monkeypatch: pytest.MonkeyPatch) -> None:
    llm = FakeLLM()

    async def start() -> None:
        raise RuntimeError("Worker failed with error 'device() received an invalid combination of arguments'")

    llm.start_weight_update = start  # type: ignore[method-assign]
    monkeypatch.setattr(nu, "_cpu_platform", lambda: True)
    with pytest.raises(ScenarioUnsupported, match="device\\(\\) received an invalid combination"):
        _load(llm, monkeypatch)
    monkeypatch.setattr(nu, "_cpu_platform", lambda: False)  # where the door is built for, a failure is vLLM's
    with pytest.raises(RuntimeError, match="Worker failed"):
        _load(llm, monkeypatch)


def test_the_native_door_is_unsupported_without_its_api_or_its_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ScenarioUnsupported, match=r"arrived in vLLM 0\.21\.0"):
        asyncio.run(nu.native_transfer(object()))
    monkeypatch.setattr(nu, "CONFIG_PROBLEM", ["WeightTransferConfig(backend='repro_file') refused: literal_error"])
    with pytest.raises(ScenarioUnsupported, match="literal_error"):
        asyncio.run(nu.native_transfer(FakeLLM()))
    monkeypatch.setattr(nu, "CONFIG_PROBLEM", [None])
    with pytest.raises(ScenarioUnsupported, match="not the repro_file backend"):
        asyncio.run(nu.native_transfer(FakeLLM(backend="nccl")))


# --------------------------------------------------------------------------- the LoRA door


def test_adapter_v2_turns_a_v_proj_into_b_and_v1_changes_nothing(tmp_path: Path) -> None:
    import numpy as np

    key = "base_model.model.model.layers.0.self_attn.v_proj"
    v = "model.layers.0.self_attn.v_proj.weight"
    a, b = cm.weights(SPEC, "A")[v], cm.weights(SPEC, "B")[v]
    for version, want in (("v1", a), ("v2", b)):
        folder = sl.lora_adapter(SPEC, version, tmp_path)
        t = read_safetensors(folder / "adapter_model.safetensors")
        cfg = json.loads((folder / "adapter_config.json").read_text())
        scale = cfg["lora_alpha"] / cfg["r"]
        assert np.array_equal(a + scale * t[f"{key}.lora_B.weight"] @ t[f"{key}.lora_A.weight"], want)
    assert sl.lora_adapter(SPEC, "v2", tmp_path) == folder  # reused


def _lora_record(planted: str) -> StreamRecord:
    p = sk.StaleKvParams(variant="reset", mode="wait")
    plan = sl.build("s", {"mode": "wait", "clear_cache": False}, SPEC.vocab_size, 0)
    shared = sk.prompts(SPEC, p, 0)["w"][:sk.SHARED]
    r = next(r for r in plan.requests if r.rid.endswith(sk.SHARED_SUFFIX))
    rec: dict[str, Any] = {"rid": r.rid, "prompt": r.prompt, "max_tokens": r.max_tokens, "num_cached_tokens": 64,
                           "submit": list(r.submit), "pauses": []}
    fresh, stale = sl.expectations(SPEC, rec, "new")
    rec["observed"] = (stale if planted == "stale" else fresh)[:r.max_tokens]
    sk.annotate([rec], SPEC, shared, "wait", True, sl.expectations)
    return StreamRecord.from_json(rec)


def test_a_new_lora_request_reading_the_old_adapters_kv_is_stale_kv_and_fresh_is_ok() -> None:
    stale = classify_request(_lora_record("stale"))
    assert stale.outcome is Outcome.STALE_KV and stale.verdict.label == "STALE-KV(at 0)"
    assert classify_request(_lora_record("fresh")).outcome is Outcome.OK
    fresh, old = sl.expectations(SPEC, {"prompt": sk.prompts(SPEC, sk.StaleKvParams(), 0)["n00"],
                                        "max_tokens": 8}, "new")
    assert all(x != y for x, y in zip(fresh, old, strict=True))


# --------------------------------------------------------------------------- the server door


def test_the_usage_chunk_gives_the_prefix_cache_hit_and_a_token_chunk_none() -> None:
    from repro.server.http_llm import chunk_outputs

    usage = {"choices": [], "usage": {"prompt_tokens": 70, "prompt_tokens_details": {"cached_tokens": 64}}}
    assert chunk_outputs(usage).num_cached_tokens == 64
    assert chunk_outputs({"choices": [], "usage": {"prompt_tokens": 70}}).num_cached_tokens is None
    tokens = chunk_outputs({"choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": None}]})
    assert tokens.num_cached_tokens is None and tokens.outputs[0].token_ids == [5, 6]


@pytest.mark.parametrize(("answer", "want"), [({"success": False}, False), ({"success": True}, True), ("", None)])
def test_the_reset_endpoints_answer_is_returned_and_a_bodyless_200_says_nothing(answer: Any, want: Any) -> None:
    from repro.server.http_llm import HttpLLM

    llm = HttpLLM.__new__(HttpLLM)

    async def post(path: str, params: Any = None, body: Any = None) -> Any:
        assert path == "/reset_prefix_cache"
        return answer

    llm.post = post  # type: ignore[method-assign]
    llm.require = lambda *a: None  # type: ignore[method-assign]
    assert asyncio.run(llm.reset_prefix_cache()) is want


# --------------------------------------------------------------------------- the known-bug check of a pausing cell


def test_vllm_42043s_loss_is_expected_in_the_kept_requests_not_in_the_named_shared_ones() -> None:
    """stale-kv-running on 0.21.0 async on (docs/results/stalekv-scenario-2026-12-04/): LOSS(1) in the 8 requests
    kept across the pause, the 4 "-shared" ones OK.  The scenario's fault_records ("-shared") names where its
    STALE-KV shows; vllm#42043's shift must still be looked for in the requests running at the pause."""
    from harness.verdicts.known_bugs import annotate, load_known_bugs
    from harness.verdicts.results import read_results

    (cell,) = read_results(Path(__file__).resolve().parents[1] / "fixtures" / "results" /
                           "schema3-stalekv-running-loss.json").cells
    assert cell.outcome is Outcome.LOSS
    judged = annotate(cell, load_known_bugs()).expectation
    assert (judged.status, judged.bug) == ("as expected", "vllm#42043"), judged.message
