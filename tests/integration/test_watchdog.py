"""An engine process group ends with a harness that was killed without cleaning up (repro/core/watchdog.py).

Real processes, no vLLM: a stand-in "harness" starts a stand-in "engine" in its own session, as
harness/run/engine_process.py does; the engine arms the watchdog and starts a child of its own (vLLM's engine core
stands in its process group the same way). The harness is then SIGKILLed: no cleanup runs, and both must end.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# Neither waits on a pipe from the harness (its end closing would end them without any watchdog): each blocks
# on an event nobody sets, as an engine busy in vLLM would never notice its parent's death.
ENGINE = """
import subprocess, sys, threading
from repro.core.watchdog import watch_parent
watch_parent()
core = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"],
                        stdin=subprocess.DEVNULL)
print(core.pid, flush=True)
threading.Event().wait()
"""

HARNESS = """
import subprocess, sys
engine = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          start_new_session=True, text=True)
print(engine.pid, engine.stdout.readline().strip(), flush=True)
sys.stdin.read()
"""


def _exited(pid: int, timeout: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def test_killing_the_harness_ends_the_engine_and_its_children() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, ENGINE], stdout=subprocess.PIPE,
                               stdin=subprocess.PIPE, env=env, text=True)
    try:
        assert harness.stdout is not None
        engine, core = (int(p) for p in harness.stdout.readline().split())
        assert os.getpgid(engine) == engine and os.getpgid(core) == engine  # the engine's own group
        assert not _exited(engine, 0) and not _exited(core, 0)
        harness.send_signal(signal.SIGKILL)  # no cleanup of any kind runs in the harness
        harness.wait()
        assert _exited(engine, 30) and _exited(core, 30), "the engine group outlived its harness"
    finally:
        harness.kill()
        for pid in locals().get("engine", 0), locals().get("core", 0):
            if pid and not _exited(pid, 0):
                os.kill(pid, signal.SIGKILL)  # the failing case must not leave them behind
