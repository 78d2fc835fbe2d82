"""The harness's own wheels for an offline node: vllm-repro, tox and everything they need.

A wheelhouse (``harness.bundle.wheelhouse``) carries vLLM to an air-gapped GPU node; this carries the rest of what
the README's commands run there: the vllm-repro wheel built from this checkout, its dependencies (rich,
packaging, uv) and those of its ``pytest`` extra (pytest, pytest-xdist, hypothesis: ``tox -e post-resume``),
tox and setuptools (tox builds the project in an isolated environment), resolved by pip for the target's
Python and platform.  They go to ``<wheelhouse>/harness-wheels/`` with their own listing, so
the vLLM manifest (whose hash keys the env cache) does not change when the harness is re-bundled.  On the
node, ``pip install --no-index --find-links <wheelhouse>/harness-wheels vllm-repro tox`` installs them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.bundle.wheelhouse import check_python, pip_download_args
from harness.core.errors import BadInput, EnvBuildError
from harness.envbuild.tools import Log, last_lines
from harness.envbuild.wheelhouse_manifest import sha256_file

FOLDER = "harness-wheels"
LISTING = "harness-wheels.json"
# tox runs the README's commands; setuptools builds vllm-repro inside tox's isolated build environment.
TOOLS = ("tox>=4", "setuptools>=69")
# vllm-repro's extra for the post_resume pytest suite (pytest, pytest-xdist, hypothesis): `tox -e post-resume`.
EXTRA = "pytest"



@dataclass(frozen=True)
class HarnessBundle:
    folder: Path
    wheels: tuple[str, ...]
    bytes: int


def bundle_harness(dest: Path, python: str, platform: str, log: Log = lambda s: None) -> HarnessBundle:
    """Build vllm-repro's wheel and download it with its dependencies and ``TOOLS`` for the target."""
    check_python(python)
    root = source_checkout()
    folder = Path(dest) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vllm-repro-bundle-") as tmp:
        own = _build_own_wheel(root, Path(tmp), log)
        shutil.copy2(own, folder / own.name)
        # Not --no-deps: pip resolves the dependencies of vllm-repro and the tools for the target.
        target = [a for a in pip_download_args(python, platform) if a != "--no-deps"]
        _pip(["download", "-d", str(folder), *target, f"{folder / own.name}[{EXTRA}]", *TOOLS], log)
    files = sorted(p.name for p in folder.glob("*.whl"))
    sizes = {f: (folder / f).stat().st_size for f in files}
    listing = {f: {"bytes": sizes[f], "sha256": sha256_file(folder / f)} for f in files}
    (folder / LISTING).write_text(json.dumps({"python": python, "platform": platform, "wheels": listing},
                                             indent=2) + "\n")
    return HarnessBundle(folder, tuple(files), sum(sizes.values()))


def source_checkout(cwd: Path | None = None) -> Path:
    """The vllm-repro checkout to build the wheel from: the one this code runs from (an editable install), else
    the current directory (``pip install . && vllm-repro wheelhouse ...`` in a checkout)."""
    here = Path(__file__).resolve().parents[2]
    for root in (here, (cwd or Path.cwd()).resolve()):
        pyproject = root / "pyproject.toml"
        if pyproject.is_file() and 'name = "vllm-repro"' in pyproject.read_text(encoding="utf-8"):
            return root
    raise BadInput("--with-harness builds vllm-repro's own wheel from its source: run it in a vllm-repro checkout "
                   f"(neither {here} nor {cwd or Path.cwd()} is one)")


def _build_own_wheel(root: Path, out: Path, log: Log) -> Path:
    _pip(["wheel", "--no-deps", "-w", str(out), str(root)], log)
    wheels = sorted(out.glob("vllm_repro-*.whl"))
    if not wheels:
        raise EnvBuildError(f"pip wheel {root} produced no vllm_repro wheel")
    return wheels[-1]


def _pip(args: list[str], log: Log) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise EnvBuildError(f"pip {args[0]} failed: {last_lines(proc.stderr or proc.stdout, 8)}")
