"""One engine process: ``python -m repro.engine SPEC OUT`` in its own process group, with its own port block
(``harness.run.ports``), its events tailed as they come, and the whole group killed however the run ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.core.cell import Cell, EngineKey
from harness.core.events import (
    Event,
    parse_line,
)
from harness.core.profiles import PROFILES
from harness.envbuild.envs import VllmEnv
from harness.envbuild.preload import preload_env
from harness.run.engine_death import log_tail
from harness.run.leftovers import RPC_VAR, Leftovers, ShmSnapshot, ipc_folder, pids_in
from harness.run.ports import lease_ports
from harness.run.spec import RunConfig, _sched_spec, build_spec, engine_axes
from harness.run.staging import stage_entry_points, stage_repro
from harness.run.vllm_cache import vllm_cache_env
from harness.sched import tier as sched_tier
from repro.core.wire import GO
from repro.patches.bind import ENV_BIND
from repro.settings.engine_axes import engine_env as axes_env

ENGINE_MODULE = "repro.engine"  # python -m ENGINE_MODULE SPEC OUT
LOOK_S = 5.0  # how often a running engine's leftovers are looked up (a few ms of /proc reading each time)


def engine_env(engine: EngineKey, cfg: RunConfig, pythonpath: Path,
               ports: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's environment; ``ports`` (its :class:`harness.run.ports.PortLease`'s) replaces a ``VLLM_PORT``
    of the caller's shell, which every engine would share, but not one the run's own ``extra_env`` sets."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(ports or {})
    env.update(
        PYTHONPATH=str(pythonpath),
        PYTHONUNBUFFERED="1",
        VLLM_REPRO_CPU_ASYNC="1" if (cfg.platform == "cpu" and engine.async_on) else "0",
        # No flashinfer wheel in our envs; its sampler is not needed for greedy.
        VLLM_USE_FLASHINFER_SAMPLER="0",
    )
    if cfg.platform == "cpu":
        # Without it vLLM's CPU backend reserves most of the machine's RAM.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.kv_cache_gib)
    # The variables the cell's engine axes decide (Ray v2, model runner, batch invariance): repro.settings.engine_axes.
    env.update(axes_env(engine_axes(engine)))
    # Where its listeners bind (--bind): repro.engine.main points vLLM, gloo and NCCL there before vLLM starts.
    env[ENV_BIND] = cfg.bind
    # Never inherited: a fault is injected only when this run asked for it.
    env["VLLM_REPRO_INJECT"] = ",".join(cfg.inject)
    env.update(cfg.extra_env)
    return env


def kill_group(pgid: int, grace: float = 10.0, at_once: bool = False) -> None:
    """SIGTERM the engine's process group and session, then SIGKILL whatever is left after ``grace`` seconds
    (``at_once``: SIGKILL only); either way, wait up to ``grace`` seconds for every process to be gone.

    The engine starts in a session of its own (``start_new_session``: session id = group id = its pid).  Its
    session, not only its group: Ray 2.60 (vLLM 0.33.0+'s bundles) puts each worker it starts in a process group of
    its own, inside the session (measured: ``ray::IDLE`` and an actor had their own pgid, the driver's sid).
    """
    if not at_once:
        if not _signal_all(pgid, signal.SIGTERM):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.1)
    _signal_all(pgid, signal.SIGKILL)
    _wait_for_exits(_pids_in_group(pgid), grace)


def _signal_all(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the group ``pgid`` and to every process of the session of that id; False when none was
    there."""
    sent = False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
        sent = True
    for pid in _pids_in_group(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            sent = True
    return sent


def _wait_for_exits(pids: list[int], timeout: float) -> None:
    """Wait until each of ``pids`` has exited (a pidfd turns readable), at most ``timeout`` seconds in all.

    SIGKILL is delivered at once but a process with much memory (a vLLM worker under load) takes a while to be
    torn down; without this wait, "stopped" could be said of a group whose processes are still exiting (seen
    2026-12-02: test_cpu_engine found one right after the run).
    """
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except OSError:  # already gone, or not ours to open
            continue
    try:
        deadline = time.monotonic() + timeout
        pending = list(fds)
        while pending and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(pending, [], [], left)
            pending = [fd for fd in pending if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in the group ``pgid`` or the session of that id."""
    for pid in _pids_in_group(pgid):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return True
    return False


def kill_engine_group(pgid: int, at_once: bool = False, since: ShmSnapshot | None = None,
                      known: Leftovers | None = None) -> None:
    """``kill_group``, then remove what only the engine's clean exit would have (:mod:`harness.run.leftovers`): the
    ipc folders its processes' environment names and, given ``since`` (``/dev/shm`` when it started), the
    ``/dev/shm`` files they map that came to be after; with those seen earlier (``known``: a process that already
    died, e.g. a crashed engine core, cannot be read now).  Also for an engine started elsewhere: a Ray task's,
    killed by the driver on the same node."""
    left = (known or Leftovers()) | Leftovers.of(_pids_in_group(pgid))
    try:
        kill_group(pgid, at_once=at_once)
    finally:
        left.remove(since)


def _pids_in_group(pgid: int) -> list[int]:
    """Every process whose group or session is ``pgid``."""
    return pids_in({pgid})


class EventTail:
    """Reads complete new lines from the engine's event file, each parsed into its typed event
    (:func:`harness.core.events.parse_line`: checked against ``repro.core.wire``).

    A line that is not JSON, or not an event the wire format describes, comes
    back as a :class:`~harness.core.events.CorruptEvent` carrying the line and, for the latter, the mismatch.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.buf = ""

    def read(self) -> list[Event]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.pos)
            chunk = f.read()
            self.pos = f.tell()
        self.buf += chunk
        *lines, self.buf = self.buf.split("\n")
        return [parse_line(line) for line in lines if line.strip()]


class EngineProcess:
    """One engine process: its work dir (staged package, spec, event file, log), process group and events.

    ``interactive`` keeps its stdin open for scenario lines (``send``);
    ``stop`` kills its whole process group and removes what it leaves.
    """

    def __init__(self, env: VllmEnv, engine: EngineKey, cfg: RunConfig, wd: Path, cells: tuple[Cell, ...] = (),
                 interactive: bool = False, extra_env: dict[str, str] | None = None,
                 engine_extra: dict[str, Any] | None = None, spec: dict[str, Any] | None = None,
                 distributions: Sequence[str] = (), gated: bool = False) -> None:
        """``spec``: the spec document itself (a scheduler-tier ``plan`` or ``fuzz``) instead of the one ``cells``
        make; ``distributions``: staged beside ``repro`` (:func:`stage_repro`); ``gated``: the engine runs its
        scenarios only after :meth:`go` (harness.run.turns)."""
        # Absolute: the engine runs with cwd=wd and PYTHONPATH pointing into it.
        self.wd = wd.resolve()
        if self.wd.exists():
            shutil.rmtree(self.wd)
        self.wd.mkdir(parents=True)
        stage = stage_repro(self.wd / "pkg", distributions)
        profile = PROFILES.get(engine.profile)
        if engine.tier == "engine" and profile is not None:
            stage_entry_points(stage, profile.entry_points)  # a plugin only its own engines load (vllm#52461)
        self.spec_path, self.events_path, self.log_path = (self.wd / "spec.json", self.wd / "events.jsonl",
                                                           self.wd / "engine.log")
        doc = spec if spec is not None else (
            _sched_spec(engine, cells, cfg) if engine.tier == "scheduler"
            else build_spec(engine, cells, cfg, interactive, engine_extra, gated).to_json())
        self.spec_path.write_text(json.dumps(doc, indent=2))
        module = sched_tier.MODULE if engine.tier == "scheduler" else ENGINE_MODULE
        self.tail = EventTail(self.events_path)
        # Its own ports until it is stopped: engines started side by side never pick the same one (issue 21).
        self.ports = lease_ports()
        environ = engine_env(engine, cfg, stage, self.ports.env)
        environ.update(preload_env(env, environ))  # vllm-cpu 0.18.x will not start without it
        environ.update(vllm_cache_env(env, cfg))
        self.ipc_dir: Path | None = None
        try:
            # vLLM's ipc sockets in a folder of the engine's own, removed by ``stop`` (harness.run.leftovers); not
            # where the run's own environment names another.
            if RPC_VAR not in cfg.extra_env:
                self.ipc_dir = ipc_folder()
                environ[RPC_VAR] = str(self.ipc_dir)
            self.shm_at_start = ShmSnapshot.now()
            self.known, self._next_look = Leftovers(), time.monotonic() + LOOK_S
            # For the benchmark (harness.bench.phases): the interpreter's start and repro.engine.main's imports
            # (vLLM's among them) come before the engine's own ``start`` event.
            (self.wd / "spawned.json").write_text(json.dumps({"t": time.time()}))
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [str(env.python), "-m", module, str(self.spec_path), str(self.events_path)],
                    cwd=self.wd, env={**environ, **(extra_env or {})},
                    stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.PIPE if interactive or gated else subprocess.DEVNULL, start_new_session=True,
                )
        except BaseException:
            self.ports.release()
            if self.ipc_dir is not None:
                shutil.rmtree(self.ipc_dir, ignore_errors=True)
            raise

    @property
    def pgid(self) -> int:
        return self.proc.pid

    def events(self) -> list[Event]:
        """The events written since the last call; also where the engine's leftovers are looked up while it runs:
        once it reports its engine (vLLM's MessageQueue exists by then), and every ``LOOK_S`` seconds."""
        events = self.tail.read()
        if time.monotonic() >= self._next_look or any(ev.kind == "engine" for ev in events):
            self.known = self.known | Leftovers.of(_pids_in_group(self.proc.pid))
            self._next_look = time.monotonic() + LOOK_S
        return events

    def wait(self, timeout: float) -> bool:
        """Whether the process has exited, waiting up to ``timeout`` seconds for it."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def send(self, msg: dict[str, Any]) -> None:
        """One JSON line on the engine's stdin (OSError when the engine is gone)."""
        if self.proc.stdin is None:
            raise BrokenPipeError("the engine was not started interactive")
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def go(self) -> None:
        """A gated engine: run the scenarios now (an engine already gone finds out by itself)."""
        with contextlib.suppress(OSError):
            self.send(GO)

    def stop(self, at_once: bool = False) -> None:
        """Kill the engine's process group and session (``at_once``: SIGKILL, no grace: for an engine whose every
        cell is judged, see ``harness.run.runner.stops_when_judged``), then remove what a killed engine leaves: its
        ports' leases, its ipc sockets, its shared-memory files.  Whatever happens, nothing of it outlives the run."""
        try:
            kill_engine_group(self.proc.pid, at_once=at_once, since=self.shm_at_start, known=self.known)
            self.proc.wait()
        finally:
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
            self.ports.release()  # only now: a process of its group could still hold one of its ports
            if self.ipc_dir is not None:  # also where its processes were gone before the kill
                shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def log_tail(self) -> str:
        return log_tail(self.log_path)
