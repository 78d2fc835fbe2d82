"""Deterministic checkpoints whose greedy output is known in advance.

A *bigram-cycle* model is a Llama checkpoint in which every attention
``o_proj`` and MLP ``down_proj`` is zero, so the residual stream at the last
layer is just the embedding of the current token.  The final RMSNorm scales
it, and ``lm_head`` row ``perm[t]`` is the normalised embedding of ``t``, so
the arg-max logit after token ``t`` is ``perm[t]``.  ``perm`` is a single
cycle over the whole vocabulary: greedy decoding walks that cycle, no token
ever follows itself, and a dropped or repeated token (vLLM #42043) shifts the
stream visibly.

This module runs on both sides: the harness may compute expected streams with
it (pure Python), and the cell runner builds checkpoints with numpy.  It never
imports torch or vllm.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

BUILDER_VERSION = 1  # bump when the checkpoint layout changes: it keys the cache


def check_sizes(spec: Any, names: tuple[str, ...]) -> None:
    """ValueError unless every size ``names`` of a checkpoint spec is at least 1 and its ``seed`` not negative."""
    for name in names:
        if getattr(spec, name) < 1:
            raise ValueError(f"{name}={getattr(spec, name)}: must be at least 1")
    if spec.seed < 0:
        raise ValueError(f"seed={spec.seed}: must be >= 0")


@dataclass(frozen=True)
class BigramCycleSpec:
    """Parameters of a bigram-cycle checkpoint; the cache key is their hash."""

    vocab_size: int = 512
    hidden_size: int = 64
    # CPU attention backends need head_dim >= 32 (measured).
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    num_hidden_layers: int = 1
    intermediate_size: int = 128
    max_position_embeddings: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ValueError(f"vocab_size={self.vocab_size}: need at least 8 tokens")
        check_sizes(self, ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
                           "intermediate_size", "max_position_embeddings"))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not a multiple of "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.head_dim < 32:
            raise ValueError(
                f"head_dim={self.head_dim}: vLLM's CPU attention needs head_dim >= 32; "
                "raise hidden_size or lower num_attention_heads"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def key(self) -> str:
        payload = json.dumps(
            {"kind": "bigram-cycle", "builder": BUILDER_VERSION, **asdict(self)},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BigramCycleSpec:
        return cls(**data)


def cycle_permutation(vocab_size: int, seed: int) -> list[int]:
    """A permutation of range(vocab_size) that is one single cycle (no fixed points)."""
    order = list(range(vocab_size))
    random.Random(seed).shuffle(order)
    perm = [0] * vocab_size
    for i, tok in enumerate(order):
        perm[tok] = order[(i + 1) % vocab_size]
    return perm


def expected_continuation(perm: list[int], last_prompt_token: int, n: int) -> list[int]:
    """Greedy continuation of a bigram-cycle model: walk ``perm`` from the prompt's last token."""
    out: list[int] = []
    tok = last_prompt_token
    for _ in range(n):
        tok = perm[tok]
        out.append(tok)
    return out


# How far swap_partner looks for a seed; a random pair of cycles differs at every
# token with probability about 1/e, so a handful of seeds always suffices.
_PARTNER_SEARCH = 1000


def swap_partner(spec: BigramCycleSpec) -> BigramCycleSpec:
    """Checkpoint B of a weight-sync run whose checkpoint A is ``spec``.

    Same architecture and sizes (so vLLM can load it in place), the first seed
    after ``spec.seed`` whose cycle differs from A's at *every* token: whatever
    token a request holds when the weights are swapped, its next token tells
    which weights produced it.
    """
    perm_a = cycle_permutation(spec.vocab_size, spec.seed)
    for seed in range(spec.seed + 1, spec.seed + 1 + _PARTNER_SEARCH):
        perm_b = cycle_permutation(spec.vocab_size, seed)
        if all(a != b for a, b in zip(perm_a, perm_b, strict=True)):
            return replace(spec, seed=seed)
    raise ValueError(
        f"no seed in {spec.seed + 1}..{spec.seed + _PARTNER_SEARCH} gives a cycle that differs from seed "
        f"{spec.seed}'s at every token (vocab_size={spec.vocab_size}); use a larger vocab_size"
    )


def swapped_continuation(perm_a: list[int], perm_b: list[int], last_prompt_token: int, n_a: int, n: int) -> list[int]:
    """Greedy stream of ``n`` tokens when the weights change from A to B after ``n_a`` of them.

    The first ``n_a`` tokens walk ``perm_a`` from the prompt's last token; the
    rest walk ``perm_b`` from the last token produced so far, so token ``n_a``
    is ``perm_b[last pre-swap token]`` (``perm_b[last_prompt_token]`` when
    ``n_a`` is 0).
    """
    if len(perm_a) != len(perm_b):
        raise ValueError(f"permutations of different vocabularies: {len(perm_a)} and {len(perm_b)} tokens")
    if n_a < 0:
        raise ValueError(f"n_a={n_a}: must be >= 0")
    head = expected_continuation(perm_a, last_prompt_token, min(n_a, n))
    last = head[-1] if head else last_prompt_token
    return head + expected_continuation(perm_b, last, n - len(head))


