"""A deterministic checkpoint whose next token also depends on cached context: it can see stale KV.

The bigram-cycle model (``repro.models.deterministic``) predicts from the current token only, so KV written by other
weights changes nothing it emits.  The *context-cell* model is a 1-layer Llama with hand-set weights in
which the next token is a function of the current token **and** of a *marker* token earlier in the
request, read through attention:

* Vocabulary: ``0``/``1`` (bos/eos, never emitted), ``contexts`` marker tokens ``2 .. 2+K-1``, then
  ``rows * K`` plain tokens, plain token ``(r, s)`` being ``2 + K + r*K + s``.  Greedy output is always
  plain.  A prompt holds exactly one marker (the scenarios put it at position 0, in the first block).
* Residual dimensions: ``ONE`` (1 in every embedding), ``FLAG`` (markers), ``PAD`` (evens the norms), a
  one-hot *row* (plain token ``(r, s)``: row ``r``; marker ``m``: row ``m``), a one-hot marker *id*, and a
  *context* subspace that only attention writes.  Every embedding has norm 2, so RMSNorm scales all alike.
* Attention, head 0 only (heads 1.. are zero): the query reads ``ONE`` and the key reads ``FLAG``, both in
  the head's last dimension, which is the slowest RoPE pair in neox and GPT-J layouts alike; with
  ``rope_theta`` 1e6 it turns by under 0.01 rad over 4096 positions.  Only markers have a key: the
  marker's score is ~90 while every other score is exactly 0, so the softmax is one-hot on the marker to
  within e^-80; and only markers have a value, so the head's output is the marker's value whatever the
  weights.  ``v_proj`` maps marker ``m`` to the one-hot *code* ``(m + shift[version]) % K``; ``o_proj``
  writes code ``c`` into context dimension ``c``.  So **the KV holds the code, and the code depends on
  the version that wrote the KV**.
* ``lm_head`` row of plain token ``(r, s)``: ``ALPHA`` on row ``rho^-1(r)`` plus ``BETA`` on context
  ``(s - r - offset[version]) % K``.  After token of row ``r`` with code ``c`` the arg-max is
  ``(rho(r), (rho(r) + c + offset[version]) % K)``: the row walks one cycle ``rho`` over the rows
  (a stream repeats no token within ``rows`` steps), the column tells the code and the head's version.
  The winner leads every other logit by ~18 (the smaller of the two terms), far above fp32/bf16 noise.
* Versions ``A`` and ``B`` differ in ``v_proj`` (shift 0 / 1) and ``lm_head`` (offset 0 / 2).  For
  marker ``m`` the column is then ``row + m`` fresh on A, ``row + m + 3`` fresh on B and ``row + m + 2``
  on B reading A's KV (``row + m + 1`` on A reading B's): all four differ at every token when K >= 4, so a
  stale block, weights that were never updated, and KV from another prefix each show as a specific
  wrong token.

Pure Python but for the builder (numpy); never imports torch or vllm.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from repro.models.deterministic import check_sizes, cycle_permutation, write_safetensors

KIND = "context-cell"
BUILDER_VERSION = 1  # bump when the checkpoint layout changes: it keys the cache
VERSIONS = ("A", "B")
# What each version's weights do with the context code (see the module docstring).
CODE_SHIFT = {"A": 0, "B": 1}  # v_proj: marker m -> code (m + shift) % K
HEAD_OFFSET = {"A": 0, "B": 2}  # lm_head: code c -> column (row + c + offset) % K
N_SPECIAL = 2  # bos 0, eos 1
# Hand-set weight magnitudes; margins are derived from them in the tests.
QK = 4.0  # q_proj[ONE] and k_proj[FLAG] -> marker score QK**2 * |x_norm|^2 / sqrt(head_dim)
O_GAIN = 0.25  # o_proj: value code -> context dimension
ALPHA = 4.0  # lm_head: row term
BETA = 4.0  # lm_head: context term
ONE, FLAG, PAD, FIRST_ROW = 0, 1, 2, 3


@dataclass(frozen=True)
class ContextCellSpec:
    """Parameters of a context-cell checkpoint pair (A and B); the cache key is their hash."""

    contexts: int = 8  # K marker tokens, and K columns of plain tokens
    rows: int = 96  # length of the row cycle: a stream repeats no token within this many steps
    hidden_size: int = 128
    num_attention_heads: int = 4  # CPU attention needs head_dim >= 32
    intermediate_size: int = 64
    max_position_embeddings: int = 4096
    rope_theta: float = 1e6
    seed: int = 0

    def __post_init__(self) -> None:
        if self.contexts < 4:
            raise ValueError(f"contexts={self.contexts}: need at least 4 so fresh A, fresh B and stale differ")
        if self.rows < self.contexts:
            raise ValueError(f"rows={self.rows}: need at least contexts={self.contexts} (a marker's row is its index)")
        check_sizes(self, ("num_attention_heads", "intermediate_size", "max_position_embeddings"))
        if self.hidden_size % self.num_attention_heads or self.head_dim < 32:
            raise ValueError(f"hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}: "
                             "need a whole head_dim of at least 32 (vLLM's CPU attention)")
        if self.contexts > self.head_dim:
            raise ValueError(f"contexts={self.contexts}: head 0 holds the code, so at most head_dim={self.head_dim}")
        if self.n_dims > self.hidden_size:
            raise ValueError(f"hidden_size={self.hidden_size}: rows={self.rows} and contexts={self.contexts} need "
                             f"{self.n_dims} residual dimensions")
        if self.rope_theta < 1e5:
            raise ValueError(f"rope_theta={self.rope_theta}: the marker's score must not turn with position; "
                             "use at least 1e5")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def n_dims(self) -> int:
        """Residual dimensions the design uses: ONE, FLAG, PAD, the rows, the marker ids, the contexts."""
        return FIRST_ROW + self.rows + 2 * self.contexts

    @property
    def vocab_size(self) -> int:
        return N_SPECIAL + self.contexts + self.rows * self.contexts

    def key(self) -> str:
        payload = json.dumps({"kind": KIND, "builder": BUILDER_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContextCellSpec:
        return cls(**data)


# --------------------------------------------------------------------------- tokens


def marker(spec: ContextCellSpec, m: int) -> int:
    """Token id of marker ``m`` (0 <= m < contexts)."""
    if not 0 <= m < spec.contexts:
        raise ValueError(f"marker {m}: valid 0..{spec.contexts - 1}")
    return N_SPECIAL + m


def plain(spec: ContextCellSpec, row: int, col: int) -> int:
    """Token id of plain token ``(row, col)``."""
    if not (0 <= row < spec.rows and 0 <= col < spec.contexts):
        raise ValueError(f"plain token ({row}, {col}): valid rows 0..{spec.rows - 1}, "
                         f"columns 0..{spec.contexts - 1}")
    return N_SPECIAL + spec.contexts + row * spec.contexts + col


def marker_index(spec: ContextCellSpec, tok: int) -> int | None:
    """``m`` when ``tok`` is marker ``m``, else None."""
    m = tok - N_SPECIAL
    return m if 0 <= m < spec.contexts else None


def row_col(spec: ContextCellSpec, tok: int) -> tuple[int, int]:
    """(row, column) of a plain token; a marker's row is its index (it has no column: -1)."""
    m = marker_index(spec, tok)
    if m is not None:
        return m, -1
    if not N_SPECIAL + spec.contexts <= tok < spec.vocab_size:
        raise ValueError(f"token {tok}: neither a marker nor a plain token of this model "
                         f"(markers {N_SPECIAL}..{N_SPECIAL + spec.contexts - 1}, plain "
                         f"{N_SPECIAL + spec.contexts}..{spec.vocab_size - 1})")
    return divmod(tok - N_SPECIAL - spec.contexts, spec.contexts)


