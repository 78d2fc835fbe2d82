"""Every engine-tier scenario of the catalogue: the spec the harness writes for it is one its build accepts.

The harness (harness.run.spec.scenario_spec) and the engine side (repro.scenarios) are written by different
hands; a parameter one sends and the other refuses would turn every cell of the scenario into ERROR.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.scenarios import MODES, SCENARIO_TABLE
from harness.run.spec import RunConfig, scenario_spec
from repro.scenarios import SCENARIOS

pytestmark = pytest.mark.unit

CELLS = [Cell("0.21.0", "mp", True, m, c, scenario=s.name)
         for s in SCENARIO_TABLE if "engine" in s.tiers
         for m in MODES for c in (True, False) if s.admits(m, c)]


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.id)
@pytest.mark.parametrize("params", [{}, {"num_requests": 8, "max_tokens": 32, "pause_after": 8}])
def test_the_harness_spec_builds_on_the_engine_side(cell: Cell, params: dict[str, int]) -> None:
    cfg = RunConfig("cpu", Path("/nonexistent"), Path("/nonexistent"), scenario_params=params)
    spec = scenario_spec(cell, cfg)
    plan = SCENARIOS[spec.scenario]("x", dict(spec.params), 64, 1)
    assert plan.requests
