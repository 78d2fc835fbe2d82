"""The events an engine or scheduler-tier process writes, typed: parsed once, where their lines are read.

``python -m repro.engine`` and ``python -m repro.sched`` append one JSON event per line (``repro.core.wire``
describes them).  :func:`parse_line` turns a line into one :data:`Event` (a union of frozen dataclasses, one per
event kind); :func:`parse_event` is the one schema check: ``repro.core.wire.check_event`` (the fields the harness
relies on), then each kind's fields read into their types, a scenario's request records into
:class:`harness.core.recorded_streams.StreamRecord`.  A line that fails it is a :class:`CorruptEvent` carrying the
line and
the :class:`~harness.core.errors.MalformedEvent`'s message, never judged.  Every event keeps its JSON object in
``raw`` (what progress lines and logs show).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import MalformedEvent
from harness.core.recorded_streams import StreamRecord, stream_records
from harness.core.records import EngineInfo
from repro.core.wire import WireError, check_event

# The facts of an ``engine`` event kept in every cell result.
_ENGINE_FACTS = ("vllm_version", "torch_version", "python", "platform", "platform_class", "device_name", "model",
                 "requested", "effective", "startup_s", "probe", "engine_kwargs")
# The facts of a ``sched`` event kept in every cell result (the release's scheduler API as detected).
_SCHED_FACTS = ("vllm_version", "torch_version", "python", "platform", "scheduler_classes", "discard_mechanism",
                "reset_prefix_cache_params", "pause_state", "import_s", "load_s", "unsupported_reason")


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _obj(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class StartEvent:
    """The process is up: its process group (the harness kills the whole group)."""

    pgid: int
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind = "start"


@dataclass(frozen=True)
class EngineEvent:
    """An engine's start-up facts: versions, platform, requested and *effective* settings."""

    info: EngineInfo  # what every cell result of the engine keeps
    unsupported_reason: str | None = None  # decided before start-up (e.g. no keep mode): no engine started
    started: bool | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind = "engine"


@dataclass(frozen=True)
class SchedEvent:
    """A scheduler-tier process's start-up facts: the release's scheduler API as detected."""

    info: EngineInfo  # what every cell result of the process keeps (``tier`` "scheduler")
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind = "sched"


@dataclass(frozen=True)
class Precondition:
    """An engine-profile scenario's evidence that its event happened (``repro/scenarios/_profile.py``)."""

    met: bool
    what: str = ""
    strict: bool = False  # unmet: the cell is not judged at all, a wrong stream included (the client door)

    @classmethod
    def from_json(cls, value: Any) -> Precondition | None:
        """The precondition of a scenario event's ``precondition`` object (None: the scenario states none)."""
        if not isinstance(value, Mapping):
            return None
        return cls(bool(value.get("met")), str(value.get("what") or ""), bool(value.get("strict")))


@dataclass(frozen=True)
class ScenarioEvent:
    """One scenario's result: ``status`` (``repro.core.wire.SCENARIO_STATUSES``), its request records where it ran."""

    id: str
    status: str  # "ran", "unsupported", "timeout", "error", "crash"
    records: tuple[StreamRecord, ...] = ()
    reason: str | None = None
    duration_s: float | None = None
    precondition: Precondition | None = None
    engine_recovered: bool = False  # a timed-out scenario after which the engine still answered
    # The scheduler tier: the class vLLM built, the drafter it accepted, a stall, where vLLM raised.
    scheduler_class: str | None = None
    spec_method: str | None = None
    stalled: str | None = None
    vllm_source: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind = "scenario"


@dataclass(frozen=True)
class FuzzEvent:
    """The answer to a spec's ``fuzz``: what the state machine ran, and its falsifying example (raw: its script
    and failure; ``replay``: that script replayed as an ``ops`` scenario, parsed)."""

    status: str  # "ran", "unsupported", "error"
    examples: int = 0
    seed: int | None = None
    examples_to_failure: int | None = None
    wall_s: float = 0.0
    cpu_s: float | None = None
    falsifying: Mapping[str, Any] | None = None
    replay: ScenarioEvent | None = None
    reason: str | None = None
    coverage: dict[str, Any] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    hypothesis_version: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    # coverage.py's measure of vLLM's scheduler files (repro.sched.reach): {} when not asked for
    reach: dict[str, Any] = field(default_factory=dict)
    kind = "fuzz"


@dataclass(frozen=True)
class FatalEvent:
    """The process failed outside any scenario (its reason and traceback)."""

    reason: str
    traceback: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind = "fatal"


@dataclass(frozen=True)
class DoneEvent:
    """The process finished every scenario."""

    wall_s: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind = "done"


@dataclass(frozen=True)
class TurnEvent:
    """A gated engine got its turn at the scenarios after ``waited_s`` seconds started up (harness.run.turns)."""

    waited_s: float
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind = "turn"


