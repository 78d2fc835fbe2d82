"""Sleep mode mid-generation: ``sleep(level=1, mode="keep")`` + ``wake_up()``, then ``sleep(level=2)`` + reload.

Runs on the ``sleep`` engine profile (``enable_sleep_mode=True``).  vLLM's ``AsyncLLM.sleep(level, mode)``
(0.17+; 0.16's takes no mode) first pauses the scheduler in ``mode`` with the prefix cache cleared (level >= 1),
then frees device memory: level 1 offloads the weights and discards the KV cache, level 2 discards both.

1. Once every running request has ``pause_after`` tokens: ``sleep(level=1, mode="keep")``.  The kept
   requests lose their KV cache (the pause force-preempts them: the keep + clear_cache shape of vllm#42043)
   and must be recomputed after ``wake_up()``; requests submitted while asleep queue.  Every kept request
   must continue with exactly ``reference[pause_index]``.
2. Once every running request has ``pause_after + level2_gap`` tokens: ``sleep(level=2, mode="abort")``, as
   the RLHF flow does (running requests end with finish_reason abort: a prefix of their reference), then
   ``wake_up(tags=["weights"])``, the weights reloaded from the checkpoint (``reload_weights``: level 2 kept
   none), ``wake_up(tags=["kv_cache"])``.  Requests submitted after it must produce their full reference:
   the weights are back.  Level 2 does not keep requests: on vLLM 0.21/0.22 a partial ``wake_up(tags)``
   resumes scheduling before the KV cache is back (``EngineCore.wake_up``), so kept requests would run half
   awake by design, not by fault.

Reference: the same engine's streams with no sleep (all requests at once), which must follow the bigram
cycle.  ``is_sleeping()`` must be true after each sleep and false after waking, or the scenario fails (ERROR):
a sleep that did not happen tests nothing.  Where sleep mode cannot run, vLLM refuses ``enable_sleep_mode``
at start-up (CPU: ``Sleep mode is not supported on current platform.``) and every cell of the engine is
UNSUPPORTED with that message (``repro.settings.effective.refused_setting``); the harness asks vLLM's
``current_platform.is_sleep_mode_available()`` in the env first and starts no engine where it says no
(``harness.run.platform_probe``).
"""

from __future__ import annotations

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

MODES = ("keep",)


@dataclass(frozen=True)
class SleepParams:
    mode: str = "keep"  # the level-1 sleep's pause mode
    clear_cache: bool = True  # sleep(level >= 1) always clears the prefix cache: only true is meaningful
    num_requests: int = 8
    during_requests: int = 2  # submitted while asleep (level 1)
    after_requests: int = 4  # submitted after the level-2 wake-up and reload
    prompt_len: int = 6
    max_tokens: int = 48
    pause_after: int = 8
    level2_gap: int = 12  # further tokens before the level-2 sleep

    def __post_init__(self) -> None:
        if self.mode not in MODES or not self.clear_cache:
            raise ValueError(f"sleep mode={self.mode!r} clear_cache={self.clear_cache}: the scenario sleeps in "
                             "keep mode, and sleep(level>=1) always clears the prefix cache")
        if self.pause_after + self.level2_gap >= self.max_tokens:
            raise ValueError(f"pause_after + level2_gap = {self.pause_after + self.level2_gap} must be below "
                             f"max_tokens={self.max_tokens}, or nothing runs at the level-2 sleep")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SleepParams:
        return params_from_dict(cls, data, "sleep parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """The requests and the two sleeps, without their enter/leave calls (attached by :func:`run`)."""
    p = SleepParams.from_dict(params)
    n = p.num_requests + p.during_requests + p.after_requests
    prompts = make_prompts(n, p.prompt_len, vocab_size, seed)
    reqs = [RequestSpec(f"{sid}-r{i:02d}", prompts[i], p.max_tokens) for i in range(p.num_requests)]
    reqs += [RequestSpec(f"{sid}-d{i:02d}", prompts[p.num_requests + i], p.max_tokens, ("during", 0))
             for i in range(p.during_requests)]
    reqs += [RequestSpec(f"{sid}-a{i:02d}", prompts[p.num_requests + p.during_requests + i], p.max_tokens,
                         ("after", 1)) for i in range(p.after_requests)]
    return Plan(reqs, [PauseSpec(p.mode, True, p.pause_after), PauseSpec("abort", True, p.pause_after + p.level2_gap)])


def sleep_api_problem(llm: Any) -> str | None:
    """Why this AsyncLLM cannot sleep in a pause mode, or None."""
    for name in ("sleep", "wake_up", "is_sleeping"):
        if not hasattr(llm, name):
            return f"AsyncLLM has no {name}()"
    if "mode" not in inspect.signature(llm.sleep).parameters:
        return "AsyncLLM.sleep() takes no mode= (sleeping with kept requests arrived in vLLM 0.21)"
    return None


class Sleeper:
    """The enter/leave calls of the two sleeps, each checked with ``is_sleeping()``."""

    def __init__(self, llm: Any, ctx: EngineContext) -> None:
        self.llm, self.ctx = llm, ctx

    async def _asleep(self, want: bool, what: str) -> None:
        got = await self.llm.is_sleeping()
        if bool(got) is not want:
            raise ScenarioFailed(f"after {what} vLLM reports is_sleeping()={got}: the sleep under test did not "
                                 "happen as asked")

    def enter(self, level: int, mode: str) -> Any:
        async def call() -> dict[str, Any]:
            t0 = time.monotonic()
            await self.llm.sleep(level=level, mode=mode)
            await self._asleep(True, f"sleep(level={level}, mode={mode!r})")
            return {"call": "sleep", "level": level, "mode": mode, "seconds": round(time.monotonic() - t0, 3)}
        return call

    async def wake_all(self) -> dict[str, Any]:
        t0 = time.monotonic()
        await self.llm.wake_up()
        await self._asleep(False, "wake_up()")
        return {"call": "wake_up", "seconds": round(time.monotonic() - t0, 3)}

    async def wake_reload(self) -> dict[str, Any]:
        """Level 2 kept no weights: wake them, load the checkpoint again, then wake the KV cache."""
        t0 = time.monotonic()
        await self.llm.wake_up(tags=["weights"])
        await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.ctx.model_dir)})
        await self.llm.wake_up(tags=["kv_cache"])
        await self._asleep(False, "wake_up(weights), reload_weights, wake_up(kv_cache)")
        return {"call": "wake_up+reload", "checkpoint": str(self.ctx.model_dir),
                "seconds": round(time.monotonic() - t0, 3)}


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Reference without sleep, then the plan with both sleeps; every request checked against it."""
    sid = sc["id"]
    plan = build(sid, sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    problem = sleep_api_problem(llm) or reload_unsupported(list(await llm.collective_rpc("repro_worker_probe")))
    s = Sleeper(llm, ctx)

    def sleeps(plan: Plan) -> list[PauseSpec]:
        p1, p2 = plan.pauses
        return [PauseSpec(p1.mode, p1.clear_cache, p1.after_tokens, enter=s.enter(1, p1.mode), leave=s.wake_all),
                PauseSpec(p2.mode, p2.clear_cache, p2.after_tokens, enter=s.enter(2, p2.mode), leave=s.wake_reload)]

    return await run_with_own_pauses(llm, sid, plan, ctx, timeout, problem, sleeps)
