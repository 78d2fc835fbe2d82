"""Backend: install a vLLM version from a wheelhouse folder, with no uv and no network (air-gapped machines).

A venv is layered onto an interpreter that already holds torch (itself often a
venv, so ``--system-site-packages`` would not see its packages): a ``.pth``
file ``site.addsitedir``-s the base's site-packages *after* the env's own, so
the wheelhouse's versions shadow installed ones and everything else (torch,
CUDA libraries) comes from the base.  ``pip install --no-index --no-deps``
installs exactly the manifest's wheels for the version.  The wheelhouse itself
is made by ``harness.bundle.wheelhouse`` (the download side); this module reads its
manifest (``harness.envbuild.wheelhouse_manifest``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.core.errors import BadInput, EnvBuildError
from harness.envbuild.backend import BuildResult, BuildStep
from harness.envbuild.recipe import EnvRecipe, WheelhouseSource
from harness.envbuild.tools import last_lines
from harness.envbuild.wheelhouse_manifest import Manifest, WheelhouseError, load_manifest, wheels_for

# The variable naming the interpreter that holds torch, once, for every command (tox passes VLLM_REPRO_*).
BASE_PYTHON_ENV = "VLLM_REPRO_BASE_PYTHON"
_BASE_INFO = (
    "import json, os, site, sys, sysconfig, importlib.util as u; v = '%d.%d' % sys.version_info[:2]; "
    "c = os.path.join(sys.prefix, 'bin', 'python' + v); "
    "print(json.dumps({'python': v, 'torch': u.find_spec('torch') is not None, "
    "'canonical': c if os.path.exists(c) else sys.executable, "
    "'site': [p for p in dict.fromkeys(site.getsitepackages() + [sysconfig.get_paths()['purelib'], "
    "sysconfig.get_paths()['platlib']])]}))"
)


def base_info(base_python: str) -> dict[str, Any]:
    """The base interpreter's Python version, whether it holds torch, its canonical path and site-packages."""
    try:
        proc = subprocess.run([base_python, "-c", _BASE_INFO], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise BadInput(f"cannot run base interpreter {base_python}: {exc.strerror}; give --base-python PATH") from exc
    if proc.returncode:
        raise BadInput(f"base interpreter {base_python} failed: {last_lines(proc.stderr, 2)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def wheelhouse_recipe(
    version: str, folder: Path, base_python: str | None = None, platform: str = "cuda",
) -> EnvRecipe:
    """The recipe that installs ``version`` from the wheelhouse ``folder`` onto ``base_python``.

    ``base_python`` (default: the interpreter running the harness) must already
    hold torch and be the Python the wheelhouse was built for.
    """
    manifest = load_manifest(folder)
    if version not in manifest.versions:
        wheels_for(manifest, version, verify=False)  # raises, naming the versions it has
    base = find_base_python(manifest.python, base_python, str(folder))
    src = WheelhouseSource(str(Path(folder).absolute()), manifest.sha256, base)
    return EnvRecipe(manifest.package, version, platform, manifest.python, wheelhouse=src)


class UnfitBase(BadInput):
    """An interpreter that cannot be the base of a wheelhouse install; ``why`` says why in a few words."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


def find_base_python(python: str, given: str | None = None, folder: str = "the wheelhouse") -> str:
    """The canonical path of the Python ``python`` interpreter that holds torch: ``given``, else
    $VLLM_REPRO_BASE_PYTHON, else the first of this interpreter, the one its venv was made from and every
    ``python3``/``pythonX.Y`` on PATH that qualifies.  Refused (BadInput naming the fix) before anything is installed.

    Under tox the running interpreter is tox's venv, which has no torch, and so are the first ``python3``
    on PATH and the base it was made from; the GPU nodes' torch lives in a venv further along PATH
    (/opt/torch/.venv/bin on the H200s, where the README's commands otherwise gave BUILD-FAILED).  The canonical path
    (``<prefix>/bin/pythonX.Y``) keys the env cache, so ``envs build`` and ``tox -e repro`` find the same
    envs whichever spelling of the interpreter each started from.
    """
    named = given or os.environ.get(BASE_PYTHON_ENV)
    if named:
        return _qualified(str(Path(named).absolute()), python, folder)
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), *_path_pythons(python)]
    tried: list[str] = []
    for cand in dict.fromkeys(c for c in candidates if c):
        try:
            return _qualified(cand, python, folder)
        except UnfitBase as exc:
            tried.append(f"{cand}: {exc.why}")
    raise BadInput(f"no Python {python} interpreter holding torch found for {folder} (tried {'; '.join(tried)}); "
                   f"pass --base-python PATH or set {BASE_PYTHON_ENV}=PATH")


def _path_pythons(python: str) -> list[str]:
    """Every ``python3`` and ``python<python>`` on PATH, in PATH order."""
    out = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        for name in ("python3", f"python{python}"):
            p = Path(d or ".") / name
            if p.is_file() and os.access(p, os.X_OK):
                out.append(str(p.absolute()))
    return out


def _qualified(base: str, python: str, folder: str) -> str:
    try:
        info = base_info(base)
    except BadInput as exc:
        raise UnfitBase(str(exc), "does not run") from None
    if info["python"] != python:
        raise UnfitBase(f"the wheelhouse {folder} is for Python {python} but {base} is Python {info['python']}; "
                        f"pass --base-python with a Python {python} interpreter that holds torch",
                        f"Python {info['python']}")
    if not info.get("torch"):
        raise UnfitBase(f"{base} has no torch: a wheelhouse install layers vLLM onto an interpreter that "
                        f"already holds torch; pass --base-python PATH or set {BASE_PYTHON_ENV}=PATH", "no torch")
    return str(info["canonical"])


class WheelhouseBackend:
    """``python -m venv`` on the base interpreter + ``pip install --no-index`` of the manifest's wheels."""

    verb = "installing"
    own_errors: tuple[type[EnvBuildError], ...] = (WheelhouseError,)  # they name the wheelhouse and the wheel

    def source(self, recipe: EnvRecipe) -> str:
        return f"from wheelhouse {_source(recipe).path} "

    def prepare(self, recipe: EnvRecipe) -> None:
        """Nothing: a wheelhouse install needs no uv (air-gapped nodes)."""

    def install(self, recipe: EnvRecipe, step: BuildStep) -> BuildResult:
        src = _source(recipe)
        manifest = _checked_manifest(src)
        wheels = wheels_for(manifest, recipe.version)  # every file present, size and sha256 checked
        _layered_venv(src.base_python, step)
        # pip comes from the base; --isolated: no pip config (index, constraints) of this machine applies.
        cmd = [str(step.python), "-m", "pip", "--isolated", "--disable-pip-version-check", "install", "--no-index",
               "--no-deps", "--ignore-installed", "--no-compile", "--no-warn-script-location",
               *[str(w) for w in wheels]]
        proc = step.run(cmd, 1800)
        if proc.returncode:
            raise EnvBuildError(f"pip install --no-index from the wheelhouse failed: {last_lines(proc.stderr)}")
        entry = manifest.versions[recipe.version]
        return BuildResult(check_release=True, facts={
            "install_s": step.elapsed(), "torch_override": None, "resolved_as_of": entry.resolved_as_of,
            "wheelhouse": {"path": src.path, "manifest_sha256": src.manifest_sha256, "base_python": src.base_python,
                           "wheels": len(wheels), "excluded": [e["name"] for e in entry.excluded]},
        })


def _source(recipe: EnvRecipe) -> WheelhouseSource:
    if recipe.wheelhouse is None:
        raise ValueError(f"recipe {recipe.name} has no wheelhouse")  # backend_for never does this
    return recipe.wheelhouse


def _checked_manifest(src: WheelhouseSource) -> Manifest:
    manifest = load_manifest(Path(src.path))
    if manifest.sha256 != src.manifest_sha256:
        raise WheelhouseError(
            f"{src.path}/wheelhouse.json changed since this recipe was made (sha256 {manifest.sha256[:12]}, "
            f"expected {src.manifest_sha256[:12]}); make the recipe again"
        )
    return manifest


def _layered_venv(base_python: str, step: BuildStep) -> None:
    """A venv at ``step.path`` made by ``base_python`` that also sees the base's site-packages, after its own."""
    info = base_info(base_python)
    proc = step.run([base_python, "-m", "venv", "--without-pip", str(step.path)], 300)
    if proc.returncode:
        raise EnvBuildError(f"{base_python} -m venv failed: {last_lines(proc.stderr)}")
    proc = step.run([str(step.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 120)
    if proc.returncode:
        raise EnvBuildError(f"the new venv's python does not run: {last_lines(proc.stderr)}")
    site_dir = Path(proc.stdout.strip().splitlines()[-1])
    # addsitedir (not a bare path line) also runs the base's own .pth files;
    # appended after the env's site-packages, so the wheelhouse's versions win.
    lines = [f"import site; site.addsitedir({d!r})\n" for d in info["site"] if Path(d).is_dir()]
    (site_dir / "zz-vllm-repro-base.pth").write_text("".join(lines))
