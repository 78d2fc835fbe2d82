"""The sleep door for the stale-kv scenarios (issue 37 item 3): the update to B inside ``sleep`` / ``wake_up``.

Scenarios ``sleep-update-l<level>`` and ``sleep-update-l<level>-reset`` (``repro.scenarios.stale_kv`` with door
``sleep1`` / ``sleep2``), on the ``prefix-cache-sleep`` engine profile (prefix caching and ``enable_sleep_mode``):
once every running request has ``pause_after`` tokens, ``sleep(level, mode="keep")`` stands for the pause, and
waking it does the update, as the RL recipes do (verl's order, the sleep scenario's ``wake_reload``):
``wake_up(tags=["weights"])``, ``collective_rpc("reload_weights", B)``, with ``-reset`` ``reset_prefix_cache()``,
then ``wake_up(tags=["kv_cache"])``.

Read, not run here: ``sleep(level >= 1)`` pauses with the prefix cache cleared (``EngineCore.sleep``,
vllm/v1/engine/core.py:691-692 in 0.21.0, :973-974 in 0.32.0), so without the explicit reset no new request should
read A's KV, and the kept requests (preempted by that clear) are recomputed under B.  vLLM's CPU platform refuses
``enable_sleep_mode`` at start-up (vllm/config/model.py:507-508 in 0.21.0, :537-539 in 0.22.0, :655-657 in 0.32.0:
``is_sleep_mode_available``, CUDA/ROCm (0.32.0: and XPU) only), which makes every such cell UNSUPPORTED with
vLLM's message there (``repro.settings.effective.refused_setting``).
"""

from __future__ import annotations

import time
from typing import Any

from repro.scenarios.sleep import sleep_api_problem
from repro.scenarios.vocab import PauseAction, ScenarioFailed, ScenarioUnsupported

SLEEP_DOORS = {"sleep1": 1, "sleep2": 2}


def sleep_unsupported(llm: Any) -> None:
    """ScenarioUnsupported when this AsyncLLM cannot sleep in a pause mode."""
    problem = sleep_api_problem(llm)
    if problem:
        raise ScenarioUnsupported(problem)


async def _asleep(llm: Any, want: bool, what: str) -> None:
    got = await llm.is_sleeping()
    if bool(got) is not want:
        raise ScenarioFailed(f"after {what} vLLM reports is_sleeping()={got}: the sleep under test did not happen "
                             "as asked")


def sleep_enter(llm: Any, level: int, mode: str) -> PauseAction:
    """``sleep(level, mode)`` in place of the pause, checked with ``is_sleeping()``."""
    async def call() -> dict[str, Any]:
        t0 = time.monotonic()
        await llm.sleep(level=level, mode=mode)
        await _asleep(llm, True, f"sleep(level={level}, mode={mode!r})")
        return {"call": "sleep", "level": level, "mode": mode, "seconds": round(time.monotonic() - t0, 3)}

    return call


def sleep_leave(llm: Any, update: PauseAction) -> PauseAction:
    """Wake the weights, ``update`` (the reload to B and the variant's reset), wake the KV cache."""
    async def call() -> dict[str, Any]:
        t0 = time.monotonic()
        await llm.wake_up(tags=["weights"])
        facts = await update()
        await llm.wake_up(tags=["kv_cache"])
        await _asleep(llm, False, "wake_up(weights), the update, wake_up(kv_cache)")
        return {"call": "wake_up+update", **facts, "seconds": round(time.monotonic() - t0, 3)}

    return call
