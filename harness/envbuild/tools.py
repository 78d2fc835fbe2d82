"""Low-level helpers shared by the env backends and the wheelhouse builder: the uv binary and output tails."""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path

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


def uv_python(request: str) -> str:
    """What ``uv venv --python`` is given for an env of Python ``request`` (``MAJOR.MINOR``): the harness's own base
    interpreter when it is that version, else the request for uv to find.

    uv looks for a version only among its own installs and the interpreters on PATH; one the harness runs under but
    PATH does not name (a pyenv version that is not the global one, a Python run by its full path) is skipped, and
    uv then downloads a CPython from GitHub, which the README's "network access to PyPI" does not promise.  Measured:
    a fresh clone under pyenv's 3.12.1 (python3 on PATH: 3.11.7), uv 0.13.9 tried python-build-standalone's
    cpython-3.12.16 and every env of ``tox -e repro`` was BUILD-FAILED with a DNS error."""
    if request == f"{sys.version_info.major}.{sys.version_info.minor}":
        # A venv's (tox's) own python names the interpreter it was made from: the env is made from that one too.
        base = getattr(sys, "_base_executable", "") or sys.executable
        if base and Path(base).is_file():
            return base
    return request


def last_lines(text: str, n: int = 6) -> str:
    """The last ``n`` non-blank lines of a tool's output, on one line (for an error message)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"
