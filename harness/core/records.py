"""Typed records of the harness<->repro contract, their one schema check and the migration of old files.

A cell result is a :class:`CellResult`: the cell, the oracle's outcome and short ``label`` (``LOSS(1)``), its
summary, its requests (:class:`RequestRecord`: what ``repro.scenarios.cell_run`` recorded, with the oracle's
verdict merged
in, fault events and all), the engine's self-report (:class:`EngineInfo`), the known-bug comparison
(:class:`ExpectationRecord`), for ``--repeat N`` a :class:`RepeatSummary` and, for a cell ``--retry-infra``
ran again, every :class:`Attempt`.  Objects from the engine side are kept whole, so a file
re-written by the harness holds exactly what the engine wrote.

Files carry ``schema`` and ``schema_version``; :class:`Schema.check` is the one check, and
:func:`migrate_cell` brings a cell result of any older version up to :data:`SCHEMA_VERSION`, one
``_update_to_N`` step per version (asv's results.py is the model), so every report ever committed still loads.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.core.cell import Cell, cell_from_dict
from harness.core.errors import ResultsFileError
from harness.core.oracle import FaultEvent, Outcome, events_label
from harness.core.recorded_streams import PauseRecord, pauses_of

# Version 2: cells carry the ``tier`` axis and the oracle's ``label``.
# Version 3: request verdicts carry their fault ``events`` (several per request: one per pause that lost or
# repeated tokens) and cells their ``attempts`` (``--retry-infra``; empty when the first attempt counted).
SCHEMA_VERSION = 3


@dataclass(frozen=True)
class Schema:
    """A versioned JSON document kind: what this vllm-repro writes (``version``) and reads (``oldest`` on)."""

    name: str  # "vllm-repro/results"
    version: int
    oldest: int = 1
    noun: str = "document"  # "document", "line": how an error names one
    label: str = ""  # "history ": names the version in errors ("history schema_version 7 ...")

    def check(self, obj: Any, where: str, hint: Callable[[Any], str] | None = None) -> int:
        """The schema version of ``obj``; ResultsFileError if it is not this schema or a version not read.

        ``hint(found_schema)``: text appended when the document is of another schema (e.g. "add it with …").
        """
        found = obj.get("schema") if isinstance(obj, dict) else type(obj).__name__
        if not isinstance(obj, dict) or found != self.name:
            raise ResultsFileError(f"{where}: not a {self.name} {self.noun} (schema {found!r})"
                                   f"{hint(found) if hint else ''}")
        ver = obj.get("schema_version")
        if not isinstance(ver, int) or isinstance(ver, bool) or not self.oldest <= ver <= self.version:
            newer = isinstance(ver, int) and not isinstance(ver, bool) and ver > self.version
            fix = "upgrade vllm-repro" if newer else "the file is damaged or not written by vllm-repro"
            reads = str(self.version) if self.oldest == self.version else f"{self.oldest} to {self.version}"
            raise ResultsFileError(f"{where}: {self.label}schema_version {ver!r} is not supported (this vllm-repro "
                                   f"reads {reads}); {fix}")
        return ver


RESULTS = Schema("vllm-repro/results", SCHEMA_VERSION)
LINE = Schema("vllm-repro/cell", SCHEMA_VERSION, noun="line")


# --------------------------------------------------------------------------- migration

# An outcome word and its parenthesised detail, one nesting level deep ("FLAKY(LOSS(1) 2/3)").
_LABEL = re.compile(r"^([A-Z][A-Z_-]*(?:\((?:[^()]|\([^()]*\))*\))?)")


def legacy_label(outcome: str, summary: str) -> str:
    """The label of a cell written before labels were stored: "LOSS(1)" from "LOSS(1) in 8/10 requests (…)".

    Schema-1 files (and history lines without a label) only have the summary, which the oracle starts with its
    label; anything else (an infrastructure reason) is labelled by the outcome.
    """
    m = _LABEL.match(summary or "")
    if m and m.group(1).split("(")[0] == outcome:
        return m.group(1)
    return outcome


def _update_to_2(cell: dict[str, Any]) -> dict[str, Any]:
    # The axes of schema 2 (tier: every earlier cell ran on a real engine) and the label, recovered once, here.
    axes = cell.get("cell")
    if isinstance(axes, dict):
        added = {a.name: a.default for a in Cell.table().axes if a.added_in_schema == 2 and a.name not in axes}
        axes = {**axes, **added}
    label = cell.get("label") or legacy_label(str(cell.get("outcome")), str(cell.get("summary") or ""))
    return {**cell, "cell": axes, "label": label}


def legacy_events(verdict: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The fault events of a request verdict written before they were stored: one LOSS/DUPLICATE of ``k`` at
    ``at`` (an older oracle named only the first fault, so that is all there is), else none."""
    kind, k, at = verdict.get("outcome"), verdict.get("k"), verdict.get("at")
    if kind in (Outcome.LOSS.value, Outcome.DUPLICATE.value) and isinstance(k, int) and isinstance(at, int):
        return [FaultEvent(Outcome(kind), k, at).to_dict()]
    return []