def hf_config(spec: BigramCycleSpec) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 0,
        # Every run uses ignore_eos; an EOS id is still required by the config.
        "eos_token_id": 1,
        "attention_bias": False,
        "mlp_bias": False,
    }


def _weights(spec: BigramCycleSpec) -> dict[str, Any]:
    import numpy as np  # only the builder needs numpy

    rng = np.random.default_rng(spec.seed)
    h, v, inter = spec.hidden_size, spec.vocab_size, spec.intermediate_size
    kv = spec.num_key_value_heads * spec.head_dim
    emb = rng.standard_normal((v, h)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    perm = cycle_permutation(v, spec.seed)
    lm_head = np.zeros((v, h), dtype=np.float32)
    for t in range(v):
        lm_head[perm[t]] = emb[t]
    tensors: dict[str, Any] = {
        "model.embed_tokens.weight": emb,
        "model.norm.weight": np.ones(h, dtype=np.float32),
        "lm_head.weight": lm_head,
    }
    small = 0.02
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        # q/k/v/gate/up are random so the layers do real work; o_proj and
        # down_proj are zero so none of it reaches the residual stream.
        tensors[p + "self_attn.q_proj.weight"] = (rng.standard_normal((h, h)) * small).astype(np.float32)
        tensors[p + "self_attn.k_proj.weight"] = (rng.standard_normal((kv, h)) * small).astype(np.float32)
        tensors[p + "self_attn.v_proj.weight"] = (rng.standard_normal((kv, h)) * small).astype(np.float32)
        tensors[p + "self_attn.o_proj.weight"] = np.zeros((h, h), dtype=np.float32)
        tensors[p + "mlp.gate_proj.weight"] = (rng.standard_normal((inter, h)) * small).astype(np.float32)
        tensors[p + "mlp.up_proj.weight"] = (rng.standard_normal((inter, h)) * small).astype(np.float32)
        tensors[p + "mlp.down_proj.weight"] = np.zeros((h, inter), dtype=np.float32)
    return tensors


def write_safetensors(path: Path, tensors: dict[str, Any]) -> None:
    """Write float32 numpy arrays in the safetensors format (no safetensors dependency)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs: list[bytes] = []
    for name in sorted(tensors):
        arr = tensors[name]
        data = arr.astype("<f4", copy=False).tobytes(order="C")
        header[name] = {
            "dtype": "F32",
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format asks for 8-byte alignment
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


# safetensors dtype -> torch dtype attribute name (what vLLM's weight transfer takes).
_TORCH_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def safetensors_manifest(path: Path) -> list[tuple[str, str, list[int]]]:
    """(name, torch dtype name, shape) of every tensor in a safetensors file, sorted by name; reads the header only."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    out = []
    for name in sorted(k for k in header if k != "__metadata__"):
        meta = header[name]
        if meta["dtype"] not in _TORCH_DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {meta['dtype']}; known: {sorted(_TORCH_DTYPES)}")
        out.append((name, _TORCH_DTYPES[meta["dtype"]], list(meta["shape"])))
    return out


def read_safetensors(path: Path) -> dict[str, Any]:
    """Read a float32 safetensors file written by :func:`write_safetensors`."""
    import numpy as np

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        out[name] = np.frombuffer(body[start:end], dtype="<f4").reshape(meta["shape"])
    return out


def build_checkpoint(spec: BigramCycleSpec, cache_dir: Path) -> Path:
    """Build (or reuse) the checkpoint for ``spec`` under ``cache_dir``; return its folder."""
    target = cache_dir / f"bigram-cycle-{spec.key()}"
    if (target / "repro-model.json").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".tmp-{spec.key()}-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    write_safetensors(tmp / "model.safetensors", _weights(spec))
    (tmp / "config.json").write_text(json.dumps(hf_config(spec), indent=2))
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1, "do_sample": False})
    )
    perm = cycle_permutation(spec.vocab_size, spec.seed)
    # Written last: its presence marks a complete checkpoint.
    (tmp / "repro-model.json").write_text(
        json.dumps({"kind": "bigram-cycle", "spec": asdict(spec), "key": spec.key(), "perm": perm})
    )
    try:
        tmp.rename(target)
    except OSError:
        # Another process finished the same checkpoint first; keep theirs.
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_perm(model_dir: Path) -> list[int]:
    """The cycle permutation recorded beside a checkpoint built here."""
    return list(json.loads((Path(model_dir) / "repro-model.json").read_text())["perm"])
