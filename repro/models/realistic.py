"""A random-weight checkpoint of a real architecture and shape: the second built-in model (``qwen3-random``).

The bigram-cycle model (``repro.models.deterministic``) makes every token predictable, but
its layers do nothing.  This one is a Qwen3 checkpoint (``Qwen3ForCausalLM``:
q/k norms, GQA, 128-wide heads, SiLU MLP, RoPE) whose every layer does real
work, built locally from a seed (no hub; repro.models.kinds adds the word-level
tokenizer of repro.models.tokenizer), so the path a user's model takes through vLLM
(its model class, its attention backend, its dtype, its numerics) is exercised
without hub access.

Greedy decoding of a random transformer often falls into repetition loops,
where a lost token cannot be seen.  The init is scaled so that the streams are
varied instead:

* ``lm_head`` is untied (as in Qwen3-8B) and random, so the next token is a
  random function of the residual stream rather than the current token again
  (tied embeddings make ``x -> x`` the arg-max);
* the residual stream is led by the current token's embedding: the layers'
  outputs (``o_proj``, ``down_proj``) are scaled so that together they add
  ``layer_mix`` of the embedding's norm, enough for the context to change
  many next tokens, too little to wash the token's identity out.

Decoding then walks something like a random mapping over the vocabulary,
whose paths run about sqrt(pi * V / 2) tokens before they revisit one.  The
oracle still checks every stream (``harness.core.oracle``: AMBIGUOUS where repeats
hide a shift), and the engine's reference is its own no-pause run.

Runs on both sides like ``repro.models.deterministic``: the spec is pure Python, the builder
needs numpy only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

KIND = "qwen3-random"
BUILDER_VERSION = 1  # bump when the weights or config change: it keys the cache
DTYPES = {"float32": "F32", "bfloat16": "BF16"}


@dataclass(frozen=True)
class Qwen3RandomSpec:
    """Shape and init of a random Qwen3 checkpoint; the cache key is their hash.

    The default is the CPU size (46.1M parameters, 16.8M of them in the untied head); :data:`SIZES` has the GPU
    one (Qwen3-0.6B's shape, ~0.6B parameters, bfloat16).
    """

    vocab_size: int = 32768
    hidden_size: int = 512
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 128  # Qwen3's (and most current models') head size
    intermediate_size: int = 1536
    num_hidden_layers: int = 4
    max_position_embeddings: int = 40960  # Qwen3-0.6B's
    dtype: str = "float32"
    layer_mix: float = 0.5  # the layers' summed output, relative to the embedding's norm
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "num_hidden_layers", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be at least 1")
        if self.vocab_size < 8:
            raise ValueError(f"vocab_size={self.vocab_size}: need at least 8 tokens")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads={self.num_key_value_heads} must divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}; valid: {', '.join(DTYPES)}")
        if not 0 <= self.layer_mix <= 4:
            raise ValueError(f"layer_mix={self.layer_mix}: must be between 0 and 4")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed}: must be >= 0")

    def key(self) -> str:
        payload = json.dumps({"kind": KIND, "builder": BUILDER_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def n_params(self) -> int:
        return sum(_count(shape) for shape in tensor_shapes(self).values())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Qwen3RandomSpec:
        return cls(**data)


# The size each platform gets by default: tens of millions of parameters on a
# CPU, Qwen3-0.6B's shape in bfloat16 on a GPU.
SIZES: dict[str, Qwen3RandomSpec] = {
    "cpu": Qwen3RandomSpec(),
    "cuda": Qwen3RandomSpec(vocab_size=151936, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                            intermediate_size=3072, num_hidden_layers=28, dtype="bfloat16"),
}


def spec_for(platform: str, **overrides: Any) -> Qwen3RandomSpec:
    """The default spec of ``platform`` with ``overrides`` (ValueError on an unknown field or bad value)."""
    return replace(SIZES.get(platform, SIZES["cpu"]), **overrides)


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def config(spec: Qwen3RandomSpec) -> dict[str, Any]:
    """The Hugging Face ``config.json`` (Qwen3-0.6B's fields, this spec's sizes)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.num_hidden_layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": spec.dtype,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": 0,
        # Every run uses ignore_eos; an EOS id is still required by the config.
        "eos_token_id": 1,
    }


