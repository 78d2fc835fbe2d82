"""Faults at pauses: which pauses a request was running at, where vLLM #42043 drops a token, and the streams
such losses predict (the known-bug table and the schedule tests compare a stream with these)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

from harness.core.recorded_streams import PauseRecord


def predicted_stream(reference: Sequence[int], loss_points: Sequence[int], n: int) -> list[int]:
    """The stream a request shows when it loses one token at each observed index in ``loss_points``.

    ``loss_points`` are positions in the *observed* stream (e.g. the pause
    index of each keep+clear_cache pause the request was preempted at); the
    stream is cut to ``n`` tokens.  With no loss points it is ``reference[:n]``.
    """
    points = sorted(loss_points)
    out: list[int] = []
    r = 0
    for i in range(n):
        while points and points[0] == i:
            points.pop(0)
            r += 1
        if r >= len(reference):
            break
        out.append(reference[r])
        r += 1
    return out


def running_pauses(pauses: Sequence[PauseRecord]) -> list[PauseRecord]:
    """The pauses of a request at which it was running in the engine, in order: what a fault per pause hits.

    ``pauses``: a record's, every pause the request was submitted and unfinished at.  Left out: a keep pause whose
    resume found it finished (its last token came before the pause: nothing after it to lose), and a pause
    at which the engine held it queued: for a keep pause with clear_cache (the cache reset preempts every
    *running* request) its preemption count did not go up, otherwise the engine reported it ``WAITING``.
    """
    out = []
    seen = 0
    for p in pauses:
        count, status = p.engine_preemptions, p.engine_status or ""
        if count is not None and p.mode == "keep" and p.clear_cache:
            running, seen = count > seen, max(seen, count)
        else:
            running = not status.startswith("WAITING")
            seen = max(seen, count or 0)
        if running and not (p.mode == "keep" and p.frozen is False):
            out.append(p)
    return out


def preempted_at_keep_clear(pauses: Sequence[PauseRecord]) -> list[int]:
    """Observed indices at which vLLM #42043 drops a token from the request paused at ``pauses``.

    One per keep-mode pause with clear_cache=True at which the cache reset
    force-preempted the request, i.e. it was running: the engine's preemption
    count for it went up at that pause.  A request still queued (never
    scheduled, or not yet rescheduled after an earlier pause) is not touched.
    """
    out = []
    seen = 0
    for p in pauses:
        count = p.engine_preemptions
        if count is None:
            preempted = "PREEMPTED" in (p.engine_status or "")
        else:
            preempted, seen = count > seen, max(seen, count)
        if preempted and p.mode == "keep" and p.clear_cache and p.client_tokens is not None:
            out.append(p.client_tokens)
    return out


def fit_losses(
    reference: Sequence[int], observed: Sequence[int], n: int, points: Sequence[int]
) -> dict[int, int] | None:
    """How many tokens were lost at each point, if ``observed`` is explained by losses at ``points`` only.

    ``points`` may repeat an index (a request preempted by two keep+clear
    pauses with no token delivered in between).  Each distinct index must have
    lost at least one and at most as many tokens as it appears: back-to-back
    preemptions lose one token, or two when no frame was in flight to absorb
    the second discard.  Returns {index: tokens lost} or None.
    """
    counts = Counter(points)
    idx = sorted(counts)
    for combo in itertools.product(*(range(1, counts[i] + 1) for i in idx)):
        drops = [i for i, k in zip(idx, combo, strict=True) for _ in range(k)]
        if list(observed) == predicted_stream(reference, drops, n):
            return dict(zip(idx, combo, strict=True))
    return None
