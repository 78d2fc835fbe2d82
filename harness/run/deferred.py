"""Ctrl-C and SIGTERM deferred to the points a driver loop chooses, so it honours them even when a call blocks.

Why the Ray driver (``harness.run.cluster``) needs this: a Python signal
handler runs only in the main thread, between bytecodes.  While that thread
waits inside Ray's C++ core (a gRPC call to the GCS, a mutex, a thread join
in ``ray.shutdown``), the handler does not run at all, and a
``KeyboardInterrupt`` that does land inside Ray's own Python code can leave
its state half-changed, so that the cleanup after it blocks.  Ray has known
hangs of exactly this kind in ``ray.shutdown`` (ray-project/ray#44836, #45044:
the driver joins a GCS subscriber thread stuck in a poll).  Under load (issue
21) an interrupted cluster run hung there, ignoring further Ctrl-Cs.

:class:`DeferredInterrupts` replaces the Python handlers of SIGINT and SIGTERM
with one that only notes the signal.  The driver waits only in bounded
slices and calls :meth:`DeferredInterrupts.check` between them, which runs the
original handler (for the CLI and Python's default: raise
``KeyboardInterrupt``) at a point where the driver's own cleanup can run.
Whoever waits on something only out of politeness (a grace period, a shutdown
that may never return) gives up when a signal arrives during that wait
(:meth:`DeferredInterrupts.since`): the user asking again.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
SLICE_S = 0.1  # the longest a wait here goes without looking at the signals noted


class DeferredInterrupts:
    """Context manager: SIGINT/SIGTERM are noted, and acted on only at :meth:`check`.

    Off the main thread (where Python cannot install handlers) it defers
    nothing and the signals keep their own handlers.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> DeferredInterrupts:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in SIGNALS:
            previous = signal.getsignal(sig)
            # Only a Python handler is deferred: SIG_DFL/SIG_IGN keep their meaning.
            if callable(previous):
                self._previous[sig] = previous
                signal.signal(sig, self._note)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        # A signal noted after the last check (during the cleanup of a run that went well) still counts;
        # one noted while another exception propagates is already answered by it.
        if exc_type is None:
            self.check()
        self._previous.clear()

    def _note(self, signum: int, _frame: FrameType | None) -> None:
        # Nothing that takes a lock: this runs in the main thread, perhaps while it holds one.
        self.received.append(signum)

    @property
    def pending(self) -> bool:
        return bool(self.received)

    def mark(self) -> int:
        """A point to compare with :meth:`since`: how many signals were noted so far."""
        return len(self.received)

    def since(self, mark: int) -> bool:
        """Whether a signal arrived after ``mark``: stop waiting for anything that is only polite."""
        return len(self.received) > mark

    def check(self) -> None:
        """Run the original handler of the first signal noted (the CLI's and Python's raise KeyboardInterrupt)."""
        if not self.received:
            return
        signum = self.received[0]
        handler = self._previous.get(signum, signal.default_int_handler)
        handler(signum, None)


def call_bounded(fn: Callable[[], object], limit_s: float, interrupts: DeferredInterrupts,
                 name: str) -> threading.Thread:
    """Run ``fn`` in a daemon thread; wait until it returns, ``limit_s`` passes or a signal arrives.

    The thread is returned: alive if ``fn`` has not returned, and then the
    caller cleans up by other means.
    """
    mark = interrupts.mark()
    worker = threading.Thread(target=fn, name=name, daemon=True)
    worker.start()
    join_bounded(worker, limit_s, interrupts, mark)
    return worker


def join_bounded(worker: threading.Thread, limit_s: float, interrupts: DeferredInterrupts,
                 mark: int | None = None) -> bool:
    """Wait for ``worker`` until it ends, ``limit_s`` passes or a signal arrives after ``mark`` (default: now).

    True if it ended.
    """
    mark = interrupts.mark() if mark is None else mark
    deadline = time.monotonic() + limit_s
    while worker.is_alive() and time.monotonic() < deadline and not interrupts.since(mark):
        worker.join(SLICE_S)
    return not worker.is_alive()
