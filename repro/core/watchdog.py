"""An engine process ends with the harness process that started it.

The harness starts each engine in a process group of its own (``start_new_session``) and kills that group when
the engine is done, times out or the run is interrupted. A harness that is itself killed (SIGKILL, an OOM kill, a
lost Ray worker, a ``kill`` of ``tox``) runs no cleanup, and its engines would live on re-parented to init,
holding CPU, memory, a GPU and ports (seen 2026-12-02: two pytest-face engines outlived a killed ``tox -e
tests``). So the engine watches its parent: when the parent exits, it kills its own process group, vLLM's
engine core and workers with it. It waits on a pidfd (Linux 5.3+), an event, not a poll; where there is none it
checks the parent once a second.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

POLL_S = 1.0  # only without pidfd_open


def _end_group() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _wait_for_exit(ppid: int) -> None:
    try:
        fd = os.pidfd_open(ppid)
    except (AttributeError, OSError):  # no pidfd here, or the parent is already gone
        fd = -1
    if fd >= 0 and os.getppid() == ppid:  # re-checked: the pid might have been another process's by now
        select.select([fd], [], [])  # readable once the process has exited
        return
    while os.getppid() == ppid:
        time.sleep(POLL_S)


def watch_parent() -> None:
    """End this process group when the parent process exits (a daemon thread; a no-op under init)."""
    ppid = os.getppid()
    if ppid == 1:
        return

    def run() -> None:
        _wait_for_exit(ppid)
        _end_group()

    threading.Thread(target=run, name="repro-parent-watchdog", daemon=True).start()
