"""The interpreter of a client door's side environment (issue 36): a framework whose release needs another Python
than the harness's (skyrl 0.4.0: ``Requires-Python: <3.15,>=3.12``; the vLLM envs are 3.11) gets the first
interpreter found here that satisfies its requirement, or none, and its cells are then UNSUPPORTED with the reason.

Found, in order, without a path of this machine written in: the harness's own Python (``--python``); what
``uv python find`` resolves the requirement to; the versions pyenv manages (``pyenv root``/versions, where pyenv
is on ``PATH``: uv's search stops at the first pyenv shim that does not run, so it misses them); ``python3.N`` on
``PATH``.  Each candidate is run once to read its version; one that does not run is passed over.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.envbuild.tools import uv_bin

PROBE_TIMEOUT = 30.0


@dataclass(frozen=True)
class FoundPython:
    executable: str
    version: str


def _run(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _pyenv_pythons() -> Iterator[str]:
    pyenv = shutil.which("pyenv")
    root = _run([pyenv, "root"]) if pyenv else ""
    if root:
        # Oldest first: the release nearest the framework's floor, the one its own CI is most likely to run.
        yield from sorted((str(p) for p in Path(root, "versions").glob("*/bin/python3")), key=_version_of_path)


def _version_of_path(path: str) -> tuple[int, ...]:
    name = Path(path).parent.parent.name
    return tuple(int(x) if x.isdigit() else -1 for x in name.split("."))


def candidates(requirement: str, preferred: str) -> Iterator[str]:
    yield preferred
    found = _run([uv_bin(), "python", "find", "--no-project", requirement])
    yield found.splitlines()[-1] if found else ""
    yield from _pyenv_pythons()
    for minor in range(20, 7, -1):
        yield shutil.which(f"python3.{minor}") or ""


def probe(python: str) -> FoundPython | None:
    """The interpreter ``python`` names (a path, a command, or a version uv resolves), if it runs."""
    exe = python if ("/" in python or shutil.which(python)) else _run([uv_bin(), "python", "find", python])
    out = _run([exe, "-c", "import platform, sys; print(sys.executable); print(platform.python_version())"]) \
        if exe else ""
    lines = out.splitlines()
    return FoundPython(lines[0], lines[1]) if len(lines) == 2 else None


def find_python(requirement: str, preferred: str, tried: Iterable[str] | None = None) -> FoundPython | None:
    """The first candidate interpreter whose version satisfies ``requirement`` (a PEP 440 specifier)."""
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(requirement)
    seen: set[str] = set()
    for cand in (tried if tried is not None else candidates(requirement, preferred)):
        if not cand or cand in seen:
            continue
        seen.add(cand)
        found = probe(cand)
        if found is not None and found.version in spec:
            return found
    return None
