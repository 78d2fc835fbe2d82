"""The bigram-cycle checkpoint (repro.models.deterministic), checked numerically without vLLM.

The central test reads the written safetensors back and runs a numpy forward
pass of the Llama architecture (RMSNorm, q/k/v with RoPE and GQA, causal
softmax attention, SiLU-gated MLP, final norm, lm_head): greedy decoding must
walk ``perm`` with a logit margin wide enough that float noise in a real
engine cannot change the arg-max.
"""

from __future__ import annotations

import itertools
import json
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import repro.models.deterministic as models
from repro.models.deterministic import (
    BigramCycleSpec,
    build_checkpoint,
    cycle_permutation,
    expected_continuation,
    load_perm,
    read_safetensors,
    safetensors_manifest,
    swap_partner,
    swapped_continuation,
    write_safetensors,
)
from repro.scenarios.vocab import make_prompts

pytestmark = pytest.mark.unit

SPECS = {
    "default": BigramCycleSpec(),
    "vocab600-seed7": BigramCycleSpec(vocab_size=600, seed=7),
    "gqa-2layers": BigramCycleSpec(
        vocab_size=256,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=96,
        seed=3,
    ),
}


# --------------------------------------------------------------------------- permutation


@given(st.integers(8, 600), st.integers(0, 2**32 - 1))
def test_cycle_permutation_is_one_cycle_without_fixed_points(v: int, seed: int) -> None:
    perm = cycle_permutation(v, seed)
    assert sorted(perm) == list(range(v))
    assert all(perm[t] != t for t in range(v))
    # Walking from 0 visits every token once and is back at 0 after exactly v steps.
    seen, t = [], 0
    for _ in range(v):
        seen.append(t)
        t = perm[t]
    assert t == 0
    assert len(set(seen)) == v
    assert cycle_permutation(v, seed) == perm  # deterministic


@given(st.integers(8, 300), st.integers(0, 2**16), st.data())
def test_expected_continuation_never_repeats_within_the_vocab(v: int, seed: int, data: st.DataObject) -> None:
    perm = cycle_permutation(v, seed)
    start = data.draw(st.integers(0, v - 1), label="start")
    out = expected_continuation(perm, start, 2 * v)
    assert len(out) == 2 * v
    assert out[0] == perm[start]
    walk = [start, *out]
    assert all(a != b for a, b in itertools.pairwise(walk))
    for j in range(v + 1):
        assert len(set(walk[j : j + v])) == v  # any v consecutive tokens are distinct
    assert out[v:] == out[:v]  # and the walk has period exactly v
    assert expected_continuation(perm, start, 0) == []


