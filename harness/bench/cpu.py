"""CPU seconds of a benchmarked run, per engine: sampled from ``/proc`` while the workload runs (Linux).

``getrusage(RUSAGE_CHILDREN)`` around the workload counts only processes reaped under it: measured on the 2-core
machine (2026-12-04, the repro workload with the stale-kv scenarios) it said 147 CPU s where sampling every process
said 548, because an engine is stopped by killing its process group and its engine core and workers, never reaped
by their parent, are not counted.  So every 0.5 s each process whose working directory lies under the run's
reports folder (an engine runs in its own folder: ``engines/<engine>/``, or a pytest session's
``<worker>/sessions/<engine>-<pid>/``), and the workload's own process, is read (``utime + stime`` of
``/proc/<pid>/stat``) and its largest value kept; a process is known by its pid and start time.  What a process
spends after its last sample, or a process living less than one interval, is missed: a lower bound.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

INTERVAL_S = 0.5
WORKLOAD = "workload"  # the workload's own process (the matrix, pytest), beside the engines


@dataclass(frozen=True)
class CpuSample:
    """The sampled CPU seconds: in all, per engine folder (``workload``: the command itself) and processes seen."""

    cpu_s: float
    per_engine: dict[str, float] = field(default_factory=dict)
    processes: int = 0


def engine_of(rel: tuple[str, ...]) -> str | None:
    """The engine a working directory (parts relative to the reports folder) belongs to, or None."""
    if "engines" in rel[:-1]:
        return rel[rel.index("engines") + 1]
    if "sessions" in rel[1:-1]:
        i = rel.index("sessions")
        return f"{rel[i - 1]}/{rel[i + 1].rsplit('-', 1)[0]}"
    return None


def _cpu_and_start(pid: str) -> tuple[float, str]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), fields[19]


class CpuSampler:
    """Samples ``/proc`` in a thread from :meth:`start` to :meth:`stop`; None from ``stop`` where there is no /proc."""

    def __init__(self, root: Path, pid: int) -> None:
        self.root, self.pid = str(root.resolve()), str(pid)
        self.seen: dict[tuple[str, str], tuple[float, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CpuSampler:
        if Path("/proc/self/stat").is_file():
            self._thread.start()
        return self

    def sample(self) -> None:
        """One pass over every process."""
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                if pid == self.pid:
                    group = WORKLOAD
                elif cwd.startswith(self.root + os.sep):
                    group = engine_of(tuple(Path(cwd[len(self.root) + 1:]).parts)) or WORKLOAD
                else:
                    continue
                cpu, started = _cpu_and_start(pid)
            except (OSError, ValueError, IndexError):
                continue  # gone, or not ours to read
            key = (pid, started)
            self.seen[key] = (max(cpu, self.seen.get(key, (0.0, ""))[0]), group)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(INTERVAL_S)

    def stop(self) -> CpuSample | None:
        if not self._thread.is_alive():
            return None
        self._stop.set()
        self._thread.join()
        per: dict[str, float] = {}
        for cpu, group in self.seen.values():
            per[group] = per.get(group, 0.0) + cpu
        return CpuSample(round(sum(per.values()), 1), {k: round(v, 1) for k, v in sorted(per.items())},
                         len(self.seen))
