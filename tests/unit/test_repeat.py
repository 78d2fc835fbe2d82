"""``--repeat``: folding a cell's runs (harness.verdicts.repeat)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.verdicts.repeat import aggregate
from harness.verdicts.results import CellResult

pytestmark = pytest.mark.unit

CELL = Cell("0.21.0", "mp", True, "keep", True)


def run(outcome: Outcome) -> CellResult:
    return CellResult(CELL, outcome, f"{outcome.value} summary")


@given(st.lists(st.sampled_from(list(Outcome)), min_size=1, max_size=8))
def test_flaky_exactly_when_runs_disagree(outcomes: list[Outcome]) -> None:
    res = aggregate([run(o) for o in outcomes])
    infra = [o for o in outcomes if o.is_infra]
    if len(set(outcomes)) == 1:
        assert res.outcome is outcomes[0]
    elif infra:
        # Infrastructure failures are never hidden as FLAKY: the worst of them wins.
        assert res.outcome is max(infra, key=lambda o: o.rank)
    else:
        assert res.outcome is Outcome.FLAKY
    if len(outcomes) > 1:
        assert res.repeats is not None
        assert sum(res.repeats.outcomes.values()) == len(outcomes)
        assert abs(sum(res.repeats.fractions.values()) - 1) < 1e-3
    else:
        assert res.repeats is None and res.summary == "OK summary".replace("OK", outcomes[0].value)


def test_flaky_keeps_the_worst_runs_requests() -> None:
    bad = CellResult(CELL, Outcome.LOSS, "LOSS(1) in 8/10", requests=({"rid": "r0"},))
    res = aggregate([run(Outcome.OK), bad, run(Outcome.OK)])
    assert res.outcome is Outcome.FLAKY and res.requests == ({"rid": "r0"},)
    assert res.summary == "FLAKY: OK 2/3, LOSS 1/3"
    assert "#2: LOSS(1) in 8/10" in (res.reason or "")


def test_refuses_runs_of_different_cells() -> None:
    with pytest.raises(ValueError):
        aggregate([run(Outcome.OK), CellResult(Cell("0.32.0", "mp", True, "keep", True), Outcome.OK, "OK")])


def test_an_engine_failure_among_repeats_is_not_flaky() -> None:
    res = aggregate([run(Outcome.OK), run(Outcome.OK), CellResult(CELL, Outcome.ERROR, "boom", reason="core died")])
    assert res.outcome is Outcome.ERROR
    assert res.summary == "ERROR in 1/3 runs (OK 2/3, ERROR 1/3): core died"
    assert res.repeats is not None and res.repeats.outcomes == {"OK": 2, "ERROR": 1}
