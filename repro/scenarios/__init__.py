"""Scenarios: one module per pause mode or known bug; each exposes ``build(sid, params, vocab, seed) -> Plan``.

A scenario that must act on the engine beyond pausing it (weight sync swaps
its weights), or whose reference is not the engine's plain no-pause run (the
engine-profile scenarios: preempt, chunked, sleep, spec_ngram, spec_ngram_pause;
see ``repro/scenarios/_profile.py``), also has a runner in ``RUNNERS``, which
``repro.cell.run_scenario`` calls instead of the generic reference-then-plan run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from repro.scenarios import abort, chunked, keep, plan, preempt, rlhf_weight_sync, sleep, spec_ngram, wait
from repro.scenarios.base import EngineContext, Plan

SCENARIOS: dict[str, Callable[[str, dict[str, Any], int, int], Plan]] = {
    "keep": keep.build,
    "wait": wait.build,
    "abort": abort.build,
    "plan": plan.build,
    "weight_sync": rlhf_weight_sync.build,
    "preempt": preempt.build,
    "chunked": chunked.build,
    "sleep": sleep.build,
    "spec_ngram": spec_ngram.build,
    "spec_ngram_pause": spec_ngram.build_pause,
}

RUNNERS: dict[str, Callable[[Any, dict[str, Any], EngineContext, float], Awaitable[dict[str, Any]]]] = {
    "weight_sync": rlhf_weight_sync.run,
    "preempt": preempt.run,
    "chunked": chunked.run,
    "sleep": sleep.run,
    "spec_ngram": spec_ngram.run,
    "spec_ngram_pause": spec_ngram.run_pause,
}