def _update_to_3(cell: dict[str, Any]) -> dict[str, Any]:
    # Fault events in every request verdict (recovered from outcome, k and at), and no retried attempts.
    out = {**cell, "attempts": cell.get("attempts") or []}
    if isinstance(cell.get("requests"), list):
        out["requests"] = [r if not isinstance(r, dict) or not isinstance(r.get("verdict"), dict)
                           or "events" in r["verdict"]
                           else {**r, "verdict": {**r["verdict"], "events": legacy_events(r["verdict"])}}
                           for r in cell["requests"]]
    return out


_UPDATES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {2: _update_to_2, 3: _update_to_3}


def migrate_cell(cell: dict[str, Any], version: int) -> dict[str, Any]:
    """A cell result's JSON form written at schema ``version``, brought up to :data:`SCHEMA_VERSION`."""
    for target in range(version + 1, SCHEMA_VERSION + 1):
        cell = _UPDATES[target](cell)
    return cell


def identity_form(cell: dict[str, Any], cell_type: type[Cell] = Cell) -> dict[str, Any]:
    """A cell result's JSON form without what migrations add when it holds the value they give.

    Run ids hash this form, so a report keeps its run id across schema versions: the label and the requests'
    fault events are left out (derived from the outcome, summary and streams, which are hashed), so are the
    attempts while there are none, and so is every axis added after schema 1 while it is at its default (a
    schema-1 cell could not have another value; harness.core.axes.Axis.added_in_schema).
    """
    axes = new_axes_off_default(cell["cell"], cell_type)
    out = {k: v for k, v in cell.items() if k != "label" and not (k == "attempts" and not v)}
    if "requests" in out:
        out["requests"] = [_without_events(r) for r in out["requests"]]
    return {**out, "cell": axes}


def _without_events(request: Any) -> Any:
    verdict = request.get("verdict") if isinstance(request, dict) else None
    if not isinstance(verdict, dict) or "events" not in verdict:
        return request
    return {**request, "verdict": {k: v for k, v in verdict.items() if k != "events"}}


def new_axes_off_default(axes: Mapping[str, Any], cell_type: type[Cell] = Cell) -> dict[str, Any]:
    """A cell's JSON axes without those added after schema 1 while they hold their default (old forms)."""
    table = cell_type.table()
    return {k: v for k, v in axes.items() if k not in table.after_v1 or v != table.by_name[k].default}


# --------------------------------------------------------------------------- injection ids


def inject_ids(value: Any) -> tuple[str, ...]:
    """Fault ids from a meta/engine ``inject`` entry: a list, a comma-separated string, or {"requested": …}."""
    if not value:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, dict):
        return inject_ids(value.get("requested") or sorted(value.get("applied") or {}))
    if isinstance(value, list | tuple):
        return tuple(dict.fromkeys(i for v in value for i in inject_ids(v)))
    return (str(value),)


def known_cell(axes: Mapping[str, Any], cell_type: type[Cell] = Cell) -> Cell:
    """The Cell of a JSON cell object; ValueError naming an axis value this vllm-repro does not know.

    (A file from a newer vllm-repro may hold one; its id could not be spelled, so it is refused here, with the
    file and line named by the caller, rather than failing later in a view.)
    """
    cell = cell_from_dict(dict(axes), cell_type)
    for a in cell_type.table().axes:
        value = getattr(cell, a.attr)
        if a.values and value not in a.values:
            raise ValueError(f"unknown {a.name} {value!r} (this vllm-repro knows {', '.join(map(str, a.values))})")
    return cell


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, eq=False)
class _RawRecord(Mapping[str, Any]):
    # A JSON object from the engine side, kept whole (written back byte for byte) and read as a mapping; it
    # equals any mapping with the same items.  Subclasses add typed properties for what the harness reads.
    raw: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def _str(self, key: str) -> str | None:
        value = self.raw.get(key)
        return None if value is None else str(value)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)


