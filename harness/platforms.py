"""Which platform a run targets: detected from the host, or a validated ``--platform`` value."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.errors import BadInput
from harness.matrix import PLATFORMS


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
