"""The engine's event lines parsed once into typed events: a malformed line is a CorruptEvent with the reason,
a malformed request record a MalformedEvent; the oracle reads the typed record."""

from __future__ import annotations

import json

import pytest

from harness.core.errors import MalformedEvent, ReproError
from harness.core.events import (
    CorruptEvent,
    EngineEvent,
    FuzzEvent,
    ScenarioEvent,
    StartEvent,
    parse_event,
    parse_line,
)
from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import PauseRecord, StreamRecord

pytestmark = pytest.mark.unit

REF = list(range(100, 120))
RECORD = {"rid": "r0", "submit": "start", "max_tokens": 12, "reference": REF, "observed": REF[:4] + REF[5:13],
          "finish_reason": "length", "error": None, "prompt": [1],
          "pauses": [{"k": 0, "mode": "keep", "clear_cache": True, "client_tokens": 4, "engine_preemptions": 1,
                      "engine_status": "RUNNING", "frozen": True}]}


def test_a_scenario_line_becomes_a_typed_event_whose_records_the_oracle_judges() -> None:
    ev = parse_line(json.dumps({"event": "scenario", "id": "keep-clear", "status": "ran", "records": [RECORD],
                                "duration_s": 1.5, "precondition": {"met": True, "what": "x"}}))
    assert isinstance(ev, ScenarioEvent) and (ev.id, ev.status, ev.duration_s) == ("keep-clear", "ran", 1.5)
    (rec,) = ev.records
    assert rec.pauses == (PauseRecord("keep", True, 4, "RUNNING", 1, True),)
    assert rec.raw == RECORD  # kept whole: results hold what the engine wrote
    assert cell_verdict(ev.records).label == "LOSS(1)"
    assert ev.precondition is not None and ev.precondition.met


@pytest.mark.parametrize(("record", "message"), [
    ({**RECORD, "observed": None}, "field 'observed' is not a list of token ids"),
    ({**RECORD, "reference": [1, "2"]}, "field 'reference' is not a list of token ids"),
    ({**RECORD, "rid": 3}, "field 'rid' is not a string"),
    ({k: v for k, v in RECORD.items() if k != "max_tokens"}, "field 'max_tokens' is not an integer"),
    ("r0", "request record is str, not an object"),
])
def test_a_malformed_record_is_a_typed_error_and_its_line_corrupt(record: object, message: str) -> None:
    with pytest.raises(MalformedEvent, match=message):
        StreamRecord.from_json(record)
    assert issubclass(MalformedEvent, ReproError)
    line = json.dumps({"event": "scenario", "id": "a", "status": "ran", "records": [record]})
    ev = parse_line(line)
    assert isinstance(ev, CorruptEvent) and message in (ev.error or "") and ev.line == line[:200]


def test_each_event_kind_has_its_type() -> None:
    assert parse_event({"event": "start", "pgid": 7}) == StartEvent(7, {"event": "start", "pgid": 7})
    engine = parse_event({"event": "engine", "probe": None, "vllm_version": "0.21.0", "started": False})
    assert isinstance(engine, EngineEvent) and engine.info.vllm_version == "0.21.0" and engine.started is False
    assert engine.info["startup_s"] is None  # every fact a cell result keeps, as before
    fuzz = parse_event({"event": "fuzz", "status": "ran", "examples": 3, "falsifying": None})
    assert isinstance(fuzz, FuzzEvent) and (fuzz.examples, fuzz.replay) == (3, None)
    with pytest.raises(MalformedEvent, match="unknown event kind"):
        parse_event({"event": "finished"})
    crash = parse_event({"event": "scenario", "id": "a", "status": "crash", "reason": "boom", "records": [{}]})
    assert isinstance(crash, ScenarioEvent) and crash.records == ()  # partial streams: shown, never judged


def test_an_engine_error_in_a_record_is_error() -> None:
    rec = StreamRecord.from_json({**RECORD, "error": "EngineDeadError"})
    assert cell_verdict([rec]).outcome is Outcome.ERROR
