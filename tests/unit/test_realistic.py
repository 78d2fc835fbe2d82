"""The random-weight Qwen3 checkpoint (repro.models.realistic), checked without vLLM: its spec, its files, and (slow)
that a numpy forward pass of its weights decodes varied streams a lost token would show in."""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.core.oracle import explanations
from repro.models.realistic import (
    SIZES,
    Qwen3RandomSpec,
    build_checkpoint,
    config,
    iter_tensors,
    tensor_shapes,
    tensor_std,
    to_bf16_bytes,
)
from repro.scenarios.vocab import make_prompts

TINY = Qwen3RandomSpec(vocab_size=256, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                       intermediate_size=96, num_hidden_layers=2)


def _header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


@pytest.mark.unit
def test_the_default_sizes_are_realistic() -> None:
    cpu, cuda = SIZES["cpu"], SIZES["cuda"]
    assert 10e6 < cpu.n_params < 100e6  # tens of millions on a CPU
    assert cuda.n_params > 500e6 and cuda.dtype == "bfloat16"
    for spec in (cpu, cuda):
        assert spec.head_dim == 128 and spec.num_attention_heads % spec.num_key_value_heads == 0
    # Qwen3-0.6B's shape, with an untied lm_head.
    assert (cuda.vocab_size, cuda.hidden_size, cuda.num_hidden_layers, cuda.intermediate_size) == (151936, 1024, 28,
                                                                                                    3072)


@pytest.mark.unit
@pytest.mark.parametrize(("field", "value", "says"), [
    ("vocab_size", 4, "at least 8"), ("num_key_value_heads", 3, "must divide"), ("dtype", "float16", "valid"),
    ("layer_mix", 9.0, "between"), ("seed", -1, ">= 0"), ("head_dim", 0, "at least 1"),
])
def test_a_bad_spec_is_refused(field: str, value: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        replace(TINY, **{field: value})


@pytest.mark.unit
def test_the_cache_key_covers_every_field() -> None:
    keys = {TINY.key()} | {replace(TINY, **{f: v}).key() for f, v in
                           (("seed", 1), ("layer_mix", 0.25), ("dtype", "bfloat16"), ("num_hidden_layers", 3))}
    assert len(keys) == 5 and TINY.key() == Qwen3RandomSpec.from_dict(asdict(TINY)).key()


@pytest.mark.unit
def test_the_tensors_are_the_ones_qwen3_loads() -> None:
    shapes = tensor_shapes(TINY)
    assert len(shapes) == 3 + 11 * TINY.num_hidden_layers
    cfg = config(TINY)
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["tie_word_embeddings"] is False
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (cfg["num_attention_heads"] * cfg["head_dim"],
                                                               cfg["hidden_size"])
    assert shapes["model.layers.1.self_attn.k_norm.weight"] == (cfg["head_dim"],)
    assert shapes["lm_head.weight"] == (cfg["vocab_size"], cfg["hidden_size"])


@pytest.mark.unit
def test_only_the_residual_writes_are_scaled() -> None:
    shapes = tensor_shapes(TINY)
    plain = tensor_std(TINY, "model.layers.0.self_attn.q_proj.weight", shapes["model.layers.0.self_attn.q_proj.weight"])
    assert plain == pytest.approx(TINY.hidden_size ** -0.5)
    o = tensor_std(TINY, "model.layers.0.self_attn.o_proj.weight", shapes["model.layers.0.self_attn.o_proj.weight"])
    assert o == pytest.approx(64 ** -0.5 * 0.5 / 2)  # layer_mix / sqrt(2 * layers), fan-in 2 heads x 32
    assert tensor_std(TINY, "model.norm.weight", (64,)) is None


@pytest.mark.unit
@pytest.mark.parametrize(("value", "bits"), [
    (1.0, 0x3F80), (-2.0, 0xC000), (1.0 + 2 ** -8, 0x3F80),  # halfway: to even
    (1.0 + 3 * 2 ** -8, 0x3F82), (1.0 + 2 ** -7 + 2 ** -9, 0x3F81),
])
def test_bfloat16_rounds_to_nearest_even(value: float, bits: int) -> None:
    assert to_bf16_bytes(np.array([value], dtype=np.float32)) == struct.pack("<H", bits)


@pytest.mark.unit
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_checkpoint_files_hold_every_tensor_in_its_dtype(tmp_path: Path, dtype: str) -> None:
    spec = replace(TINY, dtype=dtype)
    folder = build_checkpoint(spec, tmp_path)
    assert build_checkpoint(spec, tmp_path) == folder  # cached by key
    header = _header(folder / "model.safetensors")
    width = 4 if dtype == "float32" else 2
    shapes = tensor_shapes(spec)
    assert {k for k in header if k != "__metadata__"} == set(shapes)
    for name, shape in shapes.items():
        start, end = header[name]["data_offsets"]
        assert header[name]["shape"] == list(shape) and end - start == width * int(np.prod(shape))
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == dtype
    assert json.loads((folder / "repro-model.json").read_text())["n_params"] == spec.n_params
    if dtype == "float32":
        with open(folder / "model.safetensors", "rb") as f:
            raw = f.read()
        body = raw[8 + struct.unpack("<Q", raw[:8])[0]:]
        for name, arr in iter_tensors(spec):
            start, end = header[name]["data_offsets"]
            assert np.array_equal(np.frombuffer(body[start:end], "<f4").reshape(arr.shape), arr)


# --------------------------------------------------------------------------- decoding, in numpy


def _rms(x: Any, w: Any) -> Any:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def _rope(x: Any, pos: int) -> Any:
    d = x.shape[-1]
    ang = pos * 1e6 ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(np.concatenate([ang, ang])), np.sin(np.concatenate([ang, ang]))
    return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1) * sin


