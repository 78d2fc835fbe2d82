"""Engines side by side: how many at once, on which GPUs, how each starts (``harness.run.local`` runs them in threads,
the pytest plugin in xdist workers through ``harness.run.gpus``' file locks).

One engine of the tiny model uses about 5 % of an H200's memory and one CPU core, and its start-up (15-44 s
on an H200, 26-80 s on 2 CPU cores) is per-process work that overlaps well: measured on one H200, four
matrix runs side by side took 233 s where one at a time took 661 s.  So engines run ``jobs`` at a time,
several per GPU when the model is small, each on GPUs with a free slot.

Concurrent start-ups on one GPU must not break each other: vLLM's memory profiling assumes no other
process allocates meanwhile (seen: "No available memory for the cache blocks" and "Error in memory
profiling ... release GPU memory while vLLM is profiling").  Where the vLLM version has
``kv_cache_memory_bytes`` the engine gets a fixed KV cache and skips that profiling; elsewhere its
start-up holds the GPU's start-up lock until the engine reports ready (``engine_start`` decides which).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.profiles import PROFILES

if TYPE_CHECKING:
    from harness.core.cell import EngineKey
    from harness.envbuild.envs import VllmEnv
SHARED_GPU_KV_BYTES = 256 * 2**20
# Up to 16 tiny-model engines share one GPU (each takes ~1 GiB with the fixed KV cache above): measured on one
# H200 with 16 cores (docs/results/gpu-h200-speed-2026-12-04/), the default GPU matrix's 14 engines all at once ran
# in 76 s where 8 at a time (the old bound) took 168 s with their start-ups queued behind Ray's; the cores, one
# per engine and one for the harness, bound it first.
MAX_PER_GPU = 16


@dataclass(frozen=True)
class Capacity:
    """Engines at once (``jobs``), and on cuda the GPUs with ``per_gpu`` engines each at most; ``scenarios``: of
    those, how many run their scenarios at once (0: all; the others start up meanwhile, harness.run.turns)."""

    jobs: int
    gpus: tuple[str, ...] = ()
    per_gpu: int = 1
    scenarios: int = 0

    @property
    def shares_gpus(self) -> bool:
        return self.per_gpu > 1 and self.jobs > 1


def auto_jobs(platform: str, gpus: Sequence[str], gpu_memory_utilization: float | None,
              cores: int | None = None) -> Capacity:
    """The automatic capacity: 1 on small CPU machines; on cuda, engines per GPU bounded by the GPU memory
    fraction each takes and by the CPU cores (one per engine, one left for the harness)."""
    cores = cores or os.cpu_count() or 1
    if platform != "cuda" or not gpus:
        # An engine on vLLM's CPU platform wants several cores of its own (OpenMP).
        return Capacity(jobs=max(1, cores // 8))
    fraction = gpu_memory_utilization or 0.9
    per_gpu = max(1, min(MAX_PER_GPU, int(0.9 / fraction)))
    return Capacity(jobs=max(1, min(per_gpu * len(gpus), cores - 1)), gpus=tuple(gpus), per_gpu=per_gpu)


def for_workers(cap: Capacity, workers: int) -> Capacity:
    """``cap`` where at most ``workers`` engines can run at once (pytest-xdist workers run one engine each): with
    one worker no GPU is shared, so engines keep vLLM's own memory profiling and start without waiting."""
    jobs = max(1, min(cap.jobs, workers))
    return Capacity(jobs, cap.gpus, min(cap.per_gpu, jobs)) if cap.gpus else Capacity(jobs)


