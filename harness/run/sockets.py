"""The listening sockets of a run's processes, read from ``/proc`` (issue 35: loopback only).

No psutil: the harness's own environment does not have it.  A socket is a ``socket:[INODE]`` link under
``/proc/PID/fd``; ``/proc/net/tcp`` and ``tcp6`` (state ``0A``, LISTEN) give each inode's local address, and
``udp``/``udp6`` the same for datagram sockets bound and not connected (UDP has no listen state).  The address is
hex in the kernel's byte order (little-endian on x86 and arm64): ``0100007F`` is 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PPID, _PGRP = 0, 1  # /proc/PID/stat fields 4 and 5, counted after the state
_LISTEN = "0A"  # include/net/tcp_states.h: TCP_LISTEN
_TABLES = (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6), ("udp", socket.AF_INET), ("udp6", socket.AF_INET6))


@dataclass(frozen=True)
class Listener:
    """One socket listening (tcp) or bound (udp) by a process of the run."""

    pid: int
    proto: str  # tcp, tcp6, udp, udp6
    address: str
    port: int
    command: str

    @property
    def loopback(self) -> bool:
        addr = ipaddress.ip_address(self.address)
        mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is loopback too
        return bool(addr.is_loopback or (mapped is not None and mapped.is_loopback))

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.proto} {host}:{self.port} (pid {self.pid}, {self.command})"


def _address(hex_addr: str, family: int) -> str:
    raw = bytes.fromhex(hex_addr)
    # Each 32-bit word is in host byte order; repack to network order.
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return socket.inet_ntop(family, struct.pack(f"!{len(words)}I", *words))


def _table(proc: Path, name: str, family: int) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of the table's listening (tcp) or bound (udp) sockets."""
    out: dict[int, tuple[str, int]] = {}
    try:
        lines = (proc / "net" / name).read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        f = line.split()
        if len(f) < 10 or (f[3] != _LISTEN if name.startswith("tcp") else not f[2].endswith(":0000")):
            continue  # tcp: not listening; udp: connected to a peer (vLLM's get_ip() probe), nothing to reach
        hex_addr, _, hex_port = f[1].partition(":")
        out[int(f[9])] = (_address(hex_addr, family), int(hex_port, 16))
    return out


def _socket_inodes(proc: Path, pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:  # gone, or not ours to read
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _command(proc: Path, pid: int) -> str:
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def listeners(pids: Iterable[int], proc: Path = Path("/proc")) -> list[Listener]:
    """Every listening tcp and bound udp socket the processes ``pids`` hold (a socket shared by several: each)."""
    tables = {name: _table(proc, name, family) for name, family in _TABLES}
    out: list[Listener] = []
    for pid in sorted(set(pids)):
        inodes = _socket_inodes(proc, pid)
        for name, table in tables.items():
            out += [Listener(pid, name, *table[i], _command(proc, pid)) for i in sorted(inodes & table.keys())]
    return out


def group_pids(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes of process group ``pgid`` (an engine's group: harness.run.engine_process)."""
    return [pid for pid in _pids(proc) if _stat_field(proc, pid, _PGRP) == pgid]


def tree_pids(root: int, proc: Path = Path("/proc")) -> list[int]:
    """``root`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for pid in _pids(proc):
        children.setdefault(_stat_field(proc, pid, _PPID), []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _pids(proc: Path) -> list[int]:
    return [int(d.name) for d in proc.iterdir() if d.name.isdigit()]


def _stat_field(proc: Path, pid: int, index: int) -> int:
    """Field ``index`` after the command and state of ``/proc/PID/stat`` (proc(5): ppid, pgrp, session...); -1 when
    the process is gone."""
    try:
        rest = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return -1
    return int(rest[1 + index])


def exposed(found: Iterable[Listener]) -> list[Listener]:
    """The sockets reachable from another machine: bound to anything but loopback."""
    return [s for s in found if not s.loopback]


def snapshot(pgid: int, bind: str) -> dict[str, Any]:
    """What an engine's process group listens on now, for its cells' records (``engine.sockets`` in results.json):
    every listener, and those beyond loopback.  Taken when the engine reports it started (its workers' stores
    and gloo are up); Ray's daemons live outside the group and are not seen (docs/security.md)."""
    found = listeners(group_pids(pgid))
    return {"bind": bind, "listening": [str(s) for s in found], "exposed": [str(s) for s in exposed(found)]}