def tensor_shapes(spec: Qwen3RandomSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint and its shape, as vLLM's and transformers' Qwen3 name them."""
    h, q, kv, inter = (spec.hidden_size, spec.num_attention_heads * spec.head_dim,
                       spec.num_key_value_heads * spec.head_dim, spec.intermediate_size)
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (spec.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (spec.vocab_size, h),
    }
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (spec.head_dim,), p + "self_attn.k_norm.weight": (spec.head_dim,),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    return shapes


def tensor_std(spec: Qwen3RandomSpec, name: str, shape: tuple[int, ...]) -> float | None:
    """The normal init's standard deviation of tensor ``name`` (None: a norm weight, all ones).

    Inputs to every projection are RMS-normalised (unit scale per element), so
    std 1/sqrt(fan_in) keeps outputs at unit scale; the two projections that
    write into the residual stream are scaled by ``layer_mix / sqrt(2 * layers)``
    so that all 2 * layers of them add up to ``layer_mix`` of the embedding.
    The MLP's SiLU(gate) * up has about half the scale of its inputs, hence the 2.
    """
    if len(shape) == 1:
        return None
    fan_in = shape[1]
    if name == "model.embed_tokens.weight":
        return 1.0
    base = fan_in ** -0.5
    writes = spec.layer_mix / (2 * spec.num_hidden_layers) ** 0.5
    if name.endswith("self_attn.o_proj.weight"):
        return base * writes
    if name.endswith("mlp.down_proj.weight"):
        return base * writes * 2.0
    return base


def _tensor(spec: Qwen3RandomSpec, name: str, shape: tuple[int, ...]) -> Any:
    import numpy as np  # only the builder needs numpy

    std = tensor_std(spec, name, shape)
    if std is None:
        return np.ones(shape, dtype=np.float32)
    # One generator per tensor, seeded by (seed, name): the weights do not depend on the order they are built in.
    rng = np.random.default_rng([spec.seed, zlib.crc32(name.encode())])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def to_bf16_bytes(arr: Any) -> bytes:
    """bfloat16 bytes of a float32 array, rounded to nearest even (numpy has no bfloat16)."""
    import numpy as np

    u = np.ascontiguousarray(arr, dtype="<f4").view("<u4")
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype("<u2").tobytes()


def _encode(arr: Any, st_dtype: str) -> bytes:
    if st_dtype == "BF16":
        return to_bf16_bytes(arr)
    return bytes(arr.astype("<f4", copy=False).tobytes(order="C"))


def write_streamed(path: Path, shapes: dict[str, tuple[int, ...]], make: Callable[[str], Any], st_dtype: str) -> None:
    """A safetensors file of ``shapes`` (every tensor ``st_dtype``), each tensor made and written one at a time.

    The header is known from the shapes, so a checkpoint larger than memory
    allows in float32 (the GPU size) never needs to be held whole.
    """
    width = {"F32": 4, "BF16": 2}[st_dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(shapes):
        size = _count(shapes[name]) * width
        header[name] = {"dtype": st_dtype, "shape": list(shapes[name]), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format asks for 8-byte alignment
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in sorted(shapes):
            f.write(_encode(make(name), st_dtype))


def build_checkpoint(spec: Qwen3RandomSpec, cache_dir: Path) -> Path:
    """Build (or reuse) the checkpoint for ``spec`` under ``cache_dir``; return its folder."""
    target = cache_dir / f"{KIND}-{spec.key()}"
    if (target / "repro-model.json").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".tmp-{spec.key()}-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    shapes = tensor_shapes(spec)
    write_streamed(tmp / "model.safetensors", shapes, lambda n: _tensor(spec, n, shapes[n]), DTYPES[spec.dtype])
    (tmp / "config.json").write_text(json.dumps(config(spec), indent=2))
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}))
    # Written last: its presence marks a complete checkpoint.
    (tmp / "repro-model.json").write_text(json.dumps(
        {"kind": KIND, "spec": asdict(spec), "key": spec.key(), "n_params": spec.n_params}))
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same checkpoint first
    return target


def iter_tensors(spec: Qwen3RandomSpec) -> Iterator[tuple[str, Any]]:
    """(name, float32 array) of every tensor, as the builder makes them (tests run a numpy forward on them)."""
    shapes = tensor_shapes(spec)
    for name in sorted(shapes):
        yield name, _tensor(spec, name, shapes[name])
