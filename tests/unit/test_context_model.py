"""The context-cell checkpoint pair (repro.models.context_cell), checked numerically without vLLM.

A numpy decoder runs the written checkpoints the way vLLM does with a KV cache (RMSNorm, q/k/v with RoPE,
causal softmax over the cached keys, o_proj, the MLP, final norm, lm_head), and can plant KV written by
the other version's weights in the first positions: a prefix-cache hit across a weight update.  Greedy
decoding must follow the oracle in every case, with a logit margin far above fp32 and bf16 noise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from repro.models import context_cell as cm
from repro.models.context_cell import ContextCellSpec, expected_continuation, marker, plain
from repro.models.deterministic import read_safetensors

pytestmark = pytest.mark.unit

SPEC = ContextCellSpec()
BLOCK = 16  # vLLM's CPU block size; the stale part of a prefix hit is whole blocks
# Smallest top-1/top-2 logit gap the tests accept (the design gives ~18; bf16 noise is ~0.1).
MIN_MARGIN = 10.0


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even) and back."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def rope(x: np.ndarray, pos: np.ndarray, theta: float, neox: bool) -> np.ndarray:
    """Rotary embedding of x (seq, heads, head_dim) at positions pos, in vLLM's neox or GPT-J layout."""
    hd = x.shape[-1]
    ang = pos[:, None] * (1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = (x[..., : hd // 2], x[..., hd // 2 :]) if neox else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * cos - b * sin, b * cos + a * sin
    out = np.concatenate([ra, rb], axis=-1) if neox else np.stack([ra, rb], axis=-1).reshape(x.shape)
    return out.astype(np.float32)


@dataclass
class Decoder:
    """Greedy decoding of one request with a KV cache whose first ``stale`` positions another version wrote."""

    w: dict[str, dict[str, np.ndarray]]  # version -> tensors
    cfg: dict[str, Any]
    neox: bool = True
    half: bool = False  # bf16 weights and activations

    def t(self, version: str, name: str) -> np.ndarray:
        x = self.w[version][name]
        return bf16(x) if self.half else x

    def r(self, x: np.ndarray) -> np.ndarray:
        return bf16(x) if self.half else x.astype(np.float32)

    def norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        x64 = x.astype(np.float64)
        return self.r(x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.cfg["rms_norm_eps"]) * weight)

    def heads(self, version: str, name: str, a: np.ndarray, pos: np.ndarray, rotate: bool) -> np.ndarray:
        nh, hd = self.cfg["num_attention_heads"], self.cfg["head_dim"]
        x = self.r(a @ self.t(version, f"model.layers.0.self_attn.{name}.weight").T).reshape(len(pos), nh, hd)
        return self.r(rope(x, pos, self.cfg["rope_theta"], self.neox)) if rotate else x

    def kv(self, version: str, ids: list[int], start: int) -> tuple[np.ndarray, np.ndarray]:
        pos = np.arange(start, start + len(ids))
        a = self.norm(self.t(version, "model.embed_tokens.weight")[ids],
                      self.t(version, "model.layers.0.input_layernorm.weight"))
        return self.heads(version, "k_proj", a, pos, True), self.heads(version, "v_proj", a, pos, False)

    def step(self, version: str, ids: list[int], keys: np.ndarray, values: np.ndarray) -> dict[str, Any]:
        """Logits after ids[-1], whose own K/V are the last rows of keys/values."""
        p, hd = "model.layers.0.", self.cfg["head_dim"]
        x = self.t(version, "model.embed_tokens.weight")[ids[-1:]]
        a = self.norm(x, self.t(version, p + "input_layernorm.weight"))
        q = self.heads(version, "q_proj", a, np.array([len(ids) - 1]), True)[0]  # (heads, hd)
        scores = np.einsum("hd,khd->hk", q, keys).astype(np.float64) / np.sqrt(hd)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = self.r(np.einsum("hk,khd->hd", probs, values).reshape(1, -1))
        x = self.r(x + attn @ self.t(version, p + "self_attn.o_proj.weight").T)
        m = self.norm(x, self.t(version, p + "post_attention_layernorm.weight"))
        gate = m @ self.t(version, p + "mlp.gate_proj.weight").T
        act = gate / (1.0 + np.exp(-gate)) * (m @ self.t(version, p + "mlp.up_proj.weight").T)
        x = self.r(x + act @ self.t(version, p + "mlp.down_proj.weight").T)
        logits = self.norm(x, self.t(version, "model.norm.weight")) @ self.t(version, "lm_head.weight").T
        return {"logits": logits[0].astype(np.float64), "probs": probs}

    def decode(self, version: str, prompt: list[int], n: int, stale: int = 0,
               stale_version: str | None = None) -> tuple[list[int], float, float]:
        """(tokens, smallest top-1/top-2 margin, smallest attention weight head 0 put on position 0)."""
        k0, v0 = self.kv(stale_version or version, prompt[:stale], 0)
        k1, v1 = self.kv(version, prompt[stale:], stale)
        keys, values = np.concatenate([k0, k1]), np.concatenate([v0, v1])
        ids, out, margin, on_first = list(prompt), [], np.inf, 1.0
        for _ in range(n):
            res = self.step(version, ids, keys, values)
            top2 = np.sort(res["logits"])[-2:]
            margin, on_first = min(margin, top2[1] - top2[0]), min(on_first, res["probs"][0, 0])
            tok = int(np.argmax(res["logits"]))
            out.append(tok)
            ids.append(tok)
            k, v = self.kv(version, [tok], len(ids) - 1)
            keys, values = np.concatenate([keys, k]), np.concatenate([values, v])
        return out, float(margin), float(on_first)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cache = tmp_path_factory.mktemp("ctx-cache")
    return {v: cm.build_checkpoint(SPEC, v, cache) for v in cm.VERSIONS}


@pytest.fixture(scope="module")
def tensors(built: dict[str, Path]) -> dict[str, dict[str, np.ndarray]]:
    return {v: read_safetensors(d / "model.safetensors") for v, d in built.items()}


def decoder(built: dict[str, Path], tensors: dict[str, dict[str, np.ndarray]], **kw: Any) -> Decoder:
    return Decoder(tensors, json.loads((built["A"] / "config.json").read_text()), **kw)


def prompt(m: int, length: int, seed: int = 0) -> list[int]:
    """Marker m at position 0, then random plain tokens (a system prompt and a question)."""
    rng = np.random.default_rng(seed)
    return [marker(SPEC, m)] + [plain(SPEC, int(r), int(c)) for r, c in
                                zip(rng.integers(0, SPEC.rows, length - 1), rng.integers(0, SPEC.contexts, length - 1),
                                    strict=True)]


# --------------------------------------------------------------------------- oracle (pure Python)


@pytest.mark.parametrize("m", range(SPEC.contexts))
def test_a_b_and_a_stale_read_differ_at_every_token(m: int) -> None:
    p = prompt(m, 40, seed=m)
    n = SPEC.rows + 5
    fresh_a = expected_continuation(SPEC, "A", p, n)
    fresh_b = expected_continuation(SPEC, "B", p, n)
    stale = expected_continuation(SPEC, "B", p, n, stale_prefix_tokens=BLOCK, stale_version="A")
    for a, b, s in zip(fresh_a, fresh_b, stale, strict=True):
        assert len({a, b, s}) == 3
    # Rows walk one cycle: no token repeats within `rows` steps, and every token is plain.
    assert len(set(fresh_b[: SPEC.rows])) == SPEC.rows
    assert all(cm.marker_index(SPEC, t) is None for t in fresh_a + fresh_b + stale)
    # Each token names the weights that produced it and the weights that wrote the marker's KV.
    prev = [p[-1], *stale[:-1]]
    assert {cm.reading(SPEC, m, a, b) for a, b in zip(prev, stale, strict=True)} == {("B", "A")}
    assert {cm.reading(SPEC, m, a, b) for a, b in zip([p[-1], *fresh_b[:-1]], fresh_b, strict=True)} == {("B", "B")}


def test_kv_from_another_prefix_shows_too() -> None:
    """Requests that differ only in their marker never share a token at the same step."""
    conts = [expected_continuation(SPEC, "B", [marker(SPEC, m), plain(SPEC, 5, 1)], 30) for m in range(SPEC.contexts)]
    for step in zip(*conts, strict=True):
        assert len(set(step)) == SPEC.contexts


def test_a_stale_prefix_without_the_marker_changes_nothing() -> None:
    p = [plain(SPEC, 3, 3)] * 20 + [marker(SPEC, 2)] + [plain(SPEC, 7, 0)] * 15
    fresh = expected_continuation(SPEC, "B", p, 10)
    assert expected_continuation(SPEC, "B", p, 10, stale_prefix_tokens=BLOCK, stale_version="A") == fresh
    assert expected_continuation(SPEC, "B", p, 10, stale_prefix_tokens=2 * BLOCK, stale_version="A") != fresh


@pytest.mark.parametrize(("args", "match"), [
    (([plain(SPEC, 0, 0)], 3), "exactly one marker"),
    (([marker(SPEC, 0), marker(SPEC, 1)], 3), "exactly one marker"),
    (([marker(SPEC, 0), 1], 3), "token 1: neither"),
    (([marker(SPEC, 0)], -1), "n=-1"),
    (([], 3), "empty prompt"),
])
def test_oracle_rejects_prompts_it_cannot_answer(args: tuple[list[int], int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        expected_continuation(SPEC, "A", *args)


def test_oracle_rejects_bad_stale_arguments() -> None:
    p = prompt(0, 20)
    with pytest.raises(ValueError, match="stale_version"):
        expected_continuation(SPEC, "B", p, 3, stale_prefix_tokens=BLOCK)
    with pytest.raises(ValueError, match="at most 19"):
        expected_continuation(SPEC, "B", p, 3, stale_prefix_tokens=20, stale_version="A")
    with pytest.raises(ValueError, match="weight version 'C'"):
        expected_continuation(SPEC, "C", p, 3)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"contexts": 3}, "contexts=3"),
    ({"rows": 4}, "rows=4"),
    ({"hidden_size": 64, "num_attention_heads": 4}, "head_dim"),
    ({"rows": 120}, "need 139 residual"),
    ({"rope_theta": 10000.0}, "rope_theta"),
    ({"seed": -1}, "seed=-1"),
])
def test_spec_rejects_bad_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ContextCellSpec(**kwargs)


