"""One request's token stream as the engine side recorded it (``repro.scenarios.cell_run``, ``repro.sched``), typed.

A scenario event's ``records`` are parsed once, where the engine's event lines are read
(``harness.core.events``), into :class:`StreamRecord`: the oracle (``harness.core.oracle``) judges these, never
the JSON.  :func:`StreamRecord.from_json` is the one check of what the oracle reads: a record without a
token stream it can judge is a :class:`~harness.core.errors.MalformedEvent`.  Each record keeps the JSON
object whole in ``raw`` (prompt, timings, frames, ...), so a results file holds exactly what the engine wrote.

Pauses and in-flight operations are read leniently (:func:`pauses_of`): a report written by an older
vllm-repro is read through the same types, and a field it lacks is None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.errors import MalformedEvent


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class PauseRecord:
    """One pause a request was submitted and unfinished at (``repro.scenarios.vocab``; the scheduler tier's
    drained resets and aborts too): where its stream stood and what the engine said of it."""

    mode: str | None  # "keep", "wait", "abort"
    clear_cache: bool
    client_tokens: int | None  # tokens the client had received when the pause began
    engine_status: str | None = None  # the scheduler's view after the pause ("PREEMPTED", "WAITING", ...)
    engine_preemptions: int | None = None  # the engine's preemption count of the request after the pause
    # keep mode: still frozen inside the engine at resume (None: not recorded, as in older reports).
    frozen: bool | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PauseRecord:
        frozen = d.get("frozen")
        return cls(_opt_str(d.get("mode")), bool(d.get("clear_cache")), _opt_int(d.get("client_tokens")),
                   _opt_str(d.get("engine_status")), _opt_int(d.get("engine_preemptions")),
                   frozen if isinstance(frozen, bool) else None)


@dataclass(frozen=True)
class InterruptRecord:
    """One in-flight operation with no pause (``reset`` or ``abort``) the request was running through."""

    op: str | None  # "reset", "abort"
    target: bool  # aborted (abort) or preempted (reset); False: it kept running through others' abort
    client_tokens: int | None  # when the operation was called

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> InterruptRecord:
        return cls(_opt_str(d.get("op")), bool(d.get("target")), _opt_int(d.get("client_tokens")))


STALE_KV_KINDS = ("new", "kept", "before")


@dataclass(frozen=True)
class StaleKvRecord:
    """A request of a stale-kv scenario (``repro.scenarios.stale_kv``, issue 37): which kind it is across the weight
    update, and the stream that reading KV the old weights wrote gives (empty: none of it could be reused)."""

    kind: str  # "new": started after the update; "kept": in flight across a keep pause; "before": ran before it
    stale: tuple[int, ...]
    cached_tokens: int | None = None  # vLLM's num_cached_tokens for the request

    @classmethod
    def from_json(cls, d: Any, what: str) -> StaleKvRecord | None:
        if d is None:
            return None
        if not isinstance(d, Mapping) or d.get("kind") not in STALE_KV_KINDS:
            raise MalformedEvent(f"{what}: field 'stale_kv' needs a kind of {', '.join(STALE_KV_KINDS)}")
        return cls(str(d["kind"]), _tokens(d, "stale", what), _opt_int(d.get("num_cached_tokens")))


def pauses_of(value: Any) -> tuple[PauseRecord, ...]:
    """The pauses of a record's ``pauses`` list (anything else: none)."""
    return tuple(PauseRecord.from_json(p) for p in value if isinstance(p, Mapping)) if isinstance(value, list) \
        else ()


def interrupts_of(value: Any) -> tuple[InterruptRecord, ...]:
    """The operations of a record's ``interrupts`` list (anything else: none)."""
    return tuple(InterruptRecord.from_json(i) for i in value if isinstance(i, Mapping)) \
        if isinstance(value, list) else ()


def _tokens(d: Mapping[str, Any], key: str, what: str) -> tuple[int, ...]:
    value = d.get(key)
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise MalformedEvent(f"{what}: field {key!r} is not a list of token ids ({type(value).__name__})")
    return tuple(value)


@dataclass(frozen=True)
class StreamRecord:
    """One request of a scenario that ran: its reference and observed tokens, pauses and operations."""

    rid: str
    reference: tuple[int, ...]  # the engine's own no-pause stream (or the model's known one)
    observed: tuple[int, ...]  # what the client received
    max_tokens: int
    raw: Mapping[str, Any]  # the record as the engine wrote it (results keep it whole)
    pauses: tuple[PauseRecord, ...] = ()
    interrupts: tuple[InterruptRecord, ...] = ()
    # "start", or where it was submitted: ("during", 0), ("after", 1), ("tokens", 8), ...
    submit: str | tuple[Any, ...] | None = "start"
    finish_reason: str | None = None
    error: str | None = None
    # The no-pause reference recorded a second time, batched as the paused run (models not known in advance).
    reference_repeat: tuple[int, ...] | None = None
    reference_matches_model: bool = True  # False: the engine does not run the model the oracle assumes
    num_preemptions: int | None = None  # the scheduler tier: vLLM's count for the request
    # A weight swap (the weight-sync scenario): (swap index, the token the weights before the swap give there).
    stale: tuple[int, int] | None = None
    stale_kv: StaleKvRecord | None = None  # a stale-kv scenario's request

    @property
    def submitted_at_start(self) -> bool:
        return self.submit in ("start", None)

    @classmethod
    def from_json(cls, d: Any) -> StreamRecord:
        """The record in ``d``; MalformedEvent when it is not one the oracle can judge."""
        if not isinstance(d, Mapping):
            raise MalformedEvent(f"request record is {type(d).__name__}, not an object")
        rid = d.get("rid")
        what = f"request record {rid!r}"
        if not isinstance(rid, str):
            raise MalformedEvent(f"{what}: field 'rid' is not a string")
        max_tokens = _opt_int(d.get("max_tokens"))
        if max_tokens is None:
            raise MalformedEvent(f"{what}: field 'max_tokens' is not an integer")
        submit = d.get("submit", "start")
        error = d.get("error")
        return cls(rid, _tokens(d, "reference", what), _tokens(d, "observed", what), max_tokens, d,
                   pauses_of(d.get("pauses")), interrupts_of(d.get("interrupts")),
                   tuple(submit) if isinstance(submit, list) else _opt_str(submit),
                   _opt_str(d.get("finish_reason")), str(error) if error else None,
                   _tokens(d, "reference_repeat", what) if d.get("reference_repeat") is not None else None,
                   bool(d.get("reference_matches_model", True)), _opt_int(d.get("num_preemptions")),
                   _stale_of(d.get("weight_sync")), StaleKvRecord.from_json(d.get("stale_kv"), what))


def _stale_of(value: Any) -> tuple[int, int] | None:
    """(swap index, the old weights' token there) of a weight-sync record; None for others and older reports."""
    if not isinstance(value, Mapping):
        return None
    at, token = _opt_int(value.get("swap_index")), _opt_int(value.get("stale_first_post_swap"))
    return None if at is None or token is None else (at, token)


def stream_records(value: Any) -> tuple[StreamRecord, ...]:
    """A scenario's ``records`` list, each checked (MalformedEvent naming the first bad one)."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise MalformedEvent(f"records is {type(value).__name__}, not a list")
    return tuple(StreamRecord.from_json(r) for r in value)
