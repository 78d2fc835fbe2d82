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
import tempfile
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
from harness.run.ports import lease_ports
from harness.run.spec import RunConfig, _sched_spec, build_spec, engine_axes
from harness.run.staging import stage_entry_points, stage_repro
from harness.run.vllm_cache import vllm_cache_env
from harness.sched import tier as sched_tier
from repro.core.wire import GO
from repro.patches.bind import ENV_BIND
from repro.settings.engine_axes import engine_env as axes_env

ENGINE_MODULE = "repro.engine"  # python -m ENGINE_MODULE SPEC OUT


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


SHM = Path("/dev/shm")
IPC_PREFIX = "vllm-repro-ipc-"  # an engine's own folder for vLLM's ipc sockets (EngineProcess)


def kill_engine_group(pgid: int, at_once: bool = False) -> None:
    """``kill_group``, then remove what only the engine's clean exit would have: the ``/dev/shm`` files its
    processes map and the ipc folders their environment names (an engine started elsewhere: a Ray task's, killed
    by the driver on the same node)."""
    inodes, folders = shm_segments(pgid), ipc_folders(pgid)
    kill_group(pgid, at_once=at_once)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    remove_segments(inodes)


def ipc_folders(pgid: int) -> frozenset[Path]:
    """The engines' ipc folders (``VLLM_RPC_BASE_PATH`` = a folder named ``IPC_PREFIX...``) in the environment of
    the processes of the group or session ``pgid``."""
    found = set()
    for pid in _pids_in_group(pgid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                variables = f.read().split(b"\0")
        except OSError:
            continue
        for var in variables:
            name, _, value = var.decode(errors="replace").partition("=")
            if name == "VLLM_RPC_BASE_PATH" and Path(value).name.startswith(IPC_PREFIX):
                found.add(Path(value))
    return frozenset(found)


def shm_segments(pgid: int) -> frozenset[int]:
    """The inodes of the shared-memory files (``/dev/shm``) that the processes of the group or session ``pgid``
    have mapped.

    vLLM's ``MessageQueue`` (vllm/distributed/device_communicators/shm_broadcast.py) creates a segment of up to
    250 MB in the engine core and unlinks it only in the creator's ``__del__``; Python's named semaphores
    (``sem.mp-*``, multiprocessing's spawn context) go only at a clean exit or by its resource tracker.  A killed
    engine leaves them (measured 2026-12-05 on vllm-cpu 0.21.0, mp: one ``psm_*`` of 251,658,260 bytes left by one
    of two SIGTERMed sessions; two ``sem.mp-*`` by four SIGKILLed engines).  By inode, not by name: glibc maps a
    semaphore under a temporary name it unlinks at once (``/dev/shm/sem.XXXXXX (deleted)`` in the maps) and links
    the same inode as ``sem.<name>``.  A file one engine maps is that engine's own: no other engine attaches to it.
    """
    found = set()
    for pid in _pids_in_group(pgid):
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            if len(fields) == 6 and fields[5].startswith(f"{SHM}/") and fields[4].isdigit():
                found.add(int(fields[4]))
    return frozenset(found)


def remove_segments(inodes: frozenset[int]) -> None:
    """Unlink the files of ``/dev/shm`` whose inode is one of ``inodes`` (those its now dead engine left; what
    its own shutdown removed has no name any more)."""
    if not inodes:
        return
    with contextlib.suppress(OSError), os.scandir(SHM) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.inode() in inodes and not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.path)


def _pids_in_group(pgid: int) -> list[int]:
    """Every process whose group or session is ``pgid`` (/proc/PID/stat: the 3rd and 4th fields after the name)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if pgid in (int(fields[2]), int(fields[3])):
                pids.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return pids


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
    ``stop`` asks it to end, then kills its whole process group.
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
        # vLLM's ZMQ ipc sockets (``ipc://$VLLM_RPC_BASE_PATH/<uuid>``, vllm/utils/network_utils.py
        # ``get_open_zmq_ipc_path``, default the system temp dir) outlive a killed engine: 7 per mp engine on
        # vllm-cpu 0.21.0, left in /tmp by every judged engine (measured 2026-12-05).  Its own folder, removed by
        # ``stop``; short, so the socket path stays under the 107-byte limit wherever the reports are.
        self.ipc_dir = Path(tempfile.mkdtemp(prefix=IPC_PREFIX))
        environ["VLLM_RPC_BASE_PATH"] = str(self.ipc_dir)
        # For the benchmark (harness.bench.phases): the interpreter's start and repro.engine.main's imports (vLLM's
        # among them) come before the engine's own ``start`` event.
        (self.wd / "spawned.json").write_text(json.dumps({"t": time.time()}))
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [str(env.python), "-m", module, str(self.spec_path), str(self.events_path)],
                    cwd=self.wd, env={**environ, **(extra_env or {})},
                    stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.PIPE if interactive or gated else subprocess.DEVNULL, start_new_session=True,
                )
        except BaseException:
            self.ports.release()
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            raise

    @property
    def pgid(self) -> int:
        return self.proc.pid

    def events(self) -> list[Event]:
        return self.tail.read()

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
        ports' leases, its ipc sockets, its shared-memory segments.  Whatever happened, nothing of it outlives the
        run."""
        kill_engine_group(self.proc.pid, at_once=at_once)
        self.proc.wait()
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.ports.release()  # only now: a process of its group could still hold one of its ports
        shutil.rmtree(self.ipc_dir, ignore_errors=True)  # also where its processes were gone before the kill

    def log_tail(self) -> str:
        return log_tail(self.log_path)
