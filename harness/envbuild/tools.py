"""Low-level helpers shared by the env backends and the wheelhouse builder: the uv binary and output tails."""

from __future__ import annotations

import contextlib
import functools
import shutil
import threading
from collections.abc import Callable

from harness.core.errors import EnvBuildError

Log = Callable[[str], None]  # where progress lines go (print, a rich console, a cluster event)

_UV_LOCK = threading.Lock()


@functools.cache
def _uv_bin() -> str:
    # find_uv_bin reads sysconfig, whose lazy initialisation is not thread-safe
    # (seen: EXE came back None when two env builds started at once): resolve
    # once, under a lock.
    with contextlib.suppress(Exception):
        from uv import find_uv_bin

        return find_uv_bin()
    found = shutil.which("uv")
    if found:
        return found
    raise EnvBuildError("uv not found; install it with 'pip install uv' (vllm-repro depends on it)")


def uv_bin() -> str:
    """The uv executable: from the ``uv`` package the harness depends on, else PATH."""
    with _UV_LOCK:
        return _uv_bin()


def last_lines(text: str, n: int = 6) -> str:
    """The last ``n`` non-blank lines of a tool's output, on one line (for an error message)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"
