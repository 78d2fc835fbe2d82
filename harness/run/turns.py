"""Engines that start up side by side but run their scenarios a few at a time (the CPU platform's pipeline).

On vLLM's CPU platform an engine's start-up is mostly single-threaded Python (the API process, then the engine
core, then the worker each import vLLM and torch: spawned, vllm/platforms/cpu.py sets
``VLLM_WORKER_MULTIPROC_METHOD=spawn``), while its scenarios are the worker's OpenMP decode steps.  Measured on
this project's 2-core machine (docs/performance.md): of a 349 s one-at-a-time run of the default matrix,
start-ups took 216 s and the time between two engines (the teardown, the next interpreter and ``import vllm``)
another 78 s, the scenarios 46 s.  So the next engine starts while the current one runs, but its scenarios
wait for their *turn*: a gated engine (``repro.core.wire.Spec.gate``) stops after its ``engine`` event until the
harness sends ``GO``, so at most ``n`` engines decode at once, as in the run of before, and their verdicts do not
depend on how many engines start up beside them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ScenarioTurns:
    """At most ``n`` engines of a run in their scenarios at once (shared by the run's engine threads)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._sem = threading.BoundedSemaphore(max(1, n))

    def take(self, timeout: float) -> bool:
        return self._sem.acquire(timeout=timeout)

    def give(self) -> None:
        self._sem.release()


class Turn:
    """One engine's turn: asked for once the engine is ready (:meth:`ready`), taken with :meth:`poll`, whose
    ``go`` tells the engine to run its scenarios, and given back (:meth:`end`) as soon as its cells are judged or it
    ended, before its teardown, so the next engine's scenarios overlap that teardown."""

    def __init__(self, turns: ScenarioTurns, go: Callable[[], None]) -> None:
        self.turns, self.go = turns, go
        self.state = "starting"  # -> "waiting" -> "held" -> "done"
        self._since = 0.0
        self._waited = 0.0

    def ready(self) -> None:
        if self.state == "starting":
            self.state, self._since = "waiting", time.monotonic()

    @property
    def waiting(self) -> bool:
        return self.state == "waiting"

    def poll(self, timeout: float) -> bool:
        """Take the turn if it is free within ``timeout`` seconds (then the engine is told to go); True when held."""
        if self.state != "waiting":
            return self.state == "held"
        if not self.turns.take(timeout):
            return False
        self._waited += time.monotonic() - self._since
        self.state = "held"
        self.go()
        return True

    def waited(self) -> float:
        """Seconds spent ready but waiting for the turn (so far): not counted against the engine's time limit."""
        return self._waited + (time.monotonic() - self._since if self.state == "waiting" else 0.0)

    def end(self) -> None:
        if self.state == "held":
            self.turns.give()
        self.state = "done"
