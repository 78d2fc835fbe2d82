"""The oracle: pure functions that judge observed token streams (typed
:class:`harness.core.recorded_streams.StreamRecord`)
against references.  One concern a module: ``outcome`` (the outcome words, fault events), ``streams`` (one stream
decomposed into fault events), ``ambiguity`` (what the streams can prove), ``requests`` (a request's verdict),
``cells`` (a cell's verdict and label), ``pauses`` (faults at pauses: what the known-bug table predicts).

Request outcomes, from best to worst: OK, TRUNCATED, DUPLICATE(k at i),
LOSS(k at i), DIVERGED(at i), ERROR.  Cell outcomes add UNSUPPORTED and
TIMEOUT (and ERROR for infrastructure failures); a cell that ran takes the
worst outcome of its requests.

A stream is decomposed into **fault events** (:class:`FaultEvent`): between
two events the stream follows the reference shifted by the offset the events
so far add up to (a loss of k moves it k tokens on, a duplicate of k moves it
k back).  One event is the single-fault verdict of old (``LOSS(1 at 6)``);
several, e.g. one #42043 loss per keep + clear_cache pause, read
``LOSS(1 at 6; 1 at 18)`` or, mixed, ``LOSS(1 at 6); DUPLICATE(2 at 18)``.
What no sequence of shifts explains is DIVERGED at the first token that
breaks it (after the events that do explain the stream up to there).

The decomposition relies on references without repeated tokens (what a
bigram-cycle model produces): then each observed token has one place in the
reference, the events are forced and the decomposition is unique.  Two rules
decide what a shift is believed on:

* a shift is confirmed by the tokens that follow it: a run of ONE token
  between an event and an event of the opposite kind, or between an event
  and the point where the stream stops being explainable, is as much one
  wrong token (DIVERGED) as two shifts, and is read as DIVERGED at the
  event (a single misplaced token is never "LOSS then DUPLICATE");
  back-to-back events of one kind (two losses one token apart) are shifts;
* among explanations the fewest events win, then, event by event, the
  smallest shift, loss before duplicate (what single-fault verdicts always
  did).  With merely no *adjacent* repeats, a periodic reference can make a
  loss of k >= 2 look like a shorter truncation; a loss of one token is still
  found.

Any other model's reference may repeat itself (random weights fall into
loops), so every verdict is checked for what the streams can prove
(:func:`shift_ambiguity`): a stream that fits two readings at once (no fault
and a lost token, or a lost and a repeated token) is AMBIGUOUS with the
reason, never OK or LOSS.  Such a model's reference is the engine's own
no-pause run, recorded twice with different batching (``reference_repeat``);
when the two differ, the engine's numerics depend on batch composition and
a stream that matches neither is AMBIGUOUS too (:func:`reference_split`).  Across a weight swap the
token the old weights give (a frame computed before the swap) can read as a shift of the new weights'
cycle: such a shift is AMBIGUOUS as well (:func:`~harness.core.oracle.ambiguity.stale_ambiguity`).
"""

from __future__ import annotations

from harness.core.oracle.ambiguity import (
    NONDETERMINISM_HINT,
    explanations,
    readings,
    reference_split,
    shift_ambiguity,
)
from harness.core.oracle.cell_verdict import CellVerdict, cell_verdict
from harness.core.oracle.outcome import SHIFTS, FaultEvent, Outcome, events_label
from harness.core.oracle.pauses import fit_losses, predicted_stream, preempted_at_keep_clear, running_pauses
from harness.core.oracle.requests import RequestVerdict, classify_request, critical_points
from harness.core.oracle.streams import StreamVerdict, classify_stream

__all__ = [
    "NONDETERMINISM_HINT", "SHIFTS", "CellVerdict", "FaultEvent", "Outcome", "RequestVerdict", "StreamVerdict",
    "cell_verdict", "classify_request", "classify_stream", "critical_points", "events_label", "explanations",
    "fit_losses", "predicted_stream", "preempted_at_keep_clear", "readings", "reference_split", "running_pauses",
    "shift_ambiguity",
]
