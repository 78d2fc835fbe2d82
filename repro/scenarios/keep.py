"""Keep-mode pause: running requests are frozen mid-decode and resumed.

The first token each frozen request receives after resume must be
reference[pause_index].  With async scheduling and clear_cache=True, vLLM
0.17-0.21 force-preempts the frozen requests and discards the next "in-flight"
frame, which does not exist after a keep pause: the first real post-resume
token is lost (vLLM #42043, fixed by PR #42117 in 0.22.0).  Requests
submitted during the pause start after resume and must be unaffected.
"""

from __future__ import annotations

from typing import Any

from repro.scenarios._common import SinglePauseParams, single_pause_plan
from repro.scenarios.vocab import Plan

MODE = "keep"


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    return single_pause_plan(sid, MODE, SinglePauseParams.from_dict(params), vocab_size, seed, "during")
