"""A prefix-cache reset with the requests still generating: no pause.

The shape of vLLM's own ``tests/v1/core/test_reset_prefix_cache_e2e.py``
(AsyncLLM here): the requests run, and once every running request has
``pause_after`` tokens (and again at each later count of ``reset_at``) the
client calls ``reset_prefix_cache(reset_running_requests=True)`` while the
engine keeps stepping.  The scheduler preempts every running request, drops the
frame already in flight for it (async scheduling) and prefills it again; every
stream must equal the engine's own no-reset reference, token for token.  One
request has a long prompt, as upstream's test has, so the re-prefill after the
reset is not a one-token step.

Unlike a keep-mode pause (vLLM #42043: nothing in flight, yet a frame
discarded), an async engine that is generating has a frame in flight when the
reset lands, so discarding one is right; whether the discard matches what is in
flight is exactly what this checks (PR #42117 made the count explicit:
``async_tokens_to_discard = num_output_placeholders``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from repro.scenarios.vocab import (
    MAX_MODEL_LEN,
    REFERENCE_MARGIN,
    InflightSpec,
    Plan,
    RequestSpec,
    make_prompts,
    params_from_dict,
)


@dataclass(frozen=True)
class ResetInflightParams:
    num_requests: int = 8  # generating when the reset happens
    prompt_len: int = 6
    long_prompt_len: int = 64  # one more request with this prompt length (0: none)
    max_tokens: int = 48
    pause_after: int = 8  # the first reset: once every running request has this many tokens
    # Later resets, at these token counts (None: one more halfway between pause_after and max_tokens).
    reset_at: tuple[int, ...] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResetInflightParams:
        data = dict(data)
        if data.get("reset_at") is not None:
            data["reset_at"] = tuple(int(n) for n in data["reset_at"])  # a JSON list
        return params_from_dict(cls, data, "reset_inflight parameters")

    def counts(self) -> list[int]:
        """The token counts that trigger a reset, ascending; each below max_tokens or nothing is running."""
        later = self.reset_at if self.reset_at is not None else ((self.pause_after + self.max_tokens) // 2,)
        counts = sorted({self.pause_after, *later})
        if counts[0] < 1 or counts[-1] >= self.max_tokens:
            raise ValueError(f"reset points {counts} must lie in [1, max_tokens={self.max_tokens}) "
                             "or no request is running at the reset")
        return counts


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    p = ResetInflightParams.from_dict(params)
    counts = p.counts()
    prompts = make_prompts(p.num_requests, p.prompt_len, vocab_size, seed)
    reqs = [RequestSpec(f"{sid}-r{i:02d}", prompts[i], p.max_tokens) for i in range(p.num_requests)]
    if p.long_prompt_len:
        if p.long_prompt_len + p.max_tokens + REFERENCE_MARGIN > MAX_MODEL_LEN:
            raise ValueError(f"long_prompt_len={p.long_prompt_len} + max_tokens={p.max_tokens} (+ the reference's "
                             f"{REFERENCE_MARGIN}) exceeds the engine's max_model_len={MAX_MODEL_LEN}")
        (long,) = make_prompts(1, p.long_prompt_len, vocab_size, seed + 1)
        reqs.append(RequestSpec(f"{sid}-long", long, p.max_tokens))
    return Plan(reqs, pauses=[], inflight=[InflightSpec("reset", n) for n in counts])