@dataclass(frozen=True, eq=False)
class EngineInfo(_RawRecord):
    """An engine's self-report (``repro.engine.main``'s ``engine`` event), typed where the harness reads it.

    The report is open-ended (its ``probe`` varies with the vLLM version), so the whole of it is kept in
    ``raw`` and written back unchanged; it also reads as that mapping.
    """

    @property
    def vllm_version(self) -> str | None:
        return self._str("vllm_version")

    @property
    def torch_version(self) -> str | None:
        return self._str("torch_version")

    @property
    def device_name(self) -> str | None:
        return self._str("device_name")

    @property
    def platform(self) -> str | None:
        return self._str("platform")

    @property
    def effective(self) -> Mapping[str, Any]:
        """The settings the engine actually ran with (``async_scheduling``, ``executor_class``, …)."""
        return _dict(self.raw.get("effective"))

    @property
    def settings(self) -> tuple[Mapping[str, Any], ...]:
        """Every setting the engine relied on: requested (and by whom), effective, where it was read back, and its
        status (``effective``, ``differs``, ``unverifiable``, ``default``; repro.settings.declared)."""
        rows = self.effective.get("settings")
        return tuple(r for r in rows if isinstance(r, Mapping)) if isinstance(rows, list) else ()

    @property
    def effective_async(self) -> bool | None:
        return self.effective.get("async_scheduling")

    @property
    def executor_class(self) -> str | None:
        value = self.effective.get("executor_class")
        return None if value is None else str(value)

    @property
    def probe(self) -> Mapping[str, Any]:
        return _dict(self.raw.get("probe"))

    @property
    def inject(self) -> tuple[str, ...]:
        """Fault ids the engine reported as requested (top level or in its engine-core probe)."""
        core = _dict(self.probe.get("core"))
        return tuple(dict.fromkeys(inject_ids(self.raw.get("inject")) + inject_ids(core.get("inject"))))


@dataclass(frozen=True)
class RequestVerdictRecord:
    """The oracle's verdict on one request as stored (harness.core.oracle.RequestVerdict.to_dict)."""

    outcome: str | None  # "OK", "LOSS", …
    label: str | None = None  # "LOSS(1 at 12)"
    at: int | None = None
    k: int | None = None
    detail: str = ""
    running_at_pause: bool = False
    pause_index: int | None = None
    first_post_resume: Mapping[str, Any] | None = None  # {"index", "expected", "observed"}
    events: tuple[FaultEvent, ...] = ()  # every loss or duplicate, in stream order

    @property
    def short(self) -> str:
        """``LOSS(1)``: the outcome with the tokens lost or duplicated; ``LOSS(1; 1)`` for one loss at each of two
        points (what the known-bug table expects)."""
        if len(self.events) > 1 and self.outcome in (Outcome.LOSS.value, Outcome.DUPLICATE.value):
            return events_label(self.events, with_index=False)
        return str(self.outcome) if self.k is None else f"{self.outcome}({self.k})"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RequestVerdictRecord:
        fpr = d.get("first_post_resume")
        events = d["events"] if isinstance(d.get("events"), list) else legacy_events(d)
        return cls(d.get("outcome"), d.get("label"), d.get("at"), d.get("k"), str(d.get("detail") or ""),
                   bool(d.get("running_at_pause")), d.get("pause_index"),
                   fpr if isinstance(fpr, Mapping) else None, tuple(FaultEvent.from_dict(e) for e in events))


@dataclass(frozen=True, eq=False)
class RequestRecord(_RawRecord):
    """One request as ``repro.scenarios.cell_run`` recorded it (prompt, reference and observed tokens, pauses,
    timings), with
    the oracle's verdict merged in under ``"verdict"``; kept whole, typed where the harness reads it."""

    @property
    def rid(self) -> str | None:
        return self._str("rid")

    @property
    def submit(self) -> Any:
        """``"start"``, or where it was submitted: ``["during", 0]``, ``["after", 1]``."""
        return self.raw.get("submit")

    @property
    def observed(self) -> list[int] | None:
        return self.raw.get("observed")

    @property
    def reference(self) -> list[int] | None:
        return self.raw.get("reference")

    @property
    def pauses(self) -> tuple[PauseRecord, ...]:
        """The pauses it was submitted and unfinished at (read leniently: older reports lack fields)."""
        return pauses_of(self.raw.get("pauses"))

    @property
    def verdict(self) -> RequestVerdictRecord | None:
        v = self.raw.get("verdict")
        return RequestVerdictRecord.from_dict(v) if isinstance(v, Mapping) else None


@dataclass(frozen=True)
class ExpectationRecord:
    """A cell result compared with the known-bug table (harness.verdicts.known_bugs.check)."""

    status: str | None  # "as expected", "UNEXPECTED", "not run", "known crash"
    expected: str | None = None  # "LOSS(1)", "OK"
    bug: str | None = None  # "vllm#42043", "vllm#42043 (injected)"
    message: str | None = None

    def describe(self) -> str:
        """``as expected (vllm#42043)``, ``UNEXPECTED (expected LOSS(1) from vllm#42043)`` or the status."""
        if self.status == "UNEXPECTED":
            return f"UNEXPECTED (expected {self.expected}" + (f" from {self.bug})" if self.bug else ")")
        if self.status in ("as expected", "known crash") and self.bug:
            return f"{self.status} ({self.bug})"
        return str(self.status or "")

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "expected": self.expected, "bug": self.bug, "message": self.message}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExpectationRecord:
        return cls(d.get("status"), d.get("expected"), d.get("bug"), d.get("message"))


