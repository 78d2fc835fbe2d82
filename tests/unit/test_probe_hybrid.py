"""The vllm#57562 hybrid probe's pure parts (repro.probes.hybrid_chunked), checked without vLLM or torch."""

from __future__ import annotations

import pytest

from repro.probes.hybrid_chunked import LAYER_TYPES, hf_config, prompts

pytestmark = pytest.mark.unit


def test_the_checkpoint_has_gdn_and_attention_layers_and_one_moe_layer() -> None:
    c = hf_config()
    assert c["layer_types"] == LAYER_TYPES and {"linear_attention", "full_attention"} <= set(LAYER_TYPES)
    # vLLM's Qwen3NextForCausalLM refuses a model without a sparse-MoE layer (measured on 0.32.0).
    assert len(c["mlp_only_layers"]) == c["num_hidden_layers"] - 1


def test_prompts_mix_short_ones_with_long_ones_sharing_a_prefix_across_rounds() -> None:
    a, b = prompts(12, 2048, seed=0), prompts(12, 2048, seed=1)
    assert [len(p) < 24 for p in a] == [i % 3 == 0 for i in range(12)]
    assert all(150 <= len(p) <= 600 for i, p in enumerate(a) if i % 3)
    shared = [p[:256] for i, p in enumerate(a + b) if i % 3 and i % 2]
    assert shared and all(s == shared[0] for s in shared)  # prefix-cache hits within and across rounds
    assert all(2 <= t < 2048 for p in a for t in p)
