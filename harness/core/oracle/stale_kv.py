"""Stale KV across a weight update (issue 37): a request judged by what its kind promises.

The stale-kv scenarios (``repro.scenarios.stale_kv``) give every request ``stale_kv`` facts
(:class:`harness.core.recorded_streams.StaleKvRecord`): its kind and the stream that reading KV the old weights
wrote gives
(the context-cell model's oracle, ``repro.models.context_cell.expected_continuation``).  Its ``reference`` is what fresh
KV gives.  A stream that is not its reference but is, token for token, the stale stream, is

* STALE-KV for a request started after the update (``new``): it must never read the old weights' KV;
* OK for a request kept in flight across a keep pause without a reset (``kept``): it continues on the KV it holds,
  which the old weights wrote, by design (a partial rollout); the detail says so.

Anything else keeps the verdict the stream has against its reference (DIVERGED, LOSS, ...).  Every verdict's
detail names the request's kind.
"""

from __future__ import annotations

from dataclasses import replace

from harness.core.oracle.outcome import Outcome
from harness.core.oracle.streams import StreamVerdict, classify_stream
from harness.core.recorded_streams import StreamRecord

KIND_TEXT = {
    "new": "started after the weight update (must read fresh KV)",
    "kept": "kept in flight across the keep pause without a reset (may continue on the old weights' KV)",
    "before": "ran under the old weights before the update",
}


def stale_kv_verdict(record: StreamRecord, v: StreamVerdict) -> StreamVerdict:
    """``v``, the stream's verdict against its fresh reference, read by what the request's kind promises."""
    s = record.stale_kv
    if s is None or v.outcome is Outcome.ERROR:
        return v
    kind = KIND_TEXT[s.kind]
    cached = "" if s.cached_tokens is None else f"; {s.cached_tokens} prompt tokens from the prefix cache"
    if v.outcome is not Outcome.OK and s.stale and classify_stream(
            s.stale, record.observed, expected_len=record.max_tokens).outcome is Outcome.OK:
        at = next((i for i, (a, b) in enumerate(zip(s.stale, record.reference, strict=False)) if a != b), 0)
        if s.kind == "kept":
            return StreamVerdict(Outcome.OK, detail=f"{kind}: continued on the KV the old weights wrote from token "
                                                    f"{at} (allowed){cached}")
        return StreamVerdict(Outcome.STALE_KV, at, detail=f"{kind}: follows the KV the old weights wrote from token "
                                                          f"{at}{cached}")
    what = "fresh KV" if v.outcome is Outcome.OK else v.detail or v.label
    return replace(v, detail=f"{kind}: {what}{cached}")
