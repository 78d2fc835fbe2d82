# SPDX-License-Identifier: Apache-2.0
"""__DOCSTRING__"""

# The body below is copied verbatim into every exported reproducer (``vllm-repro plan PLAN.json
# --export-pytest FILE``, harness/export/sched_pytest.py); the exporter appends the plan and the test.  It imports
# only vLLM, pytest and the standard library, so the file runs in an env that holds vLLM and pytest alone.
#
# What it does is what vllm-repro's scheduler tier does (repro/sched/adapter.py, executor.py): build vLLM's
# real (Async)Scheduler from public classes, with a one-layer model config written to tmp_path and a KV cache
# of one full-attention group; stand where EngineCore stands with a batch queue of ``depth`` frames (as
# step_with_batch_queue keeps them); answer each scheduled frame with the tokens of the output positions it
# samples, fixed when it is scheduled; and check that every request's delivered stream is those tokens, in
# order, complete.  Constructor signatures differ across releases, so every call is fitted to the signature.
from __future__ import annotations

import inspect
import json
import sys
import time
from collections import deque
from typing import Any

import pytest
import vllm.platforms as _platforms
from vllm.platforms.cpu import CpuPlatform

# The CPU platform first, as vllm-repro does: a CUDA wheel on a CPU-only machine resolves to no platform.
if not isinstance(_platforms._current_platform, CpuPlatform):
    _platforms._current_platform = CpuPlatform()

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

VOCAB = 512
# A scheduler that schedules and delivers nothing for this many steps while a request is unfinished has
# stalled: a frame comes back within depth <= 3 steps.
IDLE_LIMIT = 64
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
    "head_dim": 32, "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 0,
    "eos_token_id": 1, "attention_bias": False, "mlp_bias": False,
}


def token_at(prompt: list[int], position: int) -> int:
    """The token the model samples at output ``position`` of a request: distinct along a stream, so a lost,
    repeated or shifted token shows (0 and 1, BOS and EOS, never occur)."""
    return 2 + (prompt[-1] + position) % (VOCAB - 2)


def _fit(fn: Any, offered: dict[str, Any]) -> dict[str, Any]:
    """The part of ``offered`` that ``fn`` accepts (constructor signatures differ across releases)."""
    params = dict(inspect.signature(fn).parameters)
    params.pop("self", None)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) and not any(
            p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params.values()):
        return offered
    return {k: v for k, v in offered.items() if k in params}


def _init_of(cls: type) -> Any:
    """The __init__ that defines ``cls``'s parameters (AsyncScheduler forwards ``*args, **kwargs``)."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        kinds = {p.kind for n, p in inspect.signature(init).parameters.items() if n != "self"}
        if not kinds <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
            return init
    return cls.__init__


def _vllm_config(model_dir: str, setup: dict[str, Any]) -> Any:
    is_async = setup["scheduler"] == "async"
    offered = {"model": model_dir, "skip_tokenizer_init": True, "dtype": "float32",
               "max_model_len": setup["max_model_len"], "max_num_seqs": setup["max_num_seqs"],
               "max_num_batched_tokens": setup["max_num_batched_tokens"], "block_size": setup["block_size"],
               "enable_prefix_caching": setup["enable_prefix_caching"], "enforce_eager": True, "seed": 0,
               "async_scheduling": is_async, "disable_log_stats": True}
    kwargs = _fit(EngineArgs, offered)
    if setup["spec_tokens"]:
        # EAGLE is the drafter every release accepts with async scheduling; only its config is read.
        kwargs["speculative_config"] = {"method": "eagle", "model": model_dir,
                                        "num_speculative_tokens": setup["spec_tokens"]}
    cfg = EngineArgs(**kwargs).create_engine_config()
    # The CPU platform turns async scheduling off and picks its own block size: restore the plan's.
    if hasattr(cfg.scheduler_config, "async_scheduling"):
        cfg.scheduler_config.async_scheduling = is_async
    cfg.cache_config.block_size = setup["block_size"]
    cfg.cache_config.num_gpu_blocks = setup["num_blocks"]
    cfg.cache_config.enable_prefix_caching = setup["enable_prefix_caching"]
    return cfg


def make_scheduler(tmp_path: Any, setup: dict[str, Any]) -> Any:
    """vLLM's Scheduler or AsyncScheduler for ``setup``, with a KV cache of ``num_blocks`` blocks."""
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    cfg = _vllm_config(str(tmp_path), setup)
    spec = FullAttentionSpec(**_fit(FullAttentionSpec, {
        "block_size": setup["block_size"], "num_kv_heads": 1, "head_size": 32, "dtype": cfg.model_config.dtype,
        "use_mla": False, "sliding_window": None}))
    group = KVCacheGroupSpec(**_fit(KVCacheGroupSpec, {"layer_names": ["model.layers.0.self_attn.attn"],
                                                       "kv_cache_spec": spec}))
    kv = KVCacheConfig(**_fit(KVCacheConfig, {"num_blocks": setup["num_blocks"], "kv_cache_tensors": [],
                                              "kv_cache_groups": [group]}))
    from vllm.v1.structured_output import StructuredOutputManager

    cls = AsyncScheduler if setup["scheduler"] == "async" else Scheduler
    return cls(**_fit(_init_of(cls), {
        "vllm_config": cfg, "kv_cache_config": kv, "structured_output_manager": StructuredOutputManager(cfg),
        "block_size": setup["block_size"], "hash_block_size": setup["block_size"],
        "include_finished_set": False, "log_stats": False}))