def _layer(spec: Qwen3RandomSpec, w: dict[str, Any], p: str, x: Any, pos: int, cache: list[list[Any]]) -> Any:
    heads, kvh, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    h = _rms(x, w[p + "input_layernorm.weight"])
    q = _rope(_rms((w[p + "self_attn.q_proj.weight"] @ h).reshape(heads, d), w[p + "self_attn.q_norm.weight"]), pos)
    k = _rope(_rms((w[p + "self_attn.k_proj.weight"] @ h).reshape(kvh, d), w[p + "self_attn.k_norm.weight"]), pos)
    cache[0].append(k)
    cache[1].append((w[p + "self_attn.v_proj.weight"] @ h).reshape(kvh, d))
    keys, values = np.stack(cache[0], 1), np.stack(cache[1], 1)
    out = []
    for i in range(heads):
        s = keys[i // (heads // kvh)] @ q[i] / np.sqrt(d)
        s = np.exp(s - s.max())
        out.append((s / s.sum()) @ values[i // (heads // kvh)])
    x = x + w[p + "self_attn.o_proj.weight"] @ np.concatenate(out)
    h = _rms(x, w[p + "post_attention_layernorm.weight"])
    g = w[p + "mlp.gate_proj.weight"] @ h
    return x + w[p + "mlp.down_proj.weight"] @ (g / (1 + np.exp(-g)) * (w[p + "mlp.up_proj.weight"] @ h))


def greedy(spec: Qwen3RandomSpec, w: dict[str, Any], prompt: list[int], n: int) -> list[int]:
    """Qwen3's forward pass (RMSNorm, q/k norms, RoPE, GQA, SiLU MLP, untied lm_head), decoding greedily."""
    caches: list[list[list[Any]]] = [[[], []] for _ in range(spec.num_hidden_layers)]
    toks = list(prompt)
    for pos in range(len(prompt) + n - 1):
        x = w["model.embed_tokens.weight"][toks[pos]].astype(np.float64)
        for i in range(spec.num_hidden_layers):
            x = _layer(spec, w, f"model.layers.{i}.", x, pos, caches[i])
        if pos + 1 == len(toks):
            toks.append(int(np.argmax(w["lm_head.weight"] @ _rms(x, w["model.norm.weight"]))))
    return toks[len(prompt):]


@pytest.mark.slow
def test_greedy_streams_are_varied_enough_to_show_a_lost_token() -> None:
    """The scaled init's point: of 10 streams of 56 tokens, none is one whose shift at the pause would hide.

    A smaller vocabulary than the CPU default's (2048, not 32768) makes loops likelier than in the real runs,
    and 2 layers keep it to seconds; the rest is the real shape (128-wide heads, GQA, the same init).
    """
    spec = replace(SIZES["cpu"], vocab_size=2048, hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                   intermediate_size=512, num_hidden_layers=2)
    w = dict(iter_tensors(spec))
    streams = [greedy(spec, w, p, 56) for p in make_prompts(10, 6, spec.vocab_size, 0)]
    assert all(explanations(s, s[:48], [8]) == {"OK"} for s in streams)
    assert sum(len(set(s)) for s in streams) > 0.8 * 560  # mostly distinct tokens
    # The layers do real work: with their writes to the residual stream switched off, the stream changes.
    silent = replace(spec, layer_mix=0.0)
    assert greedy(silent, dict(iter_tensors(silent)), [5], 20) != greedy(spec, w, [5], 20)
