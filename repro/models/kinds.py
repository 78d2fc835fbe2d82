"""The model an engine loads, whatever its kind (``repro.core.wire.MODEL_KINDS``), resolved inside the vLLM env.

* ``bigram-cycle``: the built-in deterministic checkpoint (``repro.models.deterministic``),
  built here from its params; its greedy stream is known in advance (``perm``).
* ``qwen3-random``: the built-in random-weight Qwen3 (``repro.models.realistic``),
  built here from its params; its reference is the engine's own no-pause run.
* ``context-cell``: the built-in checkpoint pair A/B whose next token reads the request's marker through
  attention (``repro.models.context_cell``); params are its spec's fields and ``version`` ("A", the default, or
  "B"); its greedy stream under either version, and with stale KV, is ``expected_continuation``.
* ``path``: the user's model, ``{"path": DIR}`` (a local Hugging Face folder)
  or ``{"name": HUB_ID}`` (vLLM downloads it; only where the machine has network).

Pure standard library but for the builders (numpy); never imports vllm.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro.models import context_cell as context_model
from repro.models import realistic
from repro.models.deterministic import BigramCycleSpec, build_checkpoint, load_perm
from repro.models.tokenizer import TOKENIZER_ENGINE_ARGS, ensure_tokenizer

BIGRAM = "bigram-cycle"
# The bigram cycle is exact in float32 only (its engine argument; harness.export.engine_script writes it too).
BIGRAM_DEFAULTS: dict[str, Any] = {"dtype": "float32"}


@dataclass(frozen=True)
class LoadedModel:
    """What the engine needs to know about its model."""

    kind: str
    source: str  # what vLLM's ``model=`` gets: a folder, or a hub id
    spec: Any = None  # BigramCycleSpec / Qwen3RandomSpec of a built-in kind
    perm: list[int] | None = None  # bigram-cycle: the cycle its greedy stream walks
    vocab_size: int | None = None  # None: ask the engine (a hub model)
    # Engine arguments the kind needs, over the engine's defaults and under the user's: the bigram cycle is
    # exact in float32 only; a built-in checkpoint runs in the dtype it was built in; a user's model in
    # vLLM's "auto" (what the user gets without the harness).
    defaults: dict[str, Any] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        """The ``model`` field of the ``engine`` event."""
        out: dict[str, Any] = {"kind": self.kind, "path": self.source}
        if self.spec is not None:
            out.update(key=self.spec.key(), params=asdict(self.spec))
        if isinstance(self.spec, realistic.Qwen3RandomSpec):
            out["n_params"] = self.spec.n_params
        return out


def load_model(kind: str, params: dict[str, Any], cache: Path) -> LoadedModel:
    """Build (or reuse) a built-in checkpoint, or point at the user's model; ValueError on bad params."""
    if kind == BIGRAM:
        spec = BigramCycleSpec.from_dict(params)
        folder = with_tokenizer(build_checkpoint(spec, cache), spec.vocab_size)
        return LoadedModel(kind, str(folder), spec, load_perm(folder), spec.vocab_size,
                           {**BIGRAM_DEFAULTS, **TOKENIZER_ENGINE_ARGS})
    if kind == realistic.KIND:
        qspec = realistic.Qwen3RandomSpec.from_dict(params)
        folder = with_tokenizer(realistic.build_checkpoint(qspec, cache), qspec.vocab_size)
        return LoadedModel(kind, str(folder), qspec, None, qspec.vocab_size,
                           {"dtype": qspec.dtype, **TOKENIZER_ENGINE_ARGS})
    if kind == context_model.KIND:
        return _context_cell(params, cache)
    if kind == "path":
        return _user_model(params)
    raise ValueError(f"unknown model kind {kind!r}")


def _context_cell(params: dict[str, Any], cache: Path) -> LoadedModel:
    fields = dict(params)
    version = str(fields.pop("version", "A"))
    cspec = context_model.ContextCellSpec.from_dict(fields)
    folder = with_tokenizer(context_model.build_checkpoint(cspec, version, cache), cspec.vocab_size)
    # float32 like the bigram cycle (its margin of ~18 logits holds in bfloat16 too).
    return LoadedModel(context_model.KIND, str(folder), cspec, None, cspec.vocab_size,
                       {"dtype": "float32", **TOKENIZER_ENGINE_ARGS})


def with_tokenizer(folder: Path, vocab_size: int) -> Path:
    """A built-in checkpoint with its word-level tokenizer (repro.models.tokenizer: id i <-> ``<i>``), so that vLLM
    loads a tokenizer (the server door's logprobs and structured outputs need one) without any token id changing."""
    return ensure_tokenizer(folder, vocab_size, config_max_len(folder / "config.json"))


def _user_model(params: dict[str, Any]) -> LoadedModel:
    unknown = sorted(set(params) - {"path", "name"})
    if unknown or len(params) != 1:
        raise ValueError(f"a 'path' model takes exactly one of path or name; got {sorted(params)}")
    if "name" in params:
        return LoadedModel("path", str(params["name"]))
    folder = Path(params["path"])
    return LoadedModel("path", str(folder), vocab_size=config_vocab_size(folder / "config.json"))


def config_max_len(config: Path) -> int:
    """``max_position_embeddings`` of a built-in checkpoint's config (the tokenizer's ``model_max_length``)."""
    doc = json.loads(config.read_text(encoding="utf-8"))
    return int(doc.get("max_position_embeddings") or 4096)


def config_vocab_size(config: Path) -> int | None:
    """``vocab_size`` of a Hugging Face config (or of its ``text_config``), None when it has none."""
    try:
        doc = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for part in (doc, doc.get("text_config") or {}):
        if isinstance(part.get("vocab_size"), int):
            return int(part["vocab_size"])
    return None
