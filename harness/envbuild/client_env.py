"""The client door's side environments (issue 36): an RL framework's released package, installed with uv and
``--no-deps`` beside only the light requirements its client module needs (``repro.client.clients.CLIENTS``), one
cached environment per framework release and Python, under the cache's ``envs/`` like the vLLM envs.

No torch, no transformers: what the client's import would pull in besides is replaced by the stand-ins of
``repro.client.clients.STANDINS`` in the side process (``repro.client.side``).  A package that does not install is
:class:`ClientEnvError` with the installer's last line (its cells are ERROR with it, and the run goes on).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import BadInput, EnvBuildError
from harness.core.versions import version_key
from harness.envbuild.cache import STATUS_FILE, build_log, env_dir, env_lock, env_status, touch
from harness.envbuild.index import IndexConfig
from harness.envbuild.index_releases import Fetch, fetch_releases
from harness.envbuild.tools import last_lines, uv_bin
from repro.client.clients import Client

INSTALL_TIMEOUT = 600.0
DEFAULT_TRIES = 3  # releases tried, newest first, when no --framework-version is given


class ClientEnvError(EnvBuildError):
    """The framework's package did not install; the message ends with the installer's last line."""


@dataclass(frozen=True)
class ClientEnv:
    framework: str
    version: str
    python: str  # the side environment's interpreter
    path: Path
    server_main: str = ""  # the framework's own server entry point, a file of the installed package (AReaL)
    site: str = ""  # the side environment's site-packages, imported by the engine process (an in-process client)

    def to_spec(self) -> dict[str, str]:
        """What ``repro.core.wire.Spec.client`` carries."""
        spec = {"framework": self.framework, "version": self.version, "python": self.python}
        extra = {"server_main": self.server_main, "site": self.site}
        return {**spec, **{k: v for k, v in extra.items() if v}}


def _python_version(python: str) -> str:
    """``3.11.7`` of the interpreter uv resolves ``python`` (a version or a path) to."""
    proc = subprocess.run([uv_bin(), "python", "find", python], capture_output=True, text=True, timeout=60)
    exe = proc.stdout.strip() or python
    out = subprocess.run([exe, "-c", "import platform; print(platform.python_version())"], capture_output=True,
                         text=True, timeout=60)
    if out.returncode:
        raise EnvBuildError(f"python {python} for the client environment: {last_lines(out.stderr, 1)}")
    return out.stdout.strip()


def releases(client: Client, index: IndexConfig, python_version: str, fetch: Fetch | None = None) -> list[str]:
    """The framework's releases on the index that this Python may install, oldest first (no pre-releases)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    out = []
    for rel in (fetch or fetch_releases)(client.package, index.index_url):
        try:
            v = Version(rel.version)
            fits = Version(python_version) in SpecifierSet(rel.requires_python or "")
        except (InvalidVersion, InvalidSpecifier):
            continue
        if fits and not rel.yanked and not v.is_prerelease:
            out.append(rel.version)
    return sorted(out, key=version_key)


def chosen_versions(client: Client, asked: str | None, available: Sequence[str], tries: int = DEFAULT_TRIES
                    ) -> tuple[str, ...]:
    """The releases to try, in order: ``asked`` (BadInput listing the index's releases when it has no such one),
    else the newest ``tries`` releases, newest first."""
    if asked is not None:
        if asked not in available:
            raise BadInput(f"unknown --framework-version {asked!r} for {client.package}; the index has: "
                           + (", ".join(available) or "no release"))
        return (asked,)
    if not available:
        raise BadInput(f"the index has no release of {client.package} for this Python")
    return tuple(reversed(available[-tries:]))


def env_name(client: Client, version: str, python_version: str, index: IndexConfig) -> str:
    key = json.dumps([client.requirements, index.uv_args(), client.module])
    return (f"client-{client.package}-{version}-py{python_version}-"
            f"{hashlib.sha256(key.encode()).hexdigest()[:12]}")


def _install(client: Client, version: str, python: str, index: IndexConfig, path: Path) -> None:
    uv = uv_bin()
    with open(build_log(path), "w") as log:
        for cmd in ([uv, "venv", "--quiet", "--clear", "--python", python, str(path)],
                    [uv, "pip", "install", "--python", str(path / "bin" / "python"), "--no-deps",
                     *index.uv_args(), f"{client.package}=={version}", *client.requirements]):
            log.write(f"$ {' '.join(cmd)}\n")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            log.write(proc.stdout + proc.stderr)
            if proc.returncode:
                shutil.rmtree(path, ignore_errors=True)
                raise ClientEnvError(f"installing {client.package}=={version} failed: "
                                     f"{last_lines(proc.stderr or proc.stdout, 1).strip()} (log: {build_log(path)})")


def ensure_client_env(client: Client, version: str, cache_dir: Path, python: str, index: IndexConfig,
                      python_version: str | None = None) -> ClientEnv:
    """The side environment of ``client`` at ``version``: reused from the cache, else built."""
    pv = python_version or _python_version(python)
    path = env_dir(cache_dir, env_name(client, version, pv, index))
    with env_lock(path):
        if env_status(path) is None:
            t0 = time.monotonic()
            _install(client, version, python, index, path)
            (path / STATUS_FILE).write_text(json.dumps({
                "kind": "client", "framework": client.framework, "package": client.package, "version": version,
                "python": pv, "requirements": list(client.requirements), "no_deps": True,
                "build_s": round(time.monotonic() - t0, 1)}, indent=1))
        touch(path)
    site = str(next(iter(sorted(path.glob("lib/python*/site-packages"))), "")) if client.in_process else ""
    return ClientEnv(client.framework, version, str(path / "bin" / "python"), path, server_main(client, path), site)


def server_main(client: Client, path: Path) -> str:
    """The installed file of the framework's own server entry point (``Client.server_main``), or "" for none;
    ClientEnvError when the release has no such file (its cells are then ERROR with this line)."""
    if not client.server_main:
        return ""
    for site in sorted(path.glob("lib/python*/site-packages")):
        if (site / client.server_main).is_file():
            return str(site / client.server_main)
    raise ClientEnvError(f"{client.package} in {path} has no {client.server_main} (the server entry point the "
                         f"client door runs)")


def newest_that_installs(client: Client, versions: Sequence[str], build: Callable[[str], ClientEnv]
                         ) -> tuple[ClientEnv | None, tuple[str, ...]]:
    """The first of ``versions`` whose environment builds, and why each one before it did not."""
    failures: list[str] = []
    for v in versions:
        try:
            return build(v), tuple(failures)
        except ClientEnvError as exc:
            failures.append(str(exc))
    return None, tuple(failures)
