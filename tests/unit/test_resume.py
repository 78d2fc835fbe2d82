"""``matrix --resume``: the run record, which cells are kept, torn logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.errors import BadInput, ResultsFileError
from harness.core.oracle import Outcome
from harness.plan.matrix import Selection
from harness.run.resume import RUN_FILE, resume_state, rewrite_log, run_record
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, ResultsLog, read_results

pytestmark = pytest.mark.unit

SEL = Selection(versions=("0.21.0",), asyncs=(True,), modes=("keep", "wait"), clear_caches=(True,))


def _cfg(tmp_path: Path, **kw: object) -> RunConfig:
    return RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "m", **kw)  # type: ignore[arg-type]


def _setup(tmp_path: Path, results: list[CellResult]) -> dict:
    doc = run_record(SEL, _cfg(tmp_path), "cpu")
    (tmp_path / RUN_FILE).write_text(json.dumps(doc))
    log = ResultsLog(tmp_path / "results.jsonl")
    for r in results:
        log.append(r)
    return doc


def test_keeps_verdicts_and_unsupported_reruns_infra_failures(tmp_path: Path) -> None:
    keep, wait = SEL.cells()
    doc = _setup(tmp_path, [CellResult(keep, Outcome.LOSS, "LOSS(1)"), CellResult(wait, Outcome.TIMEOUT, "hang")])
    kept = resume_state(tmp_path, doc)
    assert [r.id for r in kept] == [keep.id]


def test_a_torn_last_line_is_dropped_not_fatal(tmp_path: Path) -> None:
    keep, _ = SEL.cells()
    doc = _setup(tmp_path, [CellResult(keep, Outcome.OK, "OK")])
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write('{"schema": "vllm-repro/cell", "schema_versi')
    assert [r.id for r in resume_state(tmp_path, doc)] == [keep.id]


def test_different_settings_are_refused(tmp_path: Path) -> None:
    _setup(tmp_path, [])
    other = run_record(SEL, _cfg(tmp_path, repeat=3), "cpu")
    with pytest.raises(BadInput, match="different settings"):
        resume_state(tmp_path, other)
    other = run_record(Selection(versions=("0.32.0",)), _cfg(tmp_path), "cpu")
    with pytest.raises(BadInput, match="different cells"):
        resume_state(tmp_path, other)


def test_nothing_to_resume_and_future_run_records(tmp_path: Path) -> None:
    doc = run_record(SEL, _cfg(tmp_path), "cpu")
    with pytest.raises(BadInput, match="nothing to resume"):
        resume_state(tmp_path, doc)
    (tmp_path / RUN_FILE).write_text(json.dumps({**doc, "schema_version": 99}))
    with pytest.raises(ResultsFileError, match="schema_version 99"):
        resume_state(tmp_path, doc)


def test_rewrite_log_keeps_only_kept_cells(tmp_path: Path) -> None:
    keep, wait = SEL.cells()
    _setup(tmp_path, [CellResult(keep, Outcome.OK, "OK"), CellResult(wait, Outcome.ERROR, "boom")])
    rewrite_log(tmp_path / "results.jsonl", [CellResult(keep, Outcome.OK, "OK")])
    assert [r.id for r in read_results(tmp_path / "results.jsonl").cells] == [keep.id]


def test_cell_ids_round_trip_with_scenario_and_tp() -> None:
    c = Cell("0.21.0", "ray-v2", True, "keep", True, tp=2, scenario="weight-sync")
    assert c.id == "vllm0.21.0-ray-v2-async_on-keep-clear-tp2-weight_sync"
    assert Cell.from_dict(c.to_dict()) == c
    assert c.config_id == "ray-v2-async_on-keep-clear-tp2-weight_sync"


def test_engine_logs_of_the_interrupted_run_are_kept(tmp_path: Path) -> None:
    from harness.run.resume import keep_engine_logs

    assert keep_engine_logs(tmp_path) is None
    (tmp_path / "engines" / "e1").mkdir(parents=True)
    (tmp_path / "engines" / "e1" / "engine.log").write_text("first")
    assert keep_engine_logs(tmp_path) == tmp_path / "engines.prev-1"
    (tmp_path / "engines").mkdir()
    assert keep_engine_logs(tmp_path) == tmp_path / "engines.prev-2"
    assert (tmp_path / "engines.prev-1" / "e1" / "engine.log").read_text() == "first"
