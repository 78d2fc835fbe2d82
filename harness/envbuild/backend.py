"""The ``EnvBackend`` protocol and the build step every backend shares.

A backend installs vLLM into a fresh folder; ``build_env`` does the rest the
same way for all of them: the folder and its build log, the log line, the
smoke import of vllm and torch (an env is valid only once it has succeeded),
the refusal of an env whose vllm is not the release asked for, and the status
file, written last, whose presence makes the env valid.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

from packaging.version import InvalidVersion, Version

from harness.core.errors import EnvBuildError
from harness.envbuild.cache import STATUS_FILE, build_log
from harness.envbuild.recipe import EnvRecipe
from harness.envbuild.tools import Log, last_lines

SMOKE = "import json, torch, vllm; print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__}))"


def smoke_versions(stdout: str) -> dict[str, str]:
    """The ``{"vllm": ..., "torch": ...}`` versions a successful ``SMOKE`` run printed."""
    return json.loads(stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class BuildStep:
    """The env folder being built and its open build log; every command a backend runs goes through ``run``."""

    path: Path
    logfile: TextIO
    t0: float  # time.monotonic() when the build started

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def run(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        self.logfile.write(f"$ {' '.join(cmd)}\n")
        self.logfile.flush()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        self.logfile.write(proc.stdout + proc.stderr)
        self.logfile.flush()
        return proc

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 1)


@dataclass(frozen=True)
class BuildResult:
    """What a backend's install left to check and record."""

    check_release: bool  # refuse an env whose vllm is not ``recipe.version`` (False: the version is a label)
    facts: Mapping[str, Any]  # extra fields of the status file, in order


class EnvBackend(Protocol):
    """One way of putting vLLM into an env folder under the cache (see ``harness.envbuild.envs.backend_for``)."""

    @property
    def verb(self) -> str:
        """``building`` or ``installing``: the log line and the timeout message."""
        ...

    @property
    def own_errors(self) -> tuple[type[EnvBuildError], ...]:
        """Errors that already name their cause: re-raised without the build log's path."""
        ...

    def source(self, recipe: EnvRecipe) -> str:
        """Where vLLM comes from, for the log line (``""`` or ``"from wheelhouse X "``)."""
        ...

    def prepare(self, recipe: EnvRecipe) -> None:
        """Check what the build needs before anything is created (e.g. the uv binary)."""
        ...

    def install(self, recipe: EnvRecipe, step: BuildStep) -> BuildResult:
        """Create the env at ``step.path`` and install vLLM into it; raise EnvBuildError on failure."""
        ...


def build_env(backend: EnvBackend, recipe: EnvRecipe, path: Path, log: Log) -> dict[str, Any]:
    """Build the env of ``recipe`` at ``path`` (which must not exist) with ``backend``; return its status."""
    backend.prepare(recipe)
    t0 = time.monotonic()
    path.mkdir(parents=True)
    logpath = build_log(path)
    verb = backend.verb
    log(f"{verb} {recipe.package}=={recipe.version} env {backend.source(recipe)}({path})")
    with open(logpath, "w") as logf:
        step = BuildStep(path, logf, t0)
        try:
            return smoke_and_record(recipe, step, backend.install(recipe, step))
        except subprocess.TimeoutExpired as exc:
            raise EnvBuildError(
                f"{verb} {recipe.package}=={recipe.version} timed out after {exc.timeout:.0f}s; log: {logpath}"
            ) from exc
        except backend.own_errors:
            raise
        except EnvBuildError as exc:
            raise EnvBuildError(f"{exc}; log: {logpath}") from exc


def smoke_and_record(recipe: EnvRecipe, step: BuildStep, result: BuildResult) -> dict[str, Any]:
    """Import vllm and torch in the new env, then write its status file (last: its presence makes the env valid)."""
    smoke = step.run([str(step.python), "-c", SMOKE], 600)
    if smoke.returncode:
        raise EnvBuildError(f"smoke import of vllm/torch failed: {last_lines(smoke.stderr)}")
    versions = smoke_versions(smoke.stdout)
    if result.check_release and not same_release(versions["vllm"], recipe.version):
        raise EnvBuildError(
            f"the env imports vllm {versions['vllm']}, not {recipe.version} (the base interpreter's vllm shadows it?)"
        )
    status = {
        "valid": True,
        "recipe": recipe.to_dict(),
        "recipe_hash": recipe.hash,
        "built_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "build_s": step.elapsed(),
        "vllm_version": versions["vllm"],
        "torch_version": versions["torch"],
        **result.facts,
    }
    (step.path / STATUS_FILE).write_text(json.dumps(status, indent=2))
    return status


def same_release(found: str, wanted: str) -> bool:
    """Is ``found`` (what the env imports) the release ``wanted`` (local labels such as ``+cpu`` aside)?"""
    try:
        return Version(found).public == Version(wanted).public
    except InvalidVersion:
        return found == wanted