@dataclass(frozen=True)
class CorruptEvent:
    """A line that is not JSON, or not an event the wire format describes: shown, never judged."""

    line: str
    error: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind = "corrupt"


Event = (StartEvent | EngineEvent | SchedEvent | ScenarioEvent | FuzzEvent | FatalEvent | DoneEvent | TurnEvent
         | CorruptEvent)


def parse_line(line: str) -> Event:
    """One line of an event file as its event; a line that fails the check is a CorruptEvent."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return CorruptEvent(line[:200])
    try:
        return parse_event(obj)
    except MalformedEvent as exc:
        return CorruptEvent(line[:200], str(exc))


def parse_event(obj: Any) -> Event:
    """The event in the JSON object ``obj``; MalformedEvent when it is not one ``repro.core.wire`` describes."""
    if not isinstance(obj, Mapping):
        raise MalformedEvent(f"event is {type(obj).__name__}, not an object")
    try:
        check_event(obj)
    except WireError as exc:
        raise MalformedEvent(str(exc)) from exc
    return _PARSERS[obj["event"]](obj)


def engine_facts(ev: Mapping[str, Any]) -> EngineInfo:
    """The facts of an ``engine`` event kept in every cell result."""
    return EngineInfo({k: ev.get(k) for k in _ENGINE_FACTS})


def sched_facts(ev: Mapping[str, Any]) -> EngineInfo:
    """The facts of a ``sched`` event kept in every cell result (``tier`` "scheduler", the fields it has)."""
    return EngineInfo({"tier": "scheduler", **{k: ev.get(k) for k in _SCHED_FACTS if k in ev}})


def _engine(ev: Mapping[str, Any]) -> EngineEvent:
    started = ev.get("started")
    return EngineEvent(engine_facts(ev), _str(ev.get("unsupported_reason")),
                       started if isinstance(started, bool) else None, ev)


def scenario_event(ev: Mapping[str, Any]) -> ScenarioEvent:
    """A ``scenario`` event (checked by ``repro.core.wire`` already) with its records read."""
    records = stream_records(ev["records"]) if ev["status"] == "ran" else _partial(ev.get("records"))
    stalled = ev.get("stalled")
    return ScenarioEvent(
        str(ev["id"]), str(ev["status"]), records, _str(ev.get("reason")), _num(ev.get("duration_s")),
        Precondition.from_json(ev.get("precondition")), bool(ev.get("engine_recovered")),
        _str(ev.get("scheduler_class")), _str(ev.get("spec_method")), str(stalled) if stalled else None,
        _str(ev.get("vllm_source")), ev)


def _partial(value: Any) -> tuple[StreamRecord, ...]:
    # A scenario that did not run to its end (a crash) may carry the streams as far as they got: shown by
    # ``plan``, never judged into the cell's outcome; records it could not have finished are left out.
    if value is None:
        return ()
    try:
        return stream_records(value)
    except MalformedEvent:
        return ()


def as_scenario_event(fields: Mapping[str, Any], scenario_id: str = "falsifying") -> ScenarioEvent:
    """A scenario's fields without the event envelope (a fuzz run's replay of its falsifying example), checked
    as the ``scenario`` event they are (``id`` defaults to ``scenario_id``)."""
    event = parse_event({"event": "scenario", "id": scenario_id, **fields})
    assert isinstance(event, ScenarioEvent)
    return event


def _fuzz(ev: Mapping[str, Any]) -> FuzzEvent:
    fals = ev.get("falsifying")
    if fals is not None and not (isinstance(fals.get("script"), Mapping) and isinstance(fals.get("replay"), Mapping)):
        raise MalformedEvent("fuzz event: a falsifying example without its script or its replay")
    replay = as_scenario_event(fals["replay"]) if fals is not None else None
    return FuzzEvent(
        str(ev["status"]), _int(ev.get("examples")) or 0, _int(ev.get("seed")), _int(ev.get("examples_to_failure")),
        _num(ev.get("wall_s")) or 0.0, _num(ev.get("cpu_s")), fals, replay, _str(ev.get("reason")),
        _obj(ev.get("coverage")), {str(k): str(v) for k, v in _obj(ev.get("dropped")).items()},
        _str(ev.get("hypothesis_version")), ev, _obj(ev.get("reach")))


_PARSERS: dict[str, Callable[[Mapping[str, Any]], Event]] = {
    "start": lambda ev: StartEvent(ev["pgid"], ev),
    "engine": _engine,
    "sched": lambda ev: SchedEvent(sched_facts(ev), ev),
    "scenario": scenario_event,
    "fuzz": _fuzz,
    "fatal": lambda ev: FatalEvent(ev["reason"], _str(ev.get("traceback")), ev),
    "done": lambda ev: DoneEvent(_num(ev.get("wall_s")), ev),
    "turn": lambda ev: TurnEvent(float(ev["waited_s"]), ev),
}