# --------------------------------------------------------------------------- spec


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4}, "head_dim=16"),
        ({"hidden_size": 32, "num_attention_heads": 2}, "head_dim=16"),
        ({"hidden_size": 65, "num_attention_heads": 2}, "not a multiple"),
        ({"vocab_size": 7}, "vocab_size=7"),
        ({"vocab_size": 0}, "vocab_size=0"),
    ],
)
def test_spec_rejects_bad_sizes(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BigramCycleSpec(**kwargs)


@given(st.integers(1, 512), st.integers(1, 16), st.integers(1, 1024))
def test_spec_accepts_exactly_divisible_head_dims_of_at_least_32(hidden: int, heads: int, vocab: int) -> None:
    ok = vocab >= 8 and hidden % heads == 0 and hidden // heads >= 32
    try:
        spec = BigramCycleSpec(
            vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads
        )
    except ValueError:
        assert not ok
    else:
        assert ok
        assert spec.head_dim == hidden // heads >= 32


def test_spec_key_is_a_stable_hash_of_the_fields() -> None:
    a, b = BigramCycleSpec(), BigramCycleSpec()
    assert a.key() == b.key()
    assert len(a.key()) == 16
    assert BigramCycleSpec(seed=1).key() != a.key()
    assert BigramCycleSpec(vocab_size=513).key() != a.key()
    assert BigramCycleSpec.from_dict(json.loads(json.dumps(a.__dict__))) == a


# --------------------------------------------------------------------------- checkpoint files


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cache = tmp_path_factory.mktemp("model-cache")
    return {name: build_checkpoint(spec, cache) for name, spec in SPECS.items()}


def test_build_writes_a_complete_checkpoint(built: dict[str, Path]) -> None:
    spec, d = SPECS["default"], built["default"]
    assert d.name == f"bigram-cycle-{spec.key()}"
    for f in ("config.json", "model.safetensors", "repro-model.json", "generation_config.json"):
        assert (d / f).is_file(), f
    assert not list(d.parent.glob(".tmp-*"))
    meta = json.loads((d / "repro-model.json").read_text())
    assert meta["kind"] == "bigram-cycle"
    assert meta["key"] == spec.key()
    assert BigramCycleSpec.from_dict(meta["spec"]) == spec
    assert meta["perm"] == cycle_permutation(spec.vocab_size, spec.seed) == load_perm(d)
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["do_sample"] is False


@pytest.mark.parametrize("name", list(SPECS))
def test_config_is_a_llama_the_engine_can_run(built: dict[str, Path], name: str) -> None:
    spec = SPECS[name]
    cfg = json.loads((built[name] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert cfg["tie_word_embeddings"] is False
    assert cfg["head_dim"] >= 32
    assert cfg["head_dim"] * cfg["num_attention_heads"] == cfg["hidden_size"] == spec.hidden_size
    assert cfg["vocab_size"] == spec.vocab_size
    assert cfg["num_hidden_layers"] == spec.num_hidden_layers
    assert cfg["num_key_value_heads"] == spec.num_key_value_heads
    assert cfg["intermediate_size"] == spec.intermediate_size
    assert cfg["hidden_act"] == "silu"
    assert 0 < cfg["rms_norm_eps"] < 1e-3
    assert cfg["torch_dtype"] == "float32"


def test_build_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = BigramCycleSpec(vocab_size=64)
    first = build_checkpoint(spec, tmp_path)
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}

    def no_rebuild(*_: Any) -> None:
        raise AssertionError("a cached checkpoint was rebuilt")

    monkeypatch.setattr(models, "_weights", no_rebuild)
    second = build_checkpoint(spec, tmp_path)
    assert second == first
    assert {p.name: p.stat().st_mtime_ns for p in second.iterdir()} == mtimes
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]
    monkeypatch.undo()

    other = build_checkpoint(BigramCycleSpec(vocab_size=64, seed=1), tmp_path)
    assert other != first
    assert other.parent == tmp_path
    assert load_perm(other) != load_perm(first)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])


def test_safetensors_layout(built: dict[str, Path]) -> None:
    spec, path = SPECS["default"], built["default"] / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    h, v, i, kv = (
        spec.hidden_size,
        spec.vocab_size,
        spec.intermediate_size,
        spec.num_key_value_heads * spec.head_dim,
    )
    shapes = {
        "model.embed_tokens.weight": [v, h],
        "model.norm.weight": [h],
        "lm_head.weight": [v, h],
        "model.layers.0.input_layernorm.weight": [h],
        "model.layers.0.post_attention_layernorm.weight": [h],
        "model.layers.0.self_attn.q_proj.weight": [h, h],
        "model.layers.0.self_attn.k_proj.weight": [kv, h],
        "model.layers.0.self_attn.v_proj.weight": [kv, h],
        "model.layers.0.self_attn.o_proj.weight": [h, h],
        "model.layers.0.mlp.gate_proj.weight": [i, h],
        "model.layers.0.mlp.up_proj.weight": [i, h],
        "model.layers.0.mlp.down_proj.weight": [h, i],
    }
    assert {k: m["shape"] for k, m in header.items()} == shapes
    assert {m["dtype"] for m in header.values()} == {"F32"}
    spans = sorted(tuple(m["data_offsets"]) for m in header.values())
    assert spans[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # contiguous
    assert len(raw) == 8 + n + spans[-1][1]


# Fewer examples: each one writes and reads a safetensors file.
@settings(max_examples=min(30, settings.default.max_examples))
@given(
    st.dictionaries(
        st.from_regex(r"\A[a-z][a-z0-9_.]{0,20}\Z"),
        hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5)),
        min_size=1,
        max_size=4,
    )
)
def test_safetensors_round_trip(tensors: dict[str, np.ndarray]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.safetensors"
        write_safetensors(path, tensors)
        back = read_safetensors(path)
    assert set(back) == set(tensors)
    for k, a in tensors.items():
        assert back[k].dtype == np.dtype("<f4")
        np.testing.assert_array_equal(back[k], a)


# --------------------------------------------------------------------------- numpy forward pass


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * weight).astype(np.float32)


def rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Llama (neox-style) rotary embedding of x: (batch, seq, heads, head_dim)."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(x.shape[1])[:, None] * inv[None, :]  # (seq, hd/2)
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[None, :, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[None, :, None, :]
    rot = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], axis=-1)
    return (x * cos + rot * sin).astype(np.float32)


def llama_forward(w: dict[str, np.ndarray], cfg: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
    """Logits for every position of ids (batch, seq); also what each layer computed."""
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    b, t = ids.shape
    x = w["model.embed_tokens.weight"][ids]  # (b, t, h)
    layers = []
    for li in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{li}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = rope((a @ w[p + "self_attn.q_proj.weight"].T).reshape(b, t, nh, hd), theta)
        k = rope((a @ w[p + "self_attn.k_proj.weight"].T).reshape(b, t, nkv, hd), theta)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(b, t, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=2), np.repeat(v, nh // nkv, axis=2)
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
        scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        heads = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, nh * hd).astype(np.float32)
        attn_out = heads @ w[p + "self_attn.o_proj.weight"].T
        x = x + attn_out
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = m @ w[p + "mlp.gate_proj.weight"].T
        act = gate / (1.0 + np.exp(-gate)) * (m @ w[p + "mlp.up_proj.weight"].T)
        mlp_out = act @ w[p + "mlp.down_proj.weight"].T
        x = x + mlp_out
        layers.append({"heads": heads, "attn_out": attn_out, "act": act, "mlp_out": mlp_out})
    final = rms_norm(x, w["model.norm.weight"], eps)
    return {"logits": final @ w["lm_head.weight"].T, "residual": x, "layers": layers}


def load(d: Path) -> tuple[dict[str, np.ndarray], dict[str, Any], list[int]]:
    return (
        read_safetensors(d / "model.safetensors"),
        json.loads((d / "config.json").read_text()),
        load_perm(d),
    )


@pytest.mark.parametrize("name", list(SPECS))
def test_every_token_is_followed_by_its_successor_with_a_wide_margin(
    built: dict[str, Path], name: str
) -> None:
    w, cfg, perm = load(built[name])
    v = cfg["vocab_size"]
    for li in range(cfg["num_hidden_layers"]):
        assert not np.any(w[f"model.layers.{li}.self_attn.o_proj.weight"])
        assert not np.any(w[f"model.layers.{li}.mlp.down_proj.weight"])
    ids = np.arange(v)[:, None]  # every token, each as a one-token sequence
    out = llama_forward(w, cfg, ids)
    for layer in out["layers"]:
        # The layers do real work, but none of it reaches the residual stream.
        assert np.any(layer["heads"]) and np.any(layer["act"])
        assert np.all(layer["attn_out"] == 0) and np.all(layer["mlp_out"] == 0)
    np.testing.assert_array_equal(out["residual"][:, 0], w["model.embed_tokens.weight"])
    logits = out["logits"][:, 0]  # (v, v)
    np.testing.assert_array_equal(np.argmax(logits, axis=1), np.array(perm))
    top2 = np.sort(logits, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    assert margin.min() > 1.0, f"smallest top-1/top-2 logit margin {margin.min():.3f}"


def test_greedy_decoding_of_whole_sequences_walks_the_cycle(built: dict[str, Path]) -> None:
    """Causal attention over a real prompt changes nothing: each step's arg-max is perm[last token]."""
    w, cfg, perm = load(built["gqa-2layers"])
    prompts = make_prompts(4, 6, cfg["vocab_size"], seed=11)
    ids = np.array(prompts)
    steps = 12
    for _ in range(steps):
        nxt = np.argmax(llama_forward(w, cfg, ids)["logits"][:, -1], axis=-1)
        ids = np.concatenate([ids, nxt[:, None]], axis=1)
    for p, row in zip(prompts, ids, strict=True):
        assert row[len(p) :].tolist() == expected_continuation(perm, p[-1], steps)


def test_forward_pass_would_notice_a_nonzero_o_proj(built: dict[str, Path]) -> None:
    """Sanity check of the check: with a large o_proj the residual is no longer the embedding."""
    w, cfg, perm = load(built["default"])
    w = dict(w)
    w["model.layers.0.self_attn.o_proj.weight"] = np.eye(cfg["hidden_size"], dtype=np.float32) * 50
    out = llama_forward(w, cfg, np.arange(cfg["vocab_size"])[:, None])
    assert np.any(out["layers"][0]["attn_out"] != 0)
    assert not np.array_equal(np.argmax(out["logits"][:, 0], axis=1), np.array(perm))


def test_make_prompts_are_distinct_and_avoid_special_tokens() -> None:
    prompts = make_prompts(20, 3, 16, seed=5)
    assert len(prompts) == 20
    assert len({tuple(p) for p in prompts}) == 20
    assert all(len(p) == 3 and all(2 <= t < 16 for t in p) for p in prompts)
    assert make_prompts(20, 3, 16, seed=5) == prompts


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_attention_heads": 0}, "num_attention_heads=0"),
        ({"num_key_value_heads": 3}, "must divide"),
        ({"intermediate_size": 0}, "intermediate_size=0"),
        ({"seed": -1}, "seed=-1"),
    ],
)
def test_spec_rejects_values_vllm_or_numpy_would_choke_on(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BigramCycleSpec(**kwargs)


# --------------------------------------------------------------------------- weight-sync partner (checkpoint B)


@given(st.integers(8, 600), st.integers(0, 2**16))
def test_swap_partner_is_the_first_later_seed_whose_cycle_differs_everywhere(v: int, seed: int) -> None:
    spec = BigramCycleSpec(vocab_size=v, seed=seed)
    b = swap_partner(spec)
    assert b == BigramCycleSpec(vocab_size=v, seed=b.seed)  # same shape: loadable in place of A
    pa, pb = cycle_permutation(v, seed), cycle_permutation(v, b.seed)
    assert all(x != y for x, y in zip(pa, pb, strict=True))
    for s in range(seed + 1, b.seed):  # and no earlier seed would do
        assert any(x == y for x, y in zip(pa, cycle_permutation(v, s), strict=True))
    assert b.key() != spec.key()
    assert swap_partner(spec) == b


def test_swap_partner_of_the_default_checkpoint(tmp_path: Path) -> None:
    a = BigramCycleSpec()
    b = swap_partner(a)
    assert (b.seed, b.vocab_size, b.hidden_size) == (1, a.vocab_size, a.hidden_size)
    da, db = build_checkpoint(a, tmp_path), build_checkpoint(b, tmp_path)
    assert da != db
    assert all(x != y for x, y in zip(load_perm(da), load_perm(db), strict=True))


@given(st.integers(8, 200), st.integers(0, 2**16), st.data())
def test_swapped_continuation_walks_a_then_b(v: int, seed: int, data: st.DataObject) -> None:
    pa, pb = cycle_permutation(v, seed), cycle_permutation(v, seed + 1)
    start = data.draw(st.integers(0, v - 1))
    n = data.draw(st.integers(0, 60))
    n_a = data.draw(st.integers(0, 70))
    out = swapped_continuation(pa, pb, start, n_a, n)
    assert len(out) == n
    k = min(n_a, n)
    assert out[:k] == expected_continuation(pa, start, k)
    assert out[k:] == expected_continuation(pb, out[k - 1] if k else start, n - k)
    assert swapped_continuation(pa, pb, start, 0, n) == expected_continuation(pb, start, n)
    assert swapped_continuation(pa, pb, start, n, n) == expected_continuation(pa, start, n)


def test_swapped_continuation_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="different vocabularies: 8 and 9"):
        swapped_continuation(cycle_permutation(8, 0), cycle_permutation(9, 0), 1, 2, 4)
    with pytest.raises(ValueError, match="n_a=-1"):
        swapped_continuation(cycle_permutation(8, 0), cycle_permutation(8, 1), 1, -1, 4)


def test_manifest_lists_every_tensor_of_the_checkpoint_in_name_order(built: dict[str, Path]) -> None:
    path = built["gqa-2layers"] / "model.safetensors"
    manifest = safetensors_manifest(path)
    tensors = read_safetensors(path)
    assert [m[0] for m in manifest] == sorted(tensors)
    assert all(dtype == "float32" and shape == list(tensors[name].shape) for name, dtype, shape in manifest)


def test_manifest_refuses_a_dtype_it_cannot_name(tmp_path: Path) -> None:
    raw = json.dumps({"x": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))
    with pytest.raises(ValueError, match="tensor x has dtype I64"):
        safetensors_manifest(path)
