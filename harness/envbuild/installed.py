"""An interpreter that already holds vLLM (``--versions installed``): nothing to build, only the smoke check.

The env is the user's own: no lock, no status file and no cache folder are
made for it; the same smoke import that validates a built env decides whether
it can be used, and its recipe is the default one for the vLLM it imports.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.core.errors import BadInput
from harness.envbuild.backend import SMOKE, smoke_versions
from harness.envbuild.recipe import VllmEnv, default_recipe
from harness.envbuild.tools import last_lines

_PY_VERSION = "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"


def installed_env(python_exe: Path, platform: str) -> VllmEnv:
    """The vLLM already installed for ``python_exe`` (``--versions installed``); nothing is built."""
    try:
        proc = subprocess.run([str(python_exe), "-c", SMOKE], capture_output=True, text=True, timeout=600)
    except OSError as exc:
        raise BadInput(f"cannot run {python_exe} for --versions installed: {exc.strerror}") from exc
    if proc.returncode:
        raise BadInput(
            f"--versions installed: vllm/torch do not import with {python_exe} ({last_lines(proc.stderr, 2)}); "
            "point --installed-python at the interpreter of a vLLM environment"
        )
    versions = smoke_versions(proc.stdout)
    py = subprocess.run([str(python_exe), "-c", _PY_VERSION], capture_output=True, text=True, timeout=60).stdout.strip()
    recipe = default_recipe(platform, versions["vllm"], py)
    status = {"valid": True, "installed": True, "vllm_version": versions["vllm"], "torch_version": versions["torch"]}
    return VllmEnv(Path(python_exe).parent.parent, recipe, status, python_exe=Path(python_exe))
