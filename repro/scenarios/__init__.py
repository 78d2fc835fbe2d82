"""Scenarios: one module per pause mode or known bug; each exposes ``build(sid, params, vocab, seed) -> Plan``.

A scenario that must act on the engine beyond pausing it (weight sync swaps
its weights) also has a runner in ``RUNNERS``, which ``repro.cell.run_scenario`` calls
instead of the generic reference-then-plan run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from repro.scenarios import abort, keep, plan, rlhf_weight_sync, wait
from repro.scenarios.base import EngineContext, Plan

SCENARIOS: dict[str, Callable[[str, dict[str, Any], int, int], Plan]] = {
    "keep": keep.build,
    "wait": wait.build,
    "abort": abort.build,
    "plan": plan.build,
    "weight_sync": rlhf_weight_sync.build,
}

RUNNERS: dict[str, Callable[[Any, dict[str, Any], EngineContext, float], Awaitable[dict[str, Any]]]] = {
    "weight_sync": rlhf_weight_sync.run,
}
