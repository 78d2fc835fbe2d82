"""Abort-mode pause: in-flight requests end with finish_reason "abort" and must
be a prefix of their reference; requests submitted after resume are checked
from token 0.
"""

from __future__ import annotations

from typing import Any

from repro.scenarios._common import SinglePauseParams, single_pause_plan
from repro.scenarios.vocab import Plan

MODE = "abort"


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    return single_pause_plan(sid, MODE, SinglePauseParams.from_dict(params), vocab_size, seed, "after")
