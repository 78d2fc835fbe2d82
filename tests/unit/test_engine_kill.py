"""kill_group ends the engine's whole session: Ray 2.60 puts each worker in a process group of its own."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.run.engine_process import group_alive, kill_group

# A session leader (the engine) whose child leaves its process group, as Ray 2.60's workers do, then both wait.
_WORKER = "import os, time; os.setpgid(0, 0); print(os.getpid(), flush=True); time.sleep(60)"
_ENGINE = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {_WORKER!r}], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.unit
def test_kill_group_reaches_a_process_that_left_the_group_but_not_the_session() -> None:
    engine = subprocess.Popen([sys.executable, "-c", _ENGINE], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert engine.stdout is not None
        worker = int(engine.stdout.readline())
        with open(f"/proc/{worker}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        assert int(fields[2]) == worker and int(fields[3]) == engine.pid  # its own group, the engine's session
        kill_group(engine.pid, grace=5)
        engine.wait(timeout=60)  # bounds, not pacing: a busy machine may take a while to reap
        deadline = time.monotonic() + 60
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "a process of the engine's session outlived kill_group"
        assert not group_alive(engine.pid)
    finally:
        if engine.poll() is None:
            engine.kill()
