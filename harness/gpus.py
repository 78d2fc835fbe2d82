"""Visible GPUs and disjoint GPU leases for engines running side by side (pytest-xdist workers).

The harness never imports torch, so GPUs are counted from the device nodes
(or ``nvidia-smi -L``) and narrowed by ``CUDA_VISIBLE_DEVICES``.  A lease is a
set of per-GPU ``flock`` locks in a folder every worker shares: an engine that
needs ``tp`` GPUs holds ``tp`` locks for its lifetime, so two engines never
share a GPU and a TP=2 engine takes two.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.errors import ReproError


class GpuLeaseError(ReproError):
    """No disjoint set of GPUs became free in time."""


def _physical_gpus() -> list[str]:
    nodes = sorted(int(m.group(1)) for p in Path("/dev").glob("nvidia*") if (m := re.fullmatch(r"nvidia(\d+)", p.name)))
    if nodes:
        return [str(n) for n in nodes]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """GPU ids an engine started from here may use (``CUDA_VISIBLE_DEVICES`` wins when set)."""
    env = os.environ if environ is None else environ
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is not None:
        return [g.strip() for g in raw.split(",") if g.strip() and g.strip() != "-1"]
    return _physical_gpus()


@dataclass
class GpuLease:
    """``tp`` GPUs held exclusively until :meth:`release` (file locks, so across processes)."""

    gpus: tuple[str, ...]
    _files: list[IO[bytes]] = field(default_factory=list, repr=False)

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)}

    def release(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        self._files.clear()


def lease_gpus(n: int, lock_dir: Path, gpus: list[str], timeout: float) -> GpuLease:
    """Take ``n`` of ``gpus`` that no other lease holds, waiting up to ``timeout`` seconds for them."""
    if n > len(gpus):
        raise GpuLeaseError(f"an engine needs {n} GPUs but only {len(gpus)} are visible ({','.join(gpus) or 'none'})")
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    while True:
        got: list[tuple[str, IO[bytes]]] = []
        # One allocator lock makes taking n GPUs atomic: no two leases can each
        # hold half of what both need.
        with open(lock_dir / "allocator.lock", "wb") as alloc:
            fcntl.flock(alloc, fcntl.LOCK_EX)
            for g in gpus:
                f = open(lock_dir / f"gpu-{g}.lock", "wb")  # noqa: SIM115 - held for the lease's lifetime
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                got.append((g, f))
                if len(got) == n:
                    return GpuLease(tuple(g for g, _ in got), [f for _, f in got])
            for _, f in got:
                fcntl.flock(f, fcntl.LOCK_UN)
                f.close()
        if time.monotonic() > deadline:
            raise GpuLeaseError(f"no {n} free GPU(s) among {','.join(gpus)} within {timeout:.0f}s "
                                f"(held by other engines; see {lock_dir})")
        # Waiting for another engine to end: it releases its locks when it closes.
        time.sleep(0.5)
