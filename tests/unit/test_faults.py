"""``--inject``: fault ids, the injected bug in the known-bug table, and the sensitivity self-test."""

from __future__ import annotations

import pytest
from synthetic import request_record

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome
from harness.core.recorded_streams import StreamRecord
from harness.plan.faults import annotate_injected, bugs_with_injection, parse_inject, sensitivity_failures
from harness.verdicts.known_bugs import load_known_bugs
from harness.verdicts.results import CellResult, Results

pytestmark = pytest.mark.unit
typed = StreamRecord.from_json  # the oracle judges typed request records

REF = list(range(10, 40))


def test_parse_inject_validates_and_dedups() -> None:
    assert parse_inject(None) == ()
    assert parse_inject(["vllm#42043", "vllm#42043,hang#pause"]) == ("vllm#42043", "hang#pause")
    with pytest.raises(BadInput, match="valid choices: vllm#42043, hang#pause, crash#reset"):
        parse_inject(["vllm#4204"])
    with pytest.raises(BadInput):
        parse_inject(["vllm#42043,"])


def test_injected_bug_covers_fixed_versions_only_when_injected() -> None:
    table = load_known_bugs()
    cell = Cell("0.32.0", "mp", True, "keep", True)
    injected = bugs_with_injection(("vllm#42043",), table)
    assert injected[0].id == "vllm#42043 (injected)" and injected[0].affected.contains("0.32.0")
    assert bugs_with_injection((), table) == table
    loss = CellResult(cell, Outcome.LOSS, "LOSS(1) in 1/1", requests=(_judged(running=True, lost=True),))
    assert annotate_injected(loss, ("vllm#42043",), table).expectation.status == "as expected"  # type: ignore[union-attr]


def _judged(running: bool, lost: bool) -> dict:
    from harness.core.oracle import classify_request

    obs = REF[:6] + REF[7:20] if lost else REF[:19]
    rec = request_record("r0", obs, REF, running=running, max_tokens=19)
    return {**rec, "verdict": classify_request(typed(rec)).to_dict()}


def _results(*cells: CellResult, inject: list[str]) -> Results:
    bugs = load_known_bugs()
    return Results(tuple(annotate_injected(c, tuple(inject), bugs) for c in cells), {"inject": inject})


def test_self_test_passes_when_the_injected_cell_loses_one_token() -> None:
    cell = Cell("0.32.0", "mp", True, "keep", True)
    res = _results(CellResult(cell, Outcome.LOSS, "LOSS(1)", requests=(_judged(True, True),)), inject=["vllm#42043"])
    assert sensitivity_failures(res) == []


def test_self_test_fails_loudly_when_the_oracle_sees_nothing() -> None:
    cell = Cell("0.32.0", "mp", True, "keep", True)
    res = _results(CellResult(cell, Outcome.OK, "OK 1/1", requests=(_judged(True, False),)), inject=["vllm#42043"])
    (failure,) = sensitivity_failures(res)
    assert cell.id in failure and "expected LOSS(1)" in failure


def test_self_test_fails_when_the_injected_cell_could_not_run() -> None:
    cell = Cell("0.32.0", "mp", True, "keep", True)
    engine = {"vllm_version": "0.32.0", "probe": {}}
    refused = CellResult(cell, Outcome.UNSUPPORTED, "injection not applied", engine=engine)
    assert sensitivity_failures(_results(refused, inject=["vllm#42043"]))
    timeout = CellResult(cell, Outcome.TIMEOUT, "hang", engine=engine)
    assert sensitivity_failures(_results(timeout, inject=["vllm#42043"]))


def test_self_test_ignores_cells_the_platform_cannot_run() -> None:
    ran = CellResult(Cell("0.32.0", "mp", True, "keep", True), Outcome.LOSS, "LOSS(1)",
                     requests=(_judged(True, True),))
    ray = CellResult(Cell("0.32.0", "ray-v2", True, "keep", True), Outcome.UNSUPPORTED,
                     "Ray executors do not run on vLLM's CPU platform")
    assert sensitivity_failures(_results(ran, ray, inject=["vllm#42043"])) == []
    assert "no cell" in sensitivity_failures(_results(ray, inject=["vllm#42043"]))[0]


def test_self_test_is_not_vacuous() -> None:
    cell = Cell("0.32.0", "mp", False, "keep", True)  # async off: the injected bug covers no cell
    res = _results(CellResult(cell, Outcome.OK, "OK", requests=(_judged(True, False),)), inject=["vllm#42043"])
    assert "no cell of this run is covered" in sensitivity_failures(res)[0]
    assert sensitivity_failures(_results(CellResult(cell, Outcome.OK, "OK"), inject=[])) == []
