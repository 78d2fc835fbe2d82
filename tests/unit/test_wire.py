"""The harness <-> engine wire format (repro/core/wire.py) from both sides, without vLLM.

The harness writes specs and reads events; the engine (repro.engine.main, repro.scenarios.cell_run)
reads specs and writes events.  A spec the harness writes must be one the
engine accepts; every event the engine writes, at every place it writes one,
must be one the harness reads; another schema version is refused.
"""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import repro.engine.main as engine_mod
import repro.scenarios.cell_run as cell_mod
from harness.core.cell import Cell, EngineKey
from harness.core.events import CorruptEvent, Event, FatalEvent, ScenarioEvent
from harness.run.engine_process import EventTail
from harness.run.spec import RunConfig, build_spec, engine_spec
from repro.core.wire import EVENTS, SCHEMA_VERSION, STOP, FuzzSpec, ScenarioSpec, Spec, WireError, check_event
from repro.scenarios.vocab import ScenarioTimeout, ScenarioUnsupported

pytestmark = pytest.mark.unit

REPRO = Path(__file__).resolve().parents[2] / "repro"
ENGINE = EngineKey("0.21.0", "mp", True, 2, "v2", True)
CELLS = (Cell("0.21.0", "mp", True, "keep", True, tp=2, model_runner="v2", batch_invariant=True),
         Cell("0.21.0", "mp", True, "wait", False, tp=2, model_runner="v2", batch_invariant=True,
              scenario="weight-sync"))


def _cfg(tmp_path: Path, **kw: Any) -> RunConfig:
    return RunConfig(platform="cuda", work_dir=tmp_path, model_cache=tmp_path / "models", **kw)


# --------------------------------------------------------------------------- specs: harness writes, engine reads


def test_a_spec_the_harness_writes_is_the_spec_the_engine_reads(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, repeat=2, gpu_memory_utilization=0.3, model_params={"vocab_size": 64},
               scenario_params={"max_tokens": 16}, weight_transfer="nccl")
    written = json.loads(json.dumps(engine_spec(ENGINE, CELLS, cfg)))  # through JSON, as spec.json
    read = Spec.from_json(written)
    assert read == build_spec(ENGINE, CELLS, cfg)
    assert read.to_json() == written
    assert read.engine.tensor_parallel_size == 2
    assert (read.engine.axes["model_runner"], read.engine.axes["batch_invariant"]) == ("v2", True)
    assert [s.id for s in read.scenarios] == [CELLS[0].scenario_id, CELLS[1].scenario_id,
                                              f"{CELLS[0].scenario_id}#2", f"{CELLS[1].scenario_id}#2"]
    assert [s.scenario for s in read.scenarios] == ["keep", "weight_sync"] * 2
    assert engine_mod.needs_nccl_weight_transfer(read)
    interactive = build_spec(ENGINE, (), cfg, interactive=True)
    assert Spec.from_json(json.loads(json.dumps(interactive.to_json()))).interactive is True


