"""Scenarios: one module per pause mode or known bug; each exposes ``build(sid, params, vocab, seed) -> Plan``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from repro.scenarios import abort, keep, plan, wait
from repro.scenarios.base import Plan

SCENARIOS: dict[str, Callable[[str, dict[str, Any], int, int], Plan]] = {
    "keep": keep.build,
    "wait": wait.build,
    "abort": abort.build,
    "plan": plan.build,
}