def row_cycle(spec: ContextCellSpec) -> list[int]:
    """rho: the single cycle the rows walk (the same in A and B)."""
    return cycle_permutation(spec.rows, spec.seed)


def _check_version(version: str) -> None:
    if version not in VERSIONS:
        raise ValueError(f"weight version {version!r}; valid: {list(VERSIONS)}")


# --------------------------------------------------------------------------- oracle


def value_code(spec: ContextCellSpec, kv_version: str, m: int) -> int:
    """The code that the KV of marker ``m`` holds when ``kv_version``'s weights wrote it."""
    _check_version(kv_version)
    return (m + CODE_SHIFT[kv_version]) % spec.contexts


def next_token(spec: ContextCellSpec, version: str, tok: int, code: int, rho: Sequence[int] | None = None) -> int:
    """The arg-max after ``tok`` under ``version``'s weights when attention reads context ``code``."""
    _check_version(version)
    row = (rho or row_cycle(spec))[row_col(spec, tok)[0]]
    return plain(spec, row, (row + code + HEAD_OFFSET[version]) % spec.contexts)


def marker_position(spec: ContextCellSpec, prompt: Sequence[int]) -> int:
    """Where the prompt's one marker is; ValueError when it has none or several."""
    where = [i for i, t in enumerate(prompt) if marker_index(spec, t) is not None]
    if len(where) != 1:
        raise ValueError(f"a context-cell prompt holds exactly one marker token "
                         f"({N_SPECIAL}..{N_SPECIAL + spec.contexts - 1}); this one has {len(where)}")
    for t in prompt:
        row_col(spec, t)  # every other token must be plain
    return where[0]


