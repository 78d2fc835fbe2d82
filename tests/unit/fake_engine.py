"""A fake AsyncLLM for the engine-profile scenarios' unit tests (no vLLM): greedy decoding over a bigram cycle.

It keeps what the scenarios read: per-request progress, the engine core's counters (``repro_counters``:
preemptions, drafted/accepted, prefill chunks and mixed steps), pause/resume, sleep/wake_up.  A test makes
"vLLM" misbehave through hooks: ``tamper(rid, index, token) -> list[int]`` replaces each emitted token (drop
one: ``[]``, repeat one: ``[t, t]``); ``on_step(fake, rid, n)`` runs before each token (e.g. count a
preemption of a request when several run at once).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SP:
    temperature: float
    max_tokens: int
    ignore_eos: bool
    output_kind: Any
    detokenize: bool


@dataclass
class Completion:
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class Output:
    outputs: list[Completion]


@dataclass
class _Cfg:
    cache_config: Any = None
    scheduler_config: Any = None
    speculative_config: Any = None


@dataclass
class _Ns:
    values: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


class FakeLLM:
    def __init__(self, perm: list[int], *, tamper: Callable[[str, int, int], list[int]] | None = None,
                 on_step: Callable[[FakeLLM, str, int], None] | None = None) -> None:
        self.perm = perm
        self.tamper = tamper or (lambda rid, i, t: [t])
        self.on_step = on_step or (lambda fake, rid, n: None)
        self.running = asyncio.Event()
        self.running.set()
        self.reqs: dict[str, dict[str, Any]] = {}
        self.engine_core = self
        self.counts: dict[str, Counter[str]] = {"preemptions": Counter(), "drafted": Counter(),
                                                "accepted": Counter(), "prefill_chunks": Counter()}
        self.steps: Counter[str] = Counter()
        self.calls: list[str] = []
        self.sleeping = False
        self.vllm_config = _Cfg(_Ns({"num_gpu_blocks": 8, "num_gpu_blocks_override": 8, "block_size": 32}),
                                _Ns({"max_num_batched_tokens": 32}), "ngram_gpu k=3")

    async def generate(self, prompt: dict[str, list[int]], sp: SP, request_id: str) -> AsyncIterator[Output]:
        internal = request_id + "-0badcafe"
        st = {"n": 0, "last": prompt["prompt_token_ids"][-1], "status": "RUNNING", "aborted": False}
        self.reqs[internal] = st
        try:
            while st["n"] < sp.max_tokens:
                await self.running.wait()
                if st["aborted"]:
                    yield Output([Completion([], "abort")])
                    return
                self.on_step(self, internal, st["n"])
                tok = self.perm[st["last"]]
                out = self.tamper(request_id, st["n"], tok)
                # What the engine counts is what it delivered (a dropped frame never reaches output_token_ids).
                st["last"], st["n"] = tok, st["n"] + len(out)
                yield Output([Completion(out, "length" if st["n"] >= sp.max_tokens else None)])
                await asyncio.sleep(0)
        finally:
            del self.reqs[internal]

    # ------------------------------------------------------------------ pause / sleep
    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.calls.append(f"pause({mode},{clear_cache})")
        self.running.clear()
        if mode == "abort":
            for st in self.reqs.values():
                st["aborted"] = True

    async def resume_generation(self) -> None:
        self.calls.append("resume")
        self.running.set()

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(f"sleep({level},{mode})")
        await self.pause_generation(mode, True)
        self.sleeping = True

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"wake_up({tags})")
        if tags in (None, ["kv_cache"]):
            self.sleeping = False
            self.running.set()

    async def is_sleeping(self) -> bool:
        return self.sleeping

    async def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> Any:
        self.calls.append(method)
        if method == "repro_worker_probe":
            return [{"worker_class": "fake_engine.Worker",
                     "model_runner_class": "fake_engine.Worker"}]
        return [None]

    # ------------------------------------------------------------------ engine-core utilities
    async def call_utility_async(self, name: str) -> dict[str, Any]:
        if name == "repro_counters":
            return {"requests": {k: dict(v) for k, v in self.counts.items()}, "steps": dict(self.steps),
                    "problems": []}
        assert name == "repro_request_progress"
        return {rid: {"num_output_tokens": st["n"], "status": st["status"], "num_preemptions": 0}
                for rid, st in self.reqs.items()}


class Worker:
    def reload_weights(self, weights_iterator: Any = None, weights_path: str | None = None) -> None: ...
