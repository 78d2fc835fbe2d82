"""vLLM 0.34.0's engine checkpoint mid-generation: ``checkpoint_prepare(mode)``, a reload, ``checkpoint_restore``.

What RL trainers call around a weight update from 0.34.0 on (read in the 0.34.0 wheel):

* ``AsyncLLM.checkpoint_prepare(mode)`` (v1/engine/async_llm.py:1237) returns a refusal string or None and returns
  at once: ``EngineCoreProc.checkpoint_prepare`` (v1/engine/core.py:2471-2496) pauses in ``mode`` and, once the
  engine is idle, ``_finish_pause`` (core.py:997-1016) resets the prefix and connector caches
  (``reset_prefix_cache(reset_running_requests=True, reset_connector=True)``: kept requests are preempted and will
  be recomputed), discards the KV cache memory and prepares the workers' communicators; only then is
  ``checkpoint_state()`` PREPARED.  So the scenario waits for that state by asking the engine, as a trainer must.
* While PREPARED, ``resume_generation`` must refuse ("Cannot resume scheduling while the checkpoint state is
  prepared", core.py:1063-1073): the scenario checks it does, and that the state is still PREPARED after.
* The weights are reloaded in place from the checkpoint (``collective_rpc("reload_weights", weights_path=...)``),
  as the sleep scenario does: the same weights, so every stream keeps one reference.
* ``checkpoint_restore()`` (core.py:2498-2513) wakes the KV cache and resumes generation by itself: the scenario
  waits for RUNNING and calls no ``resume_generation``.

Correct outcome: with ``keep`` every request running at the prepare continues with exactly its reference (the
recompute after a drained reset: a lost first token would be vllm#42043's shape); requests submitted while
prepared queue (keep) or are refused with ``RetryableRequestError`` and retried after the restore (wait).
0.33.0's ``checkpoint_prepare()`` takes no mode (only the workers' communicators): UNSUPPORTED there with that reason;
on CPU vLLM refuses ``enable_sleep_mode`` (the ``sleep`` profile) at start-up.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass
from typing import Any

from repro.scenarios._profile import run_with_own_pauses
from repro.scenarios.vocab import (
    EngineContext,
    PauseSpec,
    Plan,
    RequestSpec,
    ScenarioFailed,
    make_prompts,
    params_from_dict,
)
from repro.scenarios.weight_transfer import reload_unsupported

MODES = ("keep", "wait")
# checkpoint_state() polls while the engine drains and releases its KV memory: it has no completion event
# (AsyncLLM.checkpoint_prepare returns before the drain); each poll is one utility round trip to the engine core.
POLL_INTERVAL = 0.01


@dataclass(frozen=True)
class CheckpointParams:
    mode: str = "keep"
    clear_cache: bool = True  # the prepare always resets the prefix cache and releases the KV memory
    num_requests: int = 8
    during_requests: int = 2  # submitted while prepared: queued (keep) or refused and retried (wait)
    prompt_len: int = 6
    max_tokens: int = 48
    pause_after: int = 8

    def __post_init__(self) -> None:
        if self.mode not in MODES or not self.clear_cache:
            raise ValueError(f"checkpoint mode={self.mode!r} clear_cache={self.clear_cache}: the prepare pauses in "
                             f"{'/'.join(MODES)} and always resets the prefix cache")
        if self.pause_after >= self.max_tokens:
            raise ValueError(f"pause_after={self.pause_after} must be below max_tokens={self.max_tokens}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointParams:
        return params_from_dict(cls, data, "checkpoint parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """The requests and the one checkpoint, without its prepare/restore calls (attached by :func:`run`)."""
    p = CheckpointParams.from_dict(params)
    prompts = make_prompts(p.num_requests + p.during_requests, p.prompt_len, vocab_size, seed)
    reqs = [RequestSpec(f"{sid}-r{i:02d}", prompts[i], p.max_tokens) for i in range(p.num_requests)]
    reqs += [RequestSpec(f"{sid}-d{i:02d}", prompts[p.num_requests + i], p.max_tokens, ("during", 0))
             for i in range(p.during_requests)]
    return Plan(reqs, [PauseSpec(p.mode, True, p.pause_after)])


def checkpoint_api_problem(llm: Any) -> str | None:
    """Why this AsyncLLM has no engine checkpoint, or None."""
    for name in ("checkpoint_prepare", "checkpoint_restore", "checkpoint_state"):
        if not hasattr(llm, name):
            return f"AsyncLLM has no {name}() (the engine-core checkpoint arrived in vLLM 0.34.0)"
    if "mode" not in inspect.signature(llm.checkpoint_prepare).parameters:
        return "AsyncLLM.checkpoint_prepare() takes no mode= (before 0.34.0 it only prepared the workers)"
    return None


def _state(raw: Any) -> str:
    """``checkpoint_state()`` answers ``(CheckpointState, error)``; the state is a StrEnum (v1/engine/__init__.py)."""
    state = raw[0] if isinstance(raw, tuple) else raw
    return str(getattr(state, "value", state))


class Checkpointer:
    """The prepare and restore calls of one checkpoint, each waited for through ``checkpoint_state()``."""

    def __init__(self, llm: Any, ctx: EngineContext, mode: str) -> None:
        self.llm, self.ctx, self.mode = llm, ctx, mode

    async def _until(self, want: str, what: str) -> int:
        polls = 0
        while (state := _state(await self.llm.checkpoint_state())) != want:
            if state == "failed":
                raise ScenarioFailed(f"after {what} the engine's checkpoint state is failed: "
                                     f"{await self.llm.checkpoint_state()}")
            polls += 1
            await asyncio.sleep(POLL_INTERVAL)
        return polls

    async def _resume_refused(self) -> str:
        try:
            await self.llm.resume_generation()
        except Exception as exc:  # vLLM's utility failure: a plain Exception (v1/engine/core_client.py)
            if _state(await self.llm.checkpoint_state()) != "prepared":
                raise ScenarioFailed("a refused resume_generation() changed the checkpoint state") from exc
            return f"{type(exc).__name__}: {exc}"
        raise ScenarioFailed("resume_generation() while the checkpoint is prepared did not refuse: generation "
                             "would run with the KV memory released")

    async def prepare(self) -> dict[str, Any]:
        t0 = time.monotonic()
        refusal = await self.llm.checkpoint_prepare(mode=self.mode)
        if refusal is not None:
            raise ScenarioFailed(f"checkpoint_prepare(mode={self.mode!r}) refused: {refusal}")
        polls = await self._until("prepared", f"checkpoint_prepare(mode={self.mode!r})")
        refused = await self._resume_refused()
        await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.ctx.model_dir)})
        return {"call": "checkpoint_prepare", "mode": self.mode, "state_polls": polls, "resume_refused": refused,
                "reloaded": str(self.ctx.model_dir), "seconds": round(time.monotonic() - t0, 3)}

    async def restore(self) -> dict[str, Any]:
        t0 = time.monotonic()
        await self.llm.checkpoint_restore()
        polls = await self._until("running", "checkpoint_restore()")
        return {"call": "checkpoint_restore", "state_polls": polls, "seconds": round(time.monotonic() - t0, 3)}


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Reference without a checkpoint, then the plan with one; every request checked against it."""
    sid = sc["id"]
    plan = build(sid, sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    problem = checkpoint_api_problem(llm) or reload_unsupported(list(await llm.collective_rpc("repro_worker_probe")))

    def checkpoint(plan: Plan) -> list[PauseSpec]:
        (p,) = plan.pauses
        c = Checkpointer(llm, ctx, p.mode)
        return [PauseSpec(p.mode, p.clear_cache, p.after_tokens, enter=c.prepare, leave=c.restore)]

    return await run_with_own_pauses(llm, sid, plan, ctx, timeout, problem, checkpoint)