def context_code(spec: ContextCellSpec, version: str, prompt: Sequence[int],
                 stale_prefix_tokens: int = 0, stale_version: str | None = None) -> int:
    """The code attention reads: the marker's KV came from ``stale_version`` when it lies in the stale prefix."""
    pos = marker_position(spec, prompt)
    kv_version = version
    if pos < stale_prefix_tokens:
        if stale_version is None:
            raise ValueError(f"stale_prefix_tokens={stale_prefix_tokens} needs the stale_version that wrote them")
        kv_version = stale_version
    m = marker_index(spec, prompt[pos])
    assert m is not None  # marker_position found it
    return value_code(spec, kv_version, m)


def expected_continuation(spec: ContextCellSpec, version: str, prompt: Sequence[int], n: int,
                          stale_prefix_tokens: int = 0, stale_version: str | None = None) -> list[int]:
    """Greedy continuation of ``prompt`` under ``version``'s weights.

    ``stale_prefix_tokens``: the first that many positions' KV was written by ``stale_version``'s
    weights (a prefix-cache hit across a weight update: whole blocks, so a multiple of the block size).
    Only the marker's KV reaches the logits, so the continuation changes exactly when the marker lies in
    the stale prefix.
    """
    if n < 0:
        raise ValueError(f"n={n}: must be >= 0")
    if not prompt:
        raise ValueError("empty prompt")
    if stale_prefix_tokens >= len(prompt):
        raise ValueError(f"stale_prefix_tokens={stale_prefix_tokens}: vLLM recomputes at least the prompt's last "
                         f"token, so at most {len(prompt) - 1} of these {len(prompt)} can be cached")
    code = context_code(spec, version, prompt, stale_prefix_tokens, stale_version)
    rho = row_cycle(spec)
    out: list[int] = []
    tok = prompt[-1]
    for _ in range(n):
        tok = next_token(spec, version, tok, code, rho)
        out.append(tok)
    return out


def reading(spec: ContextCellSpec, marker_m: int, prev: int, tok: int) -> tuple[str, str] | None:
    """(head version, KV version) whose weights put ``tok`` after ``prev`` in a request with marker ``marker_m``.

    The column of every token names the weights that produced it and the weights that wrote the marker's
    KV: ``("B", "A")`` is a stale read after an update from A to B.  None: no pair of versions gives ``tok``.
    """
    rho = row_cycle(spec)
    for head in VERSIONS:
        for kv in VERSIONS:
            if next_token(spec, head, prev, value_code(spec, kv, marker_m), rho) == tok:
                return head, kv
    return None


# --------------------------------------------------------------------------- checkpoint


def hf_config(spec: ContextCellSpec) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_attention_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 0,
        "eos_token_id": 1,  # every run uses ignore_eos; the config still needs one
        "attention_bias": False,
        "mlp_bias": False,
    }


def context_dim(spec: ContextCellSpec, code: int) -> int:
    """The residual dimension into which attention writes context ``code``."""
    return FIRST_ROW + spec.rows + spec.contexts + code


