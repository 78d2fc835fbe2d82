"""A scenario that times out while the engine core is gone is ERROR with that root cause, not TIMEOUT
(repro.engine.main._dead_core_is_error: a SIGKILLed core can leave vLLM's requests hanging until the limit)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from repro.engine import main as engine_main

pytestmark = pytest.mark.unit


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_timeout_with_a_dead_core_is_an_error_and_ends_the_engine() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    emit = engine_main._dead_core_is_error(lambda e, **d: seen.append((e, d)),  # type: ignore[arg-type]
                                           {"core": {"pid": _gone_pid()}, "workers": []})
    with pytest.raises(RuntimeError, match="engine is dead"):
        emit("scenario", id="s", status="timeout", reason="timed out after 120.0s")
    [(event, data)] = seen
    assert event == "scenario" and data["status"] == "error"
    assert "engine core" in data["reason"] and "timed out after 120.0s" in data["reason"]


def test_a_timeout_with_a_live_core_stays_a_timeout() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    import os

    emit = engine_main._dead_core_is_error(lambda e, **d: seen.append((e, d)),  # type: ignore[arg-type]
                                           {"core": {"pid": os.getpid()}, "workers": []})
    emit("scenario", id="s", status="timeout", reason="slow")
    emit("scenario", id="t", status="ran")
    assert [d["status"] for _, d in seen] == ["timeout", "ran"]
