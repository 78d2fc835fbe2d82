"""Parameters shared by the single-pause scenarios (keep, wait, abort)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from repro.scenarios.vocab import PauseSpec, Plan, RequestSpec, make_prompts, params_from_dict


@dataclass(frozen=True)
class SinglePauseParams:
    clear_cache: bool = True
    num_requests: int = 8  # running when the pause happens
    extra_requests: int = 2  # submitted during the pause (keep/wait) or after resume (abort)
    prompt_len: int = 6
    max_tokens: int = 48
    pause_after: int = 8  # pause once every running request has this many tokens

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SinglePauseParams:
        return params_from_dict(cls, data, "scenario parameters")


def single_pause_plan(
    sid: str, mode: str, params: SinglePauseParams, vocab_size: int, seed: int, extra_submit: str
) -> Plan:
    """Plan with ``num_requests`` running requests, one pause, and extra requests around it."""
    if params.pause_after >= params.max_tokens:
        raise ValueError(
            f"pause_after={params.pause_after} must be below max_tokens={params.max_tokens} "
            "or no request is running at the pause"
        )
    n = params.num_requests + params.extra_requests
    prompts = make_prompts(n, params.prompt_len, vocab_size, seed)
    reqs = [RequestSpec(f"{sid}-r{i:02d}", prompts[i], params.max_tokens) for i in range(params.num_requests)]
    reqs += [
        RequestSpec(f"{sid}-x{i:02d}", prompts[params.num_requests + i], params.max_tokens, (extra_submit, 0))
        for i in range(params.extra_requests)
    ]
    return Plan(reqs, [PauseSpec(mode, params.clear_cache, params.pause_after)])


def two_wave_plan(sid: str, num_requests: int, extra_requests: int, prompt_len: int, max_tokens: int,
                  pause_after: int, vocab_size: int, seed: int) -> Plan:
    """``num_requests`` requests at once, then ``extra_requests`` more once the first wave has ``pause_after``
    tokens, so the second wave joins a batch that is decoding (chunked prefill, spec-draft)."""
    prompts = make_prompts(num_requests + extra_requests, prompt_len, vocab_size, seed)
    reqs = [RequestSpec(f"{sid}-r{i:02d}", prompts[i], max_tokens) for i in range(num_requests)]
    reqs += [RequestSpec(f"{sid}-w{i:02d}", prompts[num_requests + i], max_tokens, ("tokens", pause_after))
             for i in range(extra_requests)]
    return Plan(reqs, [])


def unpaused_plan(sid: str, n: int, prompt_len: int, max_tokens: int, vocab_size: int, seed: int) -> Plan:
    """``n`` requests submitted at once and generated to their end: no pause, reset or abort (the plan of the
    scenarios whose event is the engine's own, e.g. a chunked prefill, or none at all)."""
    prompts = make_prompts(n, prompt_len, vocab_size, seed)
    return Plan([RequestSpec(f"{sid}-r{i:02d}", prompts[i], max_tokens) for i in range(n)], [])