def _embeddings(spec: ContextCellSpec) -> Any:
    import numpy as np  # only the builder needs numpy

    emb = np.zeros((spec.vocab_size, spec.hidden_size), dtype=np.float32)
    emb[:, ONE] = 1.0
    emb[:N_SPECIAL, PAD] = np.sqrt(3.0)
    for m in range(spec.contexts):
        t = marker(spec, m)
        emb[t, FLAG] = emb[t, FIRST_ROW + m] = emb[t, FIRST_ROW + spec.rows + m] = 1.0
    for r in range(spec.rows):
        for s in range(spec.contexts):
            t = plain(spec, r, s)
            emb[t, PAD], emb[t, FIRST_ROW + r] = np.sqrt(2.0), 1.0
    return emb  # every row has norm 2


def _lm_head(spec: ContextCellSpec, version: str) -> Any:
    import numpy as np

    rho = row_cycle(spec)
    pred = {nxt: r for r, nxt in enumerate(rho)}
    lm = np.zeros((spec.vocab_size, spec.hidden_size), dtype=np.float32)
    for r in range(spec.rows):
        for s in range(spec.contexts):
            t = plain(spec, r, s)
            lm[t, FIRST_ROW + pred[r]] = ALPHA
            lm[t, context_dim(spec, (s - r - HEAD_OFFSET[version]) % spec.contexts)] = BETA
    return lm


def weights(spec: ContextCellSpec, version: str) -> dict[str, Any]:
    """Every tensor of ``version``'s checkpoint (numpy float32), by its Hugging Face name."""
    import numpy as np

    _check_version(version)
    h, hd, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    q, k, v, o = (np.zeros((h, h), dtype=np.float32) for _ in range(4))
    # Head 0, its last dimension (the slowest RoPE pair): the query reads ONE, the key reads FLAG.
    q[hd - 1, ONE] = QK
    k[hd - 1, FLAG] = QK
    for m in range(spec.contexts):
        v[value_code(spec, version, m), FIRST_ROW + spec.rows + m] = 1.0
    for c in range(spec.contexts):
        o[context_dim(spec, c), c] = O_GAIN
    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": _embeddings(spec),
        "model.norm.weight": np.ones(h, dtype=np.float32),
        "lm_head.weight": _lm_head(spec, version),
        p + "input_layernorm.weight": np.ones(h, dtype=np.float32),
        p + "post_attention_layernorm.weight": np.ones(h, dtype=np.float32),
        p + "self_attn.q_proj.weight": q,
        p + "self_attn.k_proj.weight": k,
        p + "self_attn.v_proj.weight": v,
        p + "self_attn.o_proj.weight": o,
        # The MLP adds nothing: the residual after attention is what lm_head reads.
        p + "mlp.gate_proj.weight": np.zeros((inter, h), dtype=np.float32),
        p + "mlp.up_proj.weight": np.zeros((inter, h), dtype=np.float32),
        p + "mlp.down_proj.weight": np.zeros((h, inter), dtype=np.float32),
    }


def build_checkpoint(spec: ContextCellSpec, version: str, cache_dir: Path) -> Path:
    """Build (or reuse) ``version``'s checkpoint of ``spec`` under ``cache_dir``; return its folder."""
    _check_version(version)
    target = cache_dir / f"{KIND}-{spec.key()}-{version}"
    if (target / "repro-model.json").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".tmp-{spec.key()}-{version}-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    write_safetensors(tmp / "model.safetensors", weights(spec, version))
    (tmp / "config.json").write_text(json.dumps(hf_config(spec), indent=2))
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1,
                                                            "do_sample": False}))
    # Written last: its presence marks a complete checkpoint.
    (tmp / "repro-model.json").write_text(json.dumps({"kind": KIND, "spec": asdict(spec), "key": spec.key(),
                                                      "version": version}))
    try:
        tmp.rename(target)
    except OSError:  # another process finished the same checkpoint first; keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_info(model_dir: Path) -> tuple[ContextCellSpec, str]:
    """The spec and weight version recorded beside a checkpoint built here."""
    doc = json.loads((Path(model_dir) / "repro-model.json").read_text())
    if doc.get("kind") != KIND:
        raise ValueError(f"{model_dir}: a {doc.get('kind')!r} checkpoint, not {KIND!r}")
    return ContextCellSpec.from_dict(doc["spec"]), str(doc["version"])