def test_spec_key_and_tokens() -> None:
    assert SPEC.key() == ContextCellSpec.from_dict(json.loads(json.dumps(SPEC.__dict__))).key()
    assert ContextCellSpec(seed=1).key() != SPEC.key()
    assert SPEC.vocab_size == 2 + 8 + 96 * 8
    assert [cm.row_col(SPEC, plain(SPEC, r, c)) for r, c in ((0, 0), (95, 7), (4, 2))] == [(0, 0), (95, 7), (4, 2)]
    assert cm.row_col(SPEC, marker(SPEC, 5)) == (5, -1)


# --------------------------------------------------------------------------- the checkpoints, run in numpy


def test_checkpoints_are_a_pair_vllm_can_swap_in_place(built: dict[str, Path],
                                                       tensors: dict[str, dict[str, np.ndarray]]) -> None:
    assert (built["A"] / "config.json").read_text() == (built["B"] / "config.json").read_text()
    assert cm.load_info(built["B"]) == (SPEC, "B")
    a, b = tensors["A"], tensors["B"]
    assert sorted(a) == sorted(b) and all(a[k].shape == b[k].shape for k in a)
    assert sorted(k for k in a if not np.array_equal(a[k], b[k])) == [
        "lm_head.weight", "model.layers.0.self_attn.v_proj.weight"]
    assert cm.build_checkpoint(SPEC, "A", built["A"].parent) == built["A"]  # cached


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
def test_fresh_decoding_follows_the_oracle_with_a_wide_margin(
        built: dict[str, Path], tensors: dict[str, dict[str, np.ndarray]], half: bool, neox: bool) -> None:
    dec = decoder(built, tensors, half=half, neox=neox)
    for version in cm.VERSIONS:
        for m in (0, 5):
            p = prompt(m, 37, seed=m)
            got, margin, on_marker = dec.decode(version, p, 24)
            assert got == expected_continuation(SPEC, version, p, 24)
            assert margin > MIN_MARGIN, f"{version}: top-1/top-2 margin {margin:.2f}"
            assert on_marker > 1 - 1e-6


