"""Run one ``python -m repro.sched`` process to its end: a scheduler-tier ``plan`` replay or a ``fuzz`` run.

The matrix runs scheduler-tier cells through :func:`harness.run.runner.run_engine`
like any engine; ``plan`` and ``fuzz`` hand the process a spec of their own
(an ``ops`` scenario, a ``fuzz`` section) through the same
:class:`harness.run.engine_process.EngineProcess`: own process group, spec and events
checked against ``repro.core.wire``, the whole group killed at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from harness.core.cell import EngineKey
from harness.core.events import Event, FatalEvent
from harness.envbuild.envs import VllmEnv
from harness.run.engine_process import EngineProcess
from harness.run.spec import RunConfig

__all__ = ["SchedRun", "run_sched"]

E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class SchedRun:
    """What one scheduler-tier process reported, and why it ended if not by itself."""

    engine: EngineKey
    events: tuple[Event, ...]
    returncode: int | None
    timed_out: bool
    log: Path
    wall_s: float
    log_tail: str = ""

    def first(self, kind: type[E]) -> E | None:
        """The first event of ``kind`` (an event class), or None."""
        return next((ev for ev in self.events if isinstance(ev, kind)), None)

    @property
    def problem(self) -> str:
        """Why the process did not report what was asked of it (for an event that never came)."""
        if self.timed_out:
            return f"killed after {self.wall_s:.0f} s (the time limit); log: {self.log}"
        fatal = self.first(FatalEvent)
        if fatal is not None:
            return f"repro.sched failed: {fatal.reason}; log: {self.log}"
        return f"repro.sched exited with code {self.returncode}; last log lines: {self.log_tail}"


def run_sched(env: VllmEnv, engine: EngineKey, cfg: RunConfig, name: str, spec: dict[str, Any], timeout: float,
              distributions: Sequence[str] = (), on_event: Callable[[Event], None] | None = None,
              ) -> SchedRun:
    """Run ``spec`` in ``env`` (work dir ``cfg.work_dir/engines/name``) until it exits or ``timeout`` seconds pass.

    Ctrl-C or SIGTERM while it runs kills its process group before the interrupt propagates.
    """
    proc = EngineProcess(env, engine, cfg, cfg.work_dir / "engines" / name, spec=spec, distributions=distributions)
    events: list[Event] = []
    t0 = time.monotonic()
    timed_out = False
    try:
        while True:
            done = proc.wait(0.5)
            for ev in proc.events():
                events.append(ev)
                if on_event is not None:
                    on_event(ev)
            if done:
                break
            if time.monotonic() - t0 > timeout:
                timed_out = True
                break
    finally:
        proc.stop()
    events += proc.events()
    return SchedRun(engine, tuple(events), proc.proc.returncode, timed_out, proc.log_path,
                    round(time.monotonic() - t0, 3), proc.log_tail())