def _block_hasher(block_size: int) -> Any:
    """vLLM's sha256 request block hasher, as EngineCore builds it for prefix caching (None before 0.10)."""
    from vllm.v1.core import kv_cache_utils as kvu

    if not hasattr(kvu, "get_request_block_hasher"):
        return None
    try:
        from vllm.utils.hashing import sha256
    except ImportError:
        from vllm.utils import sha256  # type: ignore[no-redef, attr-defined]
    kvu.init_none_hash(sha256)
    return kvu.get_request_block_hasher(block_size, sha256)


def make_request(rid: str, prompt: list[int], max_tokens: int, hasher: Any) -> Any:
    sp = SamplingParams(**_fit(SamplingParams, {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}))
    return Request(**_fit(Request.__init__, {
        "request_id": rid, "prompt_token_ids": list(prompt), "sampling_params": sp, "pooling_params": None,
        "eos_token_id": 1, "block_hasher": hasher, "arrival_time": time.time(), "mm_features": None,
        "multi_modal_kwargs": None, "multi_modal_hashes": None, "multi_modal_placeholders": None,
        "lora_request": None}))


def runner_output(req_ids: list[str], sampled: list[list[int]]) -> Any:
    if "ndarray" in str(ModelRunnerOutput.__annotations__.get("sampled_token_ids", "")):
        # vLLM 0.11.1-0.11.2 hand the scheduler one array per request (it calls .tolist()): NumPy as vLLM imports it.
        np = sys.modules[ModelRunnerOutput.__module__].np
        sampled = [np.asarray(row, dtype=np.int64) for row in sampled]
    return ModelRunnerOutput(**_fit(ModelRunnerOutput, {
        "req_ids": req_ids, "req_id_to_index": {r: i for i, r in enumerate(req_ids)},
        "sampled_token_ids": sampled, "spec_token_ids": None, "logprobs": None, "prompt_logprobs_dict": {},
        "pooler_output": [], "num_nans_in_logits": None, "kv_connector_output": None}))


class Stalled(AssertionError):
    """vLLM's scheduler made no progress on a request it could run."""


