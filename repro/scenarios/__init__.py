"""Scenarios: one module per pause mode or known bug; each exposes ``build(sid, params, vocab, seed) -> Plan``.

A scenario that must act on the engine during a pause (weight sync swaps its
weights, manual reset resets the prefix cache) also has a runner in ``RUNNERS``,
which ``repro.cell.run_scenario`` calls instead of the generic reference-then-plan
run.  The harness names them by the catalogue (``harness.core.scenarios``) with
``-`` spelled ``_``; ``manual-reset-reload`` runs as ``weight_sync`` with
``explicit_reset``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from repro.scenarios import abort, abort_some, keep, manual_reset, plan, reset_inflight, rlhf_weight_sync, wait
from repro.scenarios.base import EngineContext, Plan

SCENARIOS: dict[str, Callable[[str, dict[str, Any], int, int], Plan]] = {
    "keep": keep.build,
    "wait": wait.build,
    "abort": abort.build,
    "plan": plan.build,
    "weight_sync": rlhf_weight_sync.build,
    "reset_inflight": reset_inflight.build,
    "manual_reset": manual_reset.build,
    "abort_some": abort_some.build,
}

RUNNERS: dict[str, Callable[[Any, dict[str, Any], EngineContext, float], Awaitable[dict[str, Any]]]] = {
    "weight_sync": rlhf_weight_sync.run,
    "manual_reset": manual_reset.run,
}


def pauses(scenario: str, params: dict[str, Any], vocab_size: int) -> bool:
    """Whether the scenario pauses the engine (a vLLM without pause modes cannot run it).

    Runners pause (weight sync, manual reset); a plan that cannot be built counts as pausing, so its
    error is reported where it always was, by the scenario itself.
    """
    if scenario in RUNNERS or scenario not in SCENARIOS:
        return True
    try:
        return bool(SCENARIOS[scenario]("probe", params, vocab_size, 0).pauses)
    except (ValueError, TypeError, KeyError):
        return True
