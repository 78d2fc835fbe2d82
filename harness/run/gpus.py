"""Visible GPUs, and GPU slot leases for engines running side by side in separate processes (pytest-xdist workers).

The harness never imports torch, so GPUs are counted from the device nodes
(or ``nvidia-smi -L``) and narrowed by ``CUDA_VISIBLE_DEVICES``.  A lease is a
set of ``flock`` locks in a folder every worker shares, sized by the same
:class:`harness.run.slots.Capacity` as the matrix's threads: one of ``jobs``
job locks, and on each of the ``tp`` GPUs an engine needs one of that GPU's
``per_gpu`` slot locks, held for the engine's lifetime (so with ``per_gpu`` 1
two engines never share a GPU, and a TP=2 engine always takes two).  Which
GPUs is ``harness.run.slots.pick_gpus``, the matrix's own choice.  A GPU's
start-up lock is held by an engine from spawn until it reports ready where
``harness.run.slots.engine_start`` says its memory profiling must run alone.
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

from harness.core.errors import ReproError
from harness.run.slots import Capacity, pick_gpus, whole_gpus


class GpuLeaseError(ReproError):
    """No GPU slots (or start-up lock) became free in time, or an engine needs more GPUs than are visible."""


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
    """Locks on ``gpus`` held until :meth:`release` (file locks, so across processes)."""

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


def _try_lock(path: Path) -> IO[bytes] | None:
    """``path`` locked by a new open file (flock locks belong to it: a second open in this process is refused
    like another process), or None when someone holds it."""
    f = open(path, "wb")  # noqa: SIM115 - held until released
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def _unlock(files: list[IO[bytes]]) -> None:
    GpuLease((), files).release()


def lease_slots(need: int, lock_dir: Path, cap: Capacity, timeout: float, alone: bool = False) -> GpuLease:
    """A job slot and, on ``need`` of ``cap.gpus``, one slot each that no other lease holds (``alone``: every
    slot of GPUs no other lease touches); waits up to ``timeout`` seconds for them (other engines end and
    release theirs)."""
    if need > len(cap.gpus):
        raise GpuLeaseError(f"an engine needs {need} GPUs but only {len(cap.gpus)} are visible "
                            f"({','.join(cap.gpus) or 'none'})")
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    while True:
        # One allocator lock makes taking the slots atomic: no two leases can each hold half of what both need.
        with open(lock_dir / "allocator.lock", "wb") as alloc:
            fcntl.flock(alloc, fcntl.LOCK_EX)
            lease = _take(need, lock_dir, cap, alone)
        if lease is not None:
            return lease
        if time.monotonic() >= deadline:
            raise GpuLeaseError(f"no {'free GPU' if alone else 'slot'} on {need} GPU(s) among {','.join(cap.gpus)} "
                                f"({cap.per_gpu} engine(s) "
                                f"per GPU, {cap.jobs} at once) within {timeout:.0f}s (held by other engines; "
                                f"see {lock_dir})")
        # Waiting for another engine to end: it releases its locks when it closes.
        time.sleep(0.5)


def _take(need: int, lock_dir: Path, cap: Capacity, alone: bool = False) -> GpuLease | None:
    """Under the allocator lock: a free job slot and the least loaded GPUs' free slots (``alone``: all slots of
    unused GPUs), or None (nothing held)."""
    job = next((f for i in range(cap.jobs) if (f := _try_lock(lock_dir / f"job-{i}.lock"))), None)
    if job is None:
        return None
    # Every free slot of every GPU, locked while counting; those not kept are unlocked below.
    free = {g: [f for i in range(cap.per_gpu) if (f := _try_lock(lock_dir / f"gpu-{g}-slot-{i}.lock"))]
            for g in cap.gpus}
    counts = {g: len(fs) for g, fs in free.items()}
    chosen = pick_gpus(whole_gpus(counts, cap.per_gpu) if alone else counts, cap.gpus, need)
    kept = [f for g in chosen or () for f in (free.pop(g) if alone else [free[g].pop()])]
    _unlock([f for fs in free.values() for f in fs])
    if chosen is None:
        _unlock([job])
        return None
    return GpuLease(chosen, [job, *kept])


def hold_startup(lock_dir: Path, gpus: tuple[str, ...], timeout: float) -> GpuLease:
    """The start-up locks of ``gpus``, taken in the given (visible) order so that two engines never each wait on
    the other's; waits up to ``timeout`` seconds for an engine starting there to report ready."""
    if gpus:
        lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    held: list[IO[bytes]] = []
    for g in gpus:
        while (f := _try_lock(lock_dir / f"gpu-{g}-startup.lock")) is None:
            if time.monotonic() >= deadline:
                _unlock(held)
                raise GpuLeaseError(f"GPU {g}'s start-up lock was not free within {timeout:.0f}s "
                                    f"(another engine starting there; see {lock_dir})")
            time.sleep(0.5)
        held.append(f)
    return GpuLease(gpus, held)
