"""Bare envs: one vLLM release and pytest, nothing of this project's, for the standalone reproducers.

They are built like the project's envs (``harness.envbuild.uv.UvBackend``: the same index, dependency cutoff and
CPU-torch rules, so a release that installs for the matrix installs here) and then get pytest; they live beside the
project's envs under ``<cache>/bare-envs/`` so the project's envs are never touched, and are reused while their
status file says the recipe is the same.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import EnvBuildError
from harness.envbuild.backend import BuildResult, BuildStep, build_env
from harness.envbuild.cache import env_lock, env_status, touch
from harness.envbuild.recipe import EnvRecipe, VllmEnv
from harness.envbuild.tools import Log, last_lines, uv_bin
from harness.envbuild.uv import UvBackend

FOLDER = "bare-envs"
EXTRA = ("pytest",)  # the only package a bare env holds beside vLLM and its dependencies


def bare_env_dir(cache_dir: Path, recipe: EnvRecipe) -> Path:
    return cache_dir / FOLDER / f"{recipe.name}-pytest"


class BareBackend(UvBackend):
    """The project's uv build, then ``uv pip install pytest``."""

    def install(self, recipe: EnvRecipe, step: BuildStep) -> BuildResult:
        result = super().install(recipe, step)
        proc = step.run([uv_bin(), "pip", "install", "--python", str(step.python), *EXTRA], 600)
        if proc.returncode:
            raise EnvBuildError(f"uv pip install {' '.join(EXTRA)} failed: {last_lines(proc.stderr)}")
        return BuildResult(result.check_release, {**result.facts, "bare_extra": list(EXTRA)})


@dataclass(frozen=True)
class BareEnv:
    env: VllmEnv | None  # None: it could not be built
    error: str = ""  # why not


def ensure_bare_env(recipe: EnvRecipe, cache_dir: Path, log: Log = lambda s: None) -> BareEnv:
    """The bare env of ``recipe``, built if needed; a build that fails is reported (``error``), never raised, and
    leaves no half-built env."""
    path = bare_env_dir(cache_dir, recipe)
    with env_lock(path):
        status = env_status(path)
        if status and status.get("recipe_hash") == recipe.hash and status.get("valid"):
            touch(path)
            return BareEnv(VllmEnv(path, recipe, status))
        if path.exists():
            shutil.rmtree(path)
        try:
            return BareEnv(VllmEnv(path, recipe, build_env(BareBackend(), recipe, path, log)))
        except EnvBuildError as exc:
            shutil.rmtree(path, ignore_errors=True)
            return BareEnv(None, str(exc))
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
