"""The pytest plugin's pure parts: xdist scheduling scope of a test id."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.matrix import EXECUTORS, MODES, Cell
from harness.pytest_plugin import engine_scope

pytestmark = pytest.mark.unit

cells = st.builds(
    Cell,
    version=st.sampled_from(["0.21.0", "0.22.0rc1", "0.9.0.post1", "a1b2c3d4e5f6"]),
    executor=st.sampled_from(EXECUTORS),
    async_on=st.booleans(),
    mode=st.sampled_from(MODES),
    clear_cache=st.booleans(),
    tp=st.sampled_from([1, 2]),
    scenario=st.sampled_from(["pause", "weight-sync"]),
    model_runner=st.sampled_from(["v1", "v2"]),
    batch_invariant=st.booleans(),
)


@given(cells)
def test_post_resume_items_are_scheduled_by_engine_config(cell: Cell) -> None:
    nodeid = f"tests/integration/test_post_resume.py::test_post_resume[{cell.id}]"
    assert engine_scope(nodeid) == cell.engine.id


@pytest.mark.parametrize("nodeid", ["tests/unit/test_x.py::test_a", "tests/unit/test_x.py::test_b[1-2]",
                                    "tests/integration/test_schedules.py::test_post_resume_schedules[fixed]"])
def test_other_items_are_their_own_scope(nodeid: str) -> None:
    assert engine_scope(nodeid) == nodeid