@dataclass(frozen=True)
class RepeatSummary:
    """``--repeat N``: the outcome of each of the N runs of a cell, counted and as fractions."""

    n: int
    outcomes: Mapping[str, int]  # {"OK": 4, "LOSS": 1}
    fractions: Mapping[str, float] = field(default_factory=dict)
    runs: tuple[str, ...] = ()  # each run's summary

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "outcomes": dict(self.outcomes), "fractions": dict(self.fractions),
                "runs": list(self.runs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RepeatSummary:
        return cls(int(d["n"]), dict(d.get("outcomes") or {}), dict(d.get("fractions") or {}),
                   tuple(d.get("runs") or ()))


@dataclass(frozen=True)
class Attempt:
    """One attempt at a cell (``--retry-infra N``): what it came to and where its engine's files are.

    A cell that was retried lists every attempt, the one its result is taken from last.
    """

    n: int  # 1-based
    outcome: str  # "ERROR", "TIMEOUT", "OK", …
    label: str = ""
    summary: str = ""
    reason: str | None = None
    duration_s: float | None = None  # the cell's scenario, as in CellResult
    elapsed_s: float | None = None  # from the start of this attempt's engine to the cell's result
    started: str | None = None  # ISO time the attempt's engine started
    engine_dir: str | None = None  # spec, event log and vLLM log of this attempt's engine

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "outcome": self.outcome, "label": self.label, "summary": self.summary,
                "reason": self.reason, "duration_s": self.duration_s, "elapsed_s": self.elapsed_s,
                "started": self.started, "engine_dir": self.engine_dir}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Attempt:
        return cls(int(d["n"]), str(d["outcome"]), str(d.get("label") or ""), str(d.get("summary") or ""),
                   d.get("reason"), d.get("duration_s"), d.get("elapsed_s"), d.get("started"), d.get("engine_dir"))


def _record(value: Any, kind: type[Any]) -> Any:
    # The JSON form of a record is read into it; a record or None is kept as it is.
    if value is None or isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{kind.__name__} from {type(value).__name__}, not an object")
    return kind(value) if issubclass(kind, _RawRecord) else kind.from_dict(value)


@dataclass(frozen=True)
class CellResult:
    """One cell's result.  ``requests``, ``engine``, ``expectation`` and ``repeats`` may be given in their JSON
    form, which is read into the records."""

    cell: Cell
    outcome: Outcome
    summary: str
    reason: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    requests: tuple[RequestRecord, ...] = ()
    engine: EngineInfo | None = None  # versions, device, requested/effective settings
    duration_s: float | None = None
    expectation: ExpectationRecord | None = None
    repeats: RepeatSummary | None = None
    label: str = ""  # the oracle's short label, "LOSS(1)", "FLAKY"; "" = the outcome
    attempts: tuple[Attempt, ...] = ()  # --retry-infra: every attempt when there was more than one

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(_record(r, RequestRecord) for r in self.requests))
        object.__setattr__(self, "attempts", tuple(_record(a, Attempt) for a in self.attempts))
        object.__setattr__(self, "engine", _record(self.engine, EngineInfo))
        object.__setattr__(self, "expectation", _record(self.expectation, ExpectationRecord))
        object.__setattr__(self, "repeats", _record(self.repeats, RepeatSummary))
        if not self.label:
            object.__setattr__(self, "label", self.outcome.value)

    @property
    def id(self) -> str:
        return self.cell.id

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cell": self.cell.to_dict(),
            "outcome": self.outcome.value,
            "label": self.label,
            "summary": self.summary,
            "reason": self.reason,
            "counts": self.counts,
            "requests": [r.to_dict() for r in self.requests],
            "engine": self.engine.to_dict() if self.engine is not None else None,
            "duration_s": self.duration_s,
            "expectation": self.expectation.to_dict() if self.expectation is not None else None,
            "repeats": self.repeats.to_dict() if self.repeats is not None else None,
            "attempts": [a.to_dict() for a in self.attempts],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CellResult:
        """A cell result from its current JSON form (older forms go through :func:`migrate_cell` first)."""
        return cls(
            cell=known_cell(d["cell"]),
            outcome=Outcome(d["outcome"]),
            summary=d["summary"],
            reason=d.get("reason"),
            counts=dict(d.get("counts") or {}),
            requests=tuple(d.get("requests") or ()),
            engine=d.get("engine"),
            duration_s=d.get("duration_s"),
            expectation=d.get("expectation"),
            repeats=d.get("repeats"),
            label=str(d.get("label") or ""),
            attempts=tuple(d.get("attempts") or ()),
        )
