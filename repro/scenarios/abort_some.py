"""Abort some running requests mid-stream while the others keep generating: no pause.

Once every running request has ``pause_after`` tokens, the client aborts every
other one at once (``AsyncLLM.abort``, as a server does when clients
disconnect); ``extra_requests`` new ones are submitted right after, into the
batch slots and KV blocks the aborted ones freed.  An aborted stream must be a
prefix of its reference and end with finish_reason ``abort``; every other
stream, the survivors' and the newcomers', must equal its reference exactly.
With async scheduling the aborted requests still have a frame in flight when
the abort lands: its tokens must reach no one, and the survivors' must not
shift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from repro.scenarios.vocab import InflightSpec, Plan, RequestSpec, make_prompts, params_from_dict


@dataclass(frozen=True)
class AbortSomeParams:
    num_requests: int = 8  # generating when the abort happens; every other one is aborted
    extra_requests: int = 2  # submitted right after the abort
    prompt_len: int = 6
    max_tokens: int = 48
    pause_after: int = 8  # abort once every running request has this many tokens

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AbortSomeParams:
        p = params_from_dict(cls, data, "abort_some parameters")
        if p.num_requests < 2:
            raise ValueError(f"num_requests={p.num_requests}: abort_some needs one request to abort and one to keep")
        if not 1 <= p.pause_after < p.max_tokens:
            raise ValueError(f"pause_after={p.pause_after} must lie in [1, max_tokens={p.max_tokens}) "
                             "or no request is running at the abort")
        return p


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    p = AbortSomeParams.from_dict(params)
    prompts = make_prompts(p.num_requests + p.extra_requests, p.prompt_len, vocab_size, seed)
    reqs = [RequestSpec(f"{sid}-r{i:02d}", prompts[i], p.max_tokens) for i in range(p.num_requests)]
    reqs += [RequestSpec(f"{sid}-x{i:02d}", prompts[p.num_requests + i], p.max_tokens, ("after_op", 0))
             for i in range(p.extra_requests)]
    # Every other running request, so the survivors are interleaved with the aborted ones in the batch.
    aborted = tuple(r.rid for r in reqs[1:p.num_requests:2])
    return Plan(reqs, pauses=[], inflight=[InflightSpec("abort", p.pause_after, aborted)])
