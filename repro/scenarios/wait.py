"""Wait-mode pause: in-flight requests drain to completion before the pause
returns; requests submitted during the pause start after resume, so their
first token is the first post-resume token.
"""

from __future__ import annotations

from typing import Any

from repro.scenarios._common import SinglePauseParams, single_pause_plan
from repro.scenarios.vocab import Plan

MODE = "wait"


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    return single_pause_plan(sid, MODE, SinglePauseParams.from_dict(params), vocab_size, seed, "during")
