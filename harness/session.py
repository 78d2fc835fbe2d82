"""A long-lived engine process that runs scenarios on demand (pytest items, Hypothesis examples).

Same isolation as ``runner.run_engine``: the engine runs ``python -m
repro.cell`` in its own process group; here the spec is marked interactive
and scenarios are sent one JSON line at a time on stdin, each answered by one
``scenario`` event in the event file.  ``close()`` (or a crash, or a timeout)
kills the whole group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from typing import Any

from harness.envs import VllmEnv
from harness.matrix import EngineKey
from harness.runner import EventTail, RunConfig, engine_env, engine_spec, kill_group, log_tail, stage_repro

ENGINE_LOG_ENV = "VLLM_REPRO_ENGINE_LOG"  # if set, one line per engine start is appended to this file


class SessionDead(Exception):
    """The engine process is gone; the message says how it ended."""


class EngineSession:
    """One engine config, started once, running any number of scenarios."""

    def __init__(self, env: VllmEnv, engine: EngineKey, cfg: RunConfig, extra_env: dict[str, str] | None = None):
        self.env, self.engine, self.cfg = env, engine, cfg
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.engine_event: dict[str, Any] | None = None
        self.dead_reason: str | None = None
        self._tail: EventTail | None = None
        self._backlog: list[dict[str, Any]] = []
        self.wd = (cfg.work_dir / "sessions" / f"{engine.id}-{os.getpid()}").resolve()

    def start(self) -> dict[str, Any]:
        """Start the engine and wait for its ``engine`` event (start-up facts and effective settings)."""
        if self.wd.exists():
            shutil.rmtree(self.wd)
        self.wd.mkdir(parents=True)
        stage = stage_repro(self.wd / "pkg")
        spec = {**engine_spec(self.engine, (), self.cfg), "interactive": True}
        spec_path, events = self.wd / "spec.json", self.wd / "events.jsonl"
        spec_path.write_text(json.dumps(spec, indent=2))
        self._tail = EventTail(events)
        log = open(self.wd / "engine.log", "wb")  # noqa: SIM115 - owned by the process
        env = {**engine_env(self.engine, self.cfg, stage), **self.extra_env}
        self.proc = subprocess.Popen(
            [str(self.env.python), "-m", "repro.cell", str(spec_path), str(events)],
            cwd=self.wd, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        if os.environ.get(ENGINE_LOG_ENV):
            with open(os.environ[ENGINE_LOG_ENV], "a") as f:
                f.write(f"{self.engine.id} {os.getpid()} {self.proc.pid}\n")
        self.engine_event = self._wait(lambda ev: ev.get("event") == "engine", self.cfg.engine_timeout,
                                       "engine start-up")
        return self.engine_event

    @property
    def unsupported_reason(self) -> str | None:
        return (self.engine_event or {}).get("unsupported_reason")

    def run(self, scenario: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send one scenario (``{"id", "scenario", "params", "seed"}``) and return its result event."""
        if self.proc is None:
            raise SessionDead("session not started")
        if self.unsupported_reason and self.proc.poll() is not None:
            # Decided before start-up (e.g. no keep mode): the process has exited.
            return {"event": "scenario", "id": scenario["id"], "status": "unsupported",
                    "reason": self.unsupported_reason}
        limit = timeout or (float(scenario.get("timeout", self.cfg.scenario_timeout)) * 3 + 30)
        try:
            assert self.proc.stdin is not None
            msg = {"timeout": self.cfg.scenario_timeout, **scenario}
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise SessionDead(self._death(f"engine stdin closed ({exc})")) from exc
        return self._wait(lambda ev: ev.get("event") == "scenario" and ev.get("id") == scenario["id"], limit,
                          f"scenario {scenario['id']}")

    def _wait(self, match: Any, limit: float, what: str) -> dict[str, Any]:
        assert self.proc is not None and self._tail is not None
        deadline = time.monotonic() + limit
        while True:
            self._backlog += self._tail.read()
            for i, ev in enumerate(self._backlog):
                if ev.get("event") == "fatal":
                    self.dead_reason = ev.get("reason")
                if match(ev):
                    del self._backlog[: i + 1]
                    return ev
            if self.proc.poll() is not None:
                self._backlog += self._tail.read()
                if any(match(ev) for ev in self._backlog):
                    continue
                raise SessionDead(self._death(f"engine exited with code {self.proc.returncode} during {what}"))
            if time.monotonic() > deadline:
                self.close()
                raise SessionDead(f"TIMEOUT: {what} took more than {limit:.0f}s; engine killed")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.2)

    def _death(self, why: str) -> str:
        self.close()
        return f"{self.dead_reason or why}; last log lines: {log_tail(self.wd / 'engine.log')}"

    def close(self) -> None:
        """Stop the engine (politely, then by killing its process group)."""
        if self.proc is None:
            return
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(b'{"op": "stop"}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        kill_group(self.proc.pid)
        self.proc.wait()

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None