class Replay:
    """EngineCore with a batch queue of ``depth`` frames, a worker that samples ``token_at``, and the client's
    streams (what ``update_from_output`` delivered per request)."""

    def __init__(self, scheduler: Any, setup: dict[str, Any], requests: dict[str, dict[str, Any]]) -> None:
        self.sched, self.setup, self.specs = scheduler, setup, requests
        self.queue: deque[tuple[Any, Any, dict[str, list[int]]]] = deque()
        self.worker_next: dict[str, int] = {}  # next output position the worker samples per continuing request
        self.delivered: dict[str, list[int]] = {}
        self.finished: dict[str, str] = {}
        self.aborted: set[str] = set()
        self.added: list[str] = []
        self.steps = self.progress_at = 0
        self.hasher = _block_hasher(setup["block_size"]) if setup["enable_prefix_caching"] else None

    def _restarted(self, so: Any) -> set[str]:
        new = {r.req_id for r in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        if hasattr(cached, "resumed_from_preemption"):  # older releases: a flag per cached request
            resumed |= {r for r, f in zip(cached.req_ids, cached.resumed_from_preemption, strict=False) if f}
        return new | resumed

    def _positions(self, so: Any) -> dict[str, list[int]]:
        """The output positions the worker samples for each request of frame ``so``."""
        drafts_of = getattr(so, "scheduled_spec_decode_tokens", None) or {}
        restarted, out = self._restarted(so), {}
        for rid in so.num_scheduled_tokens:
            req, drafts = self.sched.requests[rid], len(drafts_of.get(rid, ()))
            if rid in restarted or rid not in self.worker_next:
                self.worker_next.pop(rid, None)
                if req.num_computed_tokens - drafts < req.num_tokens:
                    out[rid] = []  # a prefill chunk: the worker samples once every token it was sent is computed
                    continue
            first = self.worker_next.get(rid, req.num_computed_tokens - drafts - req.num_prompt_tokens)
            accepted = min(drafts, self.setup["spec_accepted"])
            out[rid] = [first + j for j in range(accepted + 1)]
            self.worker_next[rid] = first + accepted + 1
        return out

    def schedule(self) -> Any:
        so = self.sched.schedule()
        if so.total_num_scheduled_tokens > 0:
            self.progress_at = self.steps
        positions = self._positions(so)
        ids = list(positions)
        sampled = [[token_at(self.specs[r]["prompt"], p) for p in positions[r]] for r in ids]
        self.queue.append((so, runner_output(ids, sampled), positions))
        return so

    def process(self) -> None:
        so, out, _ = self.queue.popleft()
        for eco in (self.sched.update_from_output(so, out) or {}).values():
            for o in eco.outputs:
                self.delivered.setdefault(o.request_id, []).extend(int(t) for t in o.new_token_ids)
                if o.new_token_ids or o.finish_reason is not None:
                    self.progress_at = self.steps
                if o.finish_reason is not None and o.request_id not in self.aborted:
                    self.finished[o.request_id] = str(o.finish_reason)

    def has_requests(self) -> bool:
        s = self.sched
        return bool(s.has_requests() if hasattr(s, "has_requests") else s.has_unfinished_requests())

    def step(self) -> None:
        """One EngineCore.step_with_batch_queue: schedule while the queue has room, else process the oldest."""
        self.steps += 1
        if self.has_requests() and len(self.queue) < self.setup["depth"]:
            so = self.schedule()
            if so.total_num_scheduled_tokens > 0 and len(self.queue) < self.setup["depth"]:
                return
        if self.queue:
            self.process()

    def fill(self) -> None:
        while len(self.queue) < self.setup["depth"] and self.has_requests():
            if self.schedule().total_num_scheduled_tokens == 0:
                self.process()
                break

    def state(self) -> str:
        """The scheduler's bookkeeping, for a stall's message."""
        rows = [f"{rid} {getattr(r.status, 'name', r.status)} computed {r.num_computed_tokens} tokens "
                f"{r.num_tokens} placeholders {getattr(r, 'num_output_placeholders', '-')}"
                for rid, r in self.sched.requests.items()]
        waiting = [r.request_id for r in self.sched.waiting]
        running = [r.request_id for r in self.sched.running]
        return (f"step {self.steps}, {len(self.queue)} frame(s) in flight; waiting {waiting}, running {running}; "
                + "; ".join(rows))

    def bounded(self, what: str, until: Any) -> None:
        start = self.steps
        for _ in range(self.setup["max_steps"]):
            if until():
                return
            if self.steps - max(start, self.progress_at) >= IDLE_LIMIT:
                raise Stalled(f"STALL in {what}: nothing scheduled or delivered in {IDLE_LIMIT} steps; "
                              + self.state())
            self.step()
        if not until():
            raise Stalled(f"STALL in {what}: not reached after {self.setup['max_steps']} steps; " + self.state())

    def unfinished(self) -> list[str]:
        return [r for r in self.added if r not in self.finished and r not in self.aborted]

    def apply(self, op: dict[str, Any]) -> None:
        """One op of the plan (vllm-repro's op script: repro/sched/script.py OP_KINDS)."""
        kind = op["op"]
        if kind == "add":
            spec = self.specs[op["rid"]]
            self.added.append(op["rid"])
            self.sched.add_request(make_request(op["rid"], spec["prompt"], spec["max_tokens"], self.hasher))
        elif kind == "step":
            for _ in range(op.get("n", 1)):
                self.step()
        elif kind == "step_until":
            self.bounded(f"step_until {op.get('tokens', 0)}", lambda: all(
                len(self.delivered.get(r, [])) >= op.get("tokens", 0) for r in self.unfinished()))
        elif kind == "fill":
            self.fill()
        elif kind == "pop" and self.queue:
            self.process()
        elif kind == "drain":
            while self.queue:
                self.process()
        elif kind == "reset":
            self.reset(op.get("in_flight"))
        elif kind in ("pause", "resume"):
            self.pause(kind, op.get("optional", False))
        elif kind == "abort" and op["rid"] in self.unfinished():
            self.sched.finish_requests(op["rid"], RequestStatus.FINISHED_ABORTED)
            self.aborted.add(op["rid"])
        elif kind == "run":
            self.bounded("run to completion", lambda: not self.queue and not self.has_requests())

    def reset(self, in_flight: int | None) -> None:
        """reset_prefix_cache(reset_running_requests=True) with ``in_flight`` frames still in flight."""
        if in_flight is not None:
            self.fill()
            while len(self.queue) > in_flight:
                self.process()
        self.sched.reset_prefix_cache(reset_running_requests=True)

    def pause(self, kind: str, optional: bool) -> None:
        try:
            from vllm.v1.core.sched.interface import PauseState
        except ImportError:
            PauseState = None
        if PauseState is None or not hasattr(self.sched, "set_pause_state"):
            if optional:
                return
            pytest.skip("this vLLM has no scheduler pause state")
        self.sched.set_pause_state(PauseState.PAUSED_ALL if kind == "pause" else PauseState.UNPAUSED)


def check_streams(replay: Replay) -> None:
    """Every request delivered the tokens of its positions in order; every one not aborted finished with all of
    them."""
    for rid in replay.added:
        spec = replay.specs[rid]
        want = [token_at(spec["prompt"], p) for p in range(spec["max_tokens"])]
        got = replay.delivered.get(rid, [])
        if rid in replay.aborted:
            assert got == want[:len(got)], f"{rid} (aborted): delivered {got}, expected a prefix of {want}"
            continue
        assert got == want, f"{rid}: delivered {got}, expected {want}"
        assert rid in replay.finished, f"{rid}: never finished"