def test_the_marker_wins_attention_thousands_of_positions_away(
        built: dict[str, Path], tensors: dict[str, dict[str, np.ndarray]]) -> None:
    dec = decoder(built, tensors, half=True)
    p = prompt(3, 4000, seed=9)
    got, margin, on_marker = dec.decode("B", p, 4)
    assert got == expected_continuation(SPEC, "B", p, 4)
    assert margin > MIN_MARGIN and on_marker > 1 - 1e-6


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "bf16"])
def test_oracle_fails_when_one_cached_block_from_the_old_version_is_reused(
        built: dict[str, Path], tensors: dict[str, dict[str, np.ndarray]], half: bool) -> None:
    """The planted stale block: the first block's KV written by A, the request decoded under B."""
    dec = decoder(built, tensors, half=half)
    p, n = prompt(6, 2 * BLOCK + 5, seed=4), 20
    fresh, _, _ = dec.decode("B", p, n)
    planted, margin, _ = dec.decode("B", p, n, stale=BLOCK, stale_version="A")
    assert fresh == expected_continuation(SPEC, "B", p, n)  # passes without the planted block
    assert planted != expected_continuation(SPEC, "B", p, n)  # fails with it ...
    assert all(a != b for a, b in zip(planted, fresh, strict=True))  # ... at every token
    # ... and names it: exactly the oracle's stale prediction, not A's stream either.
    assert planted == expected_continuation(SPEC, "B", p, n, stale_prefix_tokens=BLOCK, stale_version="A")
    assert planted != expected_continuation(SPEC, "A", p, n)
    assert margin > MIN_MARGIN
    # The reverse (B's KV read under A) is just as specific.
    rev, _, _ = dec.decode("A", p, n, stale=2 * BLOCK, stale_version="B")
    assert rev == expected_continuation(SPEC, "A", p, n, stale_prefix_tokens=2 * BLOCK, stale_version="B")
    assert rev != expected_continuation(SPEC, "A", p, n)


def test_the_engine_side_resolves_the_kind(tmp_path: Path) -> None:
    from repro.models.kinds import load_model

    loaded = load_model(cm.KIND, {"rows": 32, "version": "B"}, tmp_path)
    assert cm.load_info(Path(loaded.source)) == (ContextCellSpec(rows=32), "B")
    assert (loaded.kind, loaded.vocab_size, loaded.perm, loaded.defaults) == (cm.KIND, 2 + 8 + 32 * 8, None,
                                                                              {"dtype": "float32",
                                                                               "skip_tokenizer_init": False})
    assert load_model(cm.KIND, {}, tmp_path).source.endswith("-A")
    with pytest.raises(ValueError, match="weight version 'C'"):
        load_model(cm.KIND, {"version": "C"}, tmp_path)
