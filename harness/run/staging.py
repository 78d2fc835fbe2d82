"""What travels into a vLLM env beside the engine: the ``repro`` package, the dist-info that makes vLLM load
its plugin (``repro.patches.shim``), and pure-Python distributions of the harness's env the engine side needs.
"""

from __future__ import annotations

import importlib.metadata
import shutil
from collections.abc import Sequence
from pathlib import Path

from harness.core.errors import ReproError

REPRO_PKG = Path(__file__).resolve().parents[2] / "repro"


def stage_repro(dst: Path, distributions: Sequence[str] = ()) -> Path:
    """Copy the ``repro`` package and a dist-info declaring its vLLM plugin into ``dst``, and the files of the named
    pure-Python ``distributions`` of the harness's own environment beside it (see :func:`stage_distribution`).

    ``dst`` goes on PYTHONPATH of the engine process (and so of every process
    vLLM spawns): ``importlib.metadata`` finds the dist-info there, and vLLM
    loads ``repro.patches.shim:register`` as a ``vllm.general_plugins`` entry point.
    Nothing is installed into the cached vLLM env.
    """
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(REPRO_PKG, dst / "repro", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    info = dst / "vllm_repro_plugin-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-repro-plugin\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\nrepro_shim = repro.patches.shim:register\n")
    for name in distributions:
        stage_distribution(name, dst)
    return dst


def stage_distribution(name: str, dst: Path) -> int:
    """Copy the installed files of distribution ``name`` (a pure-Python one: the scheduler-tier fuzzer's
    Hypothesis and its one dependency) from the harness's environment into ``dst``; how many.

    Why copied rather than installed into the vLLM env: an env is cached by its recipe, and an extra package
    would change the key of every env (or mutate a shared one); a copy needs no index (air-gapped nodes too)
    and runs the very version the harness was tested with.  Scripts outside site-packages are left out.
    """
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ReproError(f"{name} is not installed next to vllm-repro, which copies it into the vLLM env "
                         f"(pip install 'vllm-repro' installs it)") from exc
    copied = 0
    for rel in dist.files or ():
        src = Path(str(dist.locate_file(rel)))
        if ".." in rel.parts or "__pycache__" in rel.parts or not src.is_file():
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        copied += 1
    return copied


def stage_entry_points(dst: Path, entry_points: Sequence[tuple[str, str, str]]) -> Path | None:
    """A dist-info in ``dst`` declaring ``entry_points`` ((group, name, "module:attr"), e.g. an engine profile's
    ``vllm.logits_processors`` plugin), found by ``importlib.metadata`` like the shim's; None when there are none."""
    if not entry_points:
        return None
    info = dst / "vllm_repro_profile-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-repro-profile\nVersion: 0\n")
    groups: dict[str, list[str]] = {}
    for group, name, value in entry_points:
        groups.setdefault(group, []).append(f"{name} = {value}")
    (info / "entry_points.txt").write_text("".join(f"[{g}]\n" + "\n".join(lines) + "\n"
                                                   for g, lines in groups.items()))
    return info