def test_the_engine_refuses_another_schema_version_and_unknown_fields(tmp_path: Path) -> None:
    doc = engine_spec(ENGINE, CELLS, _cfg(tmp_path))
    with pytest.raises(WireError, match=f"schema_version {SCHEMA_VERSION + 1}; this side reads {SCHEMA_VERSION}"):
        Spec.from_json({**doc, "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(WireError, match="unknown field"):
        Spec.from_json({**doc, "scenario_timeot": 3})
    with pytest.raises(WireError, match="missing field 'axes'"):
        Spec.from_json({**doc, "engine": {"gpu_memory_utilization": 0.5}})
    with pytest.raises(WireError, match=r"axes \['executor'\] are not JSON scalars"):
        Spec.from_json({**doc, "engine": {"axes": {"executor": ["mp"]}}})
    with pytest.raises(WireError, match="unknown model kind"):
        Spec.from_json({**doc, "model": {"kind": "llama"}})
    bad = tmp_path / "spec.json"
    bad.write_text(json.dumps({**doc, "schema_version": SCHEMA_VERSION + 1}))
    assert engine_mod.main([str(bad), str(tmp_path / "out.jsonl")]) == 2
    assert not (tmp_path / "out.jsonl").exists(), "no event is written for a spec the engine cannot read"


def test_scenario_lines_of_a_session_round_trip_and_stop_is_not_a_scenario() -> None:
    sc = ScenarioSpec("plan", "plan", {"requests": []}, 0, timeout=10.0)
    assert ScenarioSpec.from_json(json.loads(json.dumps(sc.to_json()))) == sc
    assert "timeout" not in ScenarioSpec("a", "keep", {}).to_json()
    with pytest.raises(WireError, match="unknown field"):
        ScenarioSpec.from_json(STOP)


# --------------------------------------------------------------------------- events: engine writes, harness reads


def _read_back(path: Path) -> list[Event]:
    """What the harness's reader makes of the engine's event file: nothing may come back corrupt."""
    events = EventTail(path).read()
    assert [e for e in events if isinstance(e, CorruptEvent)] == []
    return events


def test_every_emit_call_in_repro_names_a_described_event_with_described_fields() -> None:
    calls = 0
    for path in sorted(REPRO.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "emit"):
                continue
            calls += 1
            kind = node.args[0]
            assert isinstance(kind, ast.Constant) and kind.value in EVENTS, f"{path}:{node.lineno}"
            desc = EVENTS[kind.value]
            named = {k.arg for k in node.keywords if k.arg is not None}
            assert named <= {*desc.required, *desc.optional}, f"{path}:{node.lineno}: {named}"
            if all(k.arg is not None for k in node.keywords):  # no **spread: every required field is named
                assert set(desc.required) <= named, f"{path}:{node.lineno}"
    assert calls >= 10, "the scan found the engine's emit calls"


def test_scenario_results_carry_only_described_fields() -> None:
    # The dicts a scenario run returns become the fields of its ``ran`` event.
    allowed = EVENTS["scenario"].optional | set(EVENTS["scenario"].required)
    found = 0
    for path in sorted(REPRO.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
                keys = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
                if "records" in keys:
                    found += 1
                    assert keys <= allowed, f"{path}:{node.lineno}: {keys - allowed}"
    assert found >= 2  # the generic run and the weight-sync runner


class _Llm:
    """Just what repro.scenarios.cell_run.run_cell touches besides the scenario: resume, the engine flag, the probe."""

    errored = False

    async def resume_generation(self) -> None:
        return None


@pytest.mark.parametrize(("outcome", "status"), [
    ({"records": [], "events": [], "duration_s": 0.1}, "ran"),
    ({"records": [], "events": [], "duration_s": 0.1, "weight_sync": {"transfer": "reload"}}, "ran"),
    (ScenarioUnsupported("no keep mode"), "unsupported"),
    (ScenarioTimeout("pause 0 never returned"), "timeout"),
    (ValueError("bad params"), "error"),
])
def test_every_scenario_event_the_engine_writes_is_read_by_the_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: Any, status: str,
) -> None:
    async def run_scenario(*_a: Any) -> dict[str, Any]:
        if isinstance(outcome, BaseException):
            raise outcome
        return dict(outcome)

    async def probe(_llm: Any) -> dict[str, Any]:
        return {"frontend_async_scheduling": True}

    monkeypatch.setattr(cell_mod, "run_scenario", run_scenario)
    monkeypatch.setattr(cell_mod, "probe_engine", probe)
    out = tmp_path / "events.jsonl"
    emit = engine_mod.Emitter(out)
    sc = {"id": "keep-clear", "scenario": "keep", "params": {}, "seed": 0}
    asyncio.run(cell_mod.run_cell(_Llm(), sc, None, 1.0, None, emit))  # type: ignore[arg-type]
    asyncio.run(cell_mod.run_cell(_Llm(), sc, None, 1.0, "asked for async but got sync", emit))  # type: ignore[arg-type]
    assert [(e.kind, e.status) for e in _read_back(out) if isinstance(e, ScenarioEvent)] == \
        [("scenario", status), ("scenario", "unsupported")]


def test_engine_level_events_are_read_by_the_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(engine_spec(ENGINE, CELLS, _cfg(tmp_path))))
    spec = Spec.from_json(json.loads(spec_path.read_text()))

    async def refuses(s: Spec, emit: engine_mod.Emitter) -> None:
        engine_mod._refuse_all(s, emit, {"vllm_version": "0.21.0", "python": "3.12"}, "no pause modes")

    async def dies(s: Spec, emit: engine_mod.Emitter) -> None:
        raise RuntimeError("engine core died")

    monkeypatch.setattr(engine_mod, "run_engine", refuses)
    assert engine_mod.main([str(spec_path), str(tmp_path / "a.jsonl")]) == 0
    events = _read_back(tmp_path / "a.jsonl")
    assert [e.kind for e in events] == ["start", "engine", "scenario", "scenario", "done"]
    assert [e.id for e in events if isinstance(e, ScenarioEvent)] == [s.id for s in spec.scenarios]
    monkeypatch.setattr(engine_mod, "run_engine", dies)
    assert engine_mod.main([str(spec_path), str(tmp_path / "b.jsonl")]) == 1
    events = _read_back(tmp_path / "b.jsonl")
    assert [e.kind for e in events] == ["start", "fatal"]
    assert isinstance(events[1], FatalEvent) and events[1].reason == "RuntimeError: engine core died"


def test_the_engine_cannot_write_an_event_the_harness_would_not_read(tmp_path: Path) -> None:
    emit = engine_mod.Emitter(tmp_path / "events.jsonl")
    with pytest.raises(WireError, match="missing field 'records'"):
        emit("scenario", id="keep-clear", status="ran")
    with pytest.raises(WireError, match="unknown field"):
        emit("fatal", reason="x", why="y")
    with pytest.raises(WireError, match="unknown event kind"):
        emit("finished")
    assert (tmp_path / "events.jsonl").read_text() == ""


def test_the_harness_reads_a_mismatched_event_as_corrupt_with_the_mismatch(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    out.write_text("\n".join([
        json.dumps({"event": "scenario", "id": "keep-clear", "status": "ran"}),
        json.dumps({"event": "start", "pgid": "12"}),
        "not json",
        json.dumps({"event": "done", "t": 1.0}),
    ]) + "\n")
    events = EventTail(out).read()
    assert [e.kind for e in events] == ["corrupt", "corrupt", "corrupt", "done"]
    bad_records, bad_pgid, not_json = (e for e in events if isinstance(e, CorruptEvent))
    assert "missing field 'records'" in (bad_records.error or "")
    assert "field 'pgid' is str, expected int" in (bad_pgid.error or "")
    assert not_json.error is None and not_json.line == "not json"
    with pytest.raises(WireError, match="unknown status"):
        check_event({"event": "scenario", "id": "a", "status": "skipped"})


# --------------------------------------------------------------------------- the scheduler tier's fuzz run


def test_a_fuzz_spec_round_trips_and_bad_ones_are_refused() -> None:
    spec = FuzzSpec(examples=200, steps=25, seed=7, depths=(2, 3), spec_tokens=(0, 2), max_requests=4)
    assert FuzzSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    doc = spec.to_json()
    for bad, match in (({**doc, "examples": 0}, "each must be at least 1"), ({**doc, "depths": [4]}, "depths=\\[4\\]"),
                       ({**doc, "depths": []}, "non-empty"), ({**doc, "spec_tokens": [9]}, "spec_tokens=\\[9\\]"),
                       ({**doc, "shrink": False}, "unknown field"), ({**doc, "seed": "7"}, "field 'seed' is str")):
        with pytest.raises(WireError, match=match):
            FuzzSpec.from_json(bad)


def test_fuzz_events_are_checked_by_status() -> None:
    check_event({"event": "fuzz", "status": "ran", "examples": 10, "falsifying": None}, strict=True)
    check_event({"event": "fuzz", "status": "unsupported", "reason": "no scheduler"}, strict=True)
    with pytest.raises(WireError, match="missing field 'falsifying'"):
        check_event({"event": "fuzz", "status": "ran", "examples": 10})
    with pytest.raises(WireError, match="missing field 'examples'"):
        check_event({"event": "fuzz", "status": "ran", "falsifying": None})
    with pytest.raises(WireError, match="unknown status 'found'"):
        check_event({"event": "fuzz", "status": "found"})
    with pytest.raises(WireError, match="unknown field"):
        check_event({"event": "fuzz", "status": "error", "reason": "x", "why": "y"}, strict=True)