def capacity(jobs: int, platform: str, gpus: Sequence[str], gpu_memory_utilization: float | None,
             cores: int | None = None) -> Capacity:
    """``--jobs N`` (0: automatic): N engines at once, spread over the GPUs.

    On the CPU platform engines *pipeline* (harness.run.turns): as many run their scenarios at once as
    :func:`auto_jobs` allows (one on a small machine, as before), and automatic capacity starts one more, whose
    start-up overlaps the others' scenarios and teardown; ``--jobs N`` starts N, with the same scenario bound."""
    if platform != "cuda" or not gpus:
        decode = auto_jobs(platform, gpus, gpu_memory_utilization, cores).jobs
        return Capacity(jobs=jobs if jobs > 0 else decode + 1, scenarios=decode)
    if jobs <= 0:
        return auto_jobs(platform, gpus, gpu_memory_utilization)
    per_gpu = -(-jobs // len(gpus))  # ceil: N engines over the GPUs
    return Capacity(jobs=jobs, gpus=tuple(gpus), per_gpu=per_gpu)


@dataclass
class Slots:
    """Which engines may start now: at most ``jobs`` at once, each on ``need`` distinct GPUs with a free slot."""

    cap: Capacity
    running: int = 0
    free: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free = {g: self.cap.per_gpu for g in self.cap.gpus}

    def fits(self, need: int) -> bool:
        """Whether an engine needing ``need`` GPUs could ever start here."""
        return need == 0 or need <= len(self.cap.gpus)

    def take(self, need: int, alone: bool = False) -> tuple[str, ...] | None:
        """GPUs for an engine that needs ``need`` of them (``()`` on cpu), or None when it must wait.

        ``alone``: the engine needs its GPUs to itself (:attr:`EngineProfile.gpu_alone`): it takes every slot of
        GPUs on which no other engine runs."""
        if self.running >= self.cap.jobs:
            return None
        chosen = pick_gpus(whole_gpus(self.free, self.cap.per_gpu) if alone else self.free, self.cap.gpus, need)
        if chosen is None:
            return None
        for g in chosen:
            self.free[g] -= self.cap.per_gpu if alone else 1
        self.running += 1
        return chosen

    def give(self, gpus: tuple[str, ...], alone: bool = False) -> None:
        """An engine ended: its GPU slots (all of them, for one that ran ``alone``) and its job are free again."""
        for g in gpus:
            self.free[g] += self.cap.per_gpu if alone else 1
        self.running -= 1


def whole_gpus(free: Mapping[str, int], per_gpu: int) -> dict[str, int]:
    """The GPUs with every slot free (no engine on them), for an engine that must run alone."""
    return {g: n for g, n in free.items() if n >= per_gpu}


def pick_gpus(free: Mapping[str, int], gpus: Sequence[str], need: int) -> tuple[str, ...] | None:
    """The ``need`` GPUs an engine goes on, given each GPU's free slots: the least loaded first (ties in visible
    order), so engines spread before they stack; ``()`` when it needs none, None when too few have a free slot."""
    order = sorted((g for g in gpus if free.get(g, 0) > 0), key=lambda g: -free[g])
    if len(order) < need:
        return None
    return tuple(sorted(order[:need], key=list(gpus).index))


@dataclass(frozen=True)
class EngineStart:
    """How an engine on ``gpus`` starts beside others: its extra engine arguments (a fixed KV cache), and the GPUs
    whose start-up lock it holds from spawn until it reports ready (its memory profiling must run alone there)."""

    engine_extra: dict[str, Any] | None = None
    startup_locks: tuple[str, ...] = ()


def runs_alone(key: EngineKey) -> bool:
    """Whether the engine of ``key`` needs its GPUs to itself (its profile's ``gpu_alone``, e.g. sleep)."""
    profile = PROFILES.get(key.profile)
    return key.tier == "engine" and profile is not None and profile.gpu_alone


def engine_start(cap: Capacity, gpus: tuple[str, ...], env: VllmEnv, alone: bool = False) -> EngineStart:
    """The start of an engine on ``gpus`` under ``cap``, for the matrix's threads and pytest's workers alike
    (``alone``: it holds every slot of its GPUs, so it starts as in a one-at-a-time run)."""
    if not cap.shares_gpus or not gpus or alone:
        return EngineStart()  # a GPU of its own: vLLM's memory profiling, as in a one-at-a-time run
    if supports_fixed_kv(env):
        return EngineStart(engine_extra={"kv_cache_memory_bytes": SHARED_GPU_KV_BYTES})
    return EngineStart(startup_locks=gpus)


def supports_fixed_kv(env: VllmEnv) -> bool:
    """Whether the env's vLLM takes ``kv_cache_memory_bytes`` (read from its source; the harness never imports
    vllm).  Then a fixed KV cache skips the memory profiling that concurrent start-ups on one GPU break."""
    for args in Path(env.path).glob("lib/python3*/site-packages/vllm/engine/arg_utils.py"):
        try:
            return "kv_cache_memory_bytes" in args.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    return False
