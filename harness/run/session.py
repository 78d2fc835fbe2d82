"""A long-lived engine process that runs scenarios on demand (pytest items, Hypothesis examples, ``plan``).

The same driver as ``runner.run_engine`` (:class:`harness.run.engine_process.EngineProcess`):
the engine runs ``python -m repro.engine`` in its own process group; here the
spec is marked interactive and scenarios are sent one JSON line at a time on
stdin, each answered by one ``scenario`` event in the event file.  ``close()``
(or a crash, or a timeout) kills the whole group; a dead engine is an
:class:`EngineDied` with its outcome and reason.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from harness.core.cell import EngineKey
from harness.core.errors import ReproError
from harness.core.events import EngineEvent, Event, FatalEvent, ScenarioEvent
from harness.core.oracle import Outcome
from harness.envbuild.envs import VllmEnv
from harness.run.engine_death import with_cause
from harness.run.engine_process import EngineProcess
from harness.run.spec import RunConfig
from repro.core.wire import ScenarioSpec

ENGINE_LOG_ENV = "VLLM_REPRO_ENGINE_LOG"  # if set, one line per engine start is appended to this file
E = TypeVar("E", bound=Event)


class EngineDied(ReproError):
    """The engine process is gone: ``outcome`` TIMEOUT (killed after ``reason``) or ERROR, with its log's tail."""

    def __init__(self, outcome: Outcome, reason: str, log_tail: str | None = None) -> None:
        self.outcome, self.reason, self.log_tail = outcome, reason, log_tail
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if self.outcome is Outcome.TIMEOUT:
            return f"TIMEOUT: {self.reason}"
        return self.reason if self.log_tail is None else f"{self.reason}; last log lines: {self.log_tail}"




class EngineSession:
    """One engine config, started once, running any number of scenarios."""

    def __init__(self, env: VllmEnv, engine: EngineKey, cfg: RunConfig, extra_env: dict[str, str] | None = None,
                 engine_extra: dict[str, Any] | None = None):
        self.env, self.engine, self.cfg = env, engine, cfg
        self.extra_env = extra_env or {}
        self.engine_extra = engine_extra  # further engine arguments (a fixed KV cache on a shared GPU)
        self.process: EngineProcess | None = None
        self.engine_event: EngineEvent | None = None
        self.dead_reason: str | None = None
        self._backlog: list[Event] = []
        self.wd = (cfg.work_dir / "sessions" / f"{engine.id}-{os.getpid()}").resolve()

    def start(self) -> EngineEvent:
        """Start the engine and wait for its ``engine`` event (start-up facts and effective settings)."""
        self.process = EngineProcess(self.env, self.engine, self.cfg, self.wd, interactive=True,
                                     extra_env=self.extra_env, engine_extra=self.engine_extra)
        if os.environ.get(ENGINE_LOG_ENV):
            with open(os.environ[ENGINE_LOG_ENV], "a") as f:
                f.write(f"{self.engine.id} {os.getpid()} {self.process.pgid}\n")
        self.engine_event = self._wait(EngineEvent, lambda ev: True, self.cfg.engine_timeout, "engine start-up")
        return self.engine_event

    @property
    def unsupported_reason(self) -> str | None:
        return self.engine_event.unsupported_reason if self.engine_event is not None else None

    def run(self, scenario: ScenarioSpec | dict[str, Any], timeout: float | None = None) -> ScenarioEvent:
        """Send one scenario (a ``repro.core.wire.ScenarioSpec`` or its JSON form) and return its result event."""
        sc = scenario if isinstance(scenario, ScenarioSpec) else ScenarioSpec.from_json(scenario)
        if sc.timeout is None:
            sc = replace(sc, timeout=self.cfg.scenario_timeout)
        if self.process is None:
            raise EngineDied(Outcome.ERROR, "session not started")
        if self.unsupported_reason and self.process.proc.poll() is not None:
            # Decided before start-up (e.g. no keep mode): the process has exited.
            return ScenarioEvent(sc.id, "unsupported", reason=self.unsupported_reason)
        limit = timeout or (float(sc.timeout or 0) * 3 + 30)
        try:
            self.process.send(sc.to_json())
        except OSError as exc:
            raise self._death(f"engine stdin closed ({exc})") from exc
        return self._wait(ScenarioEvent, lambda ev: ev.id == sc.id, limit, f"scenario {sc.id}")

    def _wait(self, kind: type[E], match: Callable[[E], bool], limit: float, what: str) -> E:
        """The first event of ``kind`` that ``match`` accepts (earlier events stay for later waits)."""
        assert self.process is not None

        def wanted(ev: Event) -> bool:
            return isinstance(ev, kind) and match(ev)

        proc = self.process.proc
        deadline = time.monotonic() + limit
        while True:
            self._backlog += self.process.events()
            for i, ev in enumerate(self._backlog):
                if isinstance(ev, FatalEvent):
                    self.dead_reason = ev.reason
                if isinstance(ev, kind) and match(ev):
                    del self._backlog[: i + 1]
                    return ev
            if proc.poll() is not None:
                self._backlog += self.process.events()
                if any(wanted(ev) for ev in self._backlog):
                    continue
                raise self._death(f"engine exited with code {proc.returncode} during {what}")
            if time.monotonic() > deadline:
                self.close()
                raise EngineDied(Outcome.TIMEOUT, f"{what} took more than {limit:.0f}s; engine killed")
            self.process.wait(0.2)

    def _death(self, why: str) -> EngineDied:
        self.close()
        assert self.process is not None
        dead = self.dead_reason or why
        # vLLM's root cause from the engine log when there is one (issue 21), else the log's last lines.
        reason = with_cause(dead, self.process.log_path)
        return EngineDied(Outcome.ERROR, reason or dead, None if reason else self.process.log_tail())

    def close(self) -> None:
        """Stop the engine at once: a session is closed when its cells are judged (the end of the pytest process,
        or the engine died or hung), so vLLM's own shutdown could change nothing reported: it cost two CPU sessions
        5 s at the end of a pytest run, and an H100 post-resume run 17 s after its last scenario
        (``harness.run.runner.stops_when_judged``)."""
        if self.process is not None:
            self.process.stop(at_once=True)

    @property
    def pgid(self) -> int | None:
        return self.process.pgid if self.process is not None else None
