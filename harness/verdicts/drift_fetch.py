"""The framework source trees ``frameworks drift`` reads: the newest release from the package index (``pip
download --no-deps``, unpacked under the harness's cache dir), or a checkout the user gives.

The downloader is a parameter (:data:`Downloader`), so tests hand in a fake and never touch the network.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import BadInput
from harness.verdicts.drift import FrameworkDrift, check_recipe, skipped
from harness.verdicts.frameworks import Recipe

# (package, directory) -> the wheel or sdist it downloaded there; raises FetchFailed with pip's last line.
Downloader = Callable[[str, Path], Path]


class FetchFailed(Exception):
    """The index gave no usable archive; ``reason`` is one line (the installer's last)."""

    def __init__(self, package: str, reason: str) -> None:
        super().__init__(f"{package}: {reason}")
        self.package = package
        self.reason = reason


@dataclass(frozen=True)
class SourceTree:
    """An unpacked release (or a checkout): its root, its version, and what its metadata requires of vllm."""

    root: Path
    version: str
    label: str  # "trl 1.16.0 (index: trl-1.16.0-py3-none-any.whl)", or the checkout path
    vllm_pins: tuple[str, ...] = ()


_SAVED = re.compile(r"(?:Saved|File was already downloaded) (\S+)")


def pip_download(package: str, dest: Path) -> Path:
    """``pip download --no-deps`` of the newest release of ``package`` into ``dest`` (an archive already there is
    reused); ``--ignore-requires-python`` because a release may need a newer Python than the harness runs on
    (SkyRL 0.4.0 needs 3.12): only its files are read."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--ignore-requires-python",
           "--disable-pip-version-check", "-d", str(dest), package]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out = (done.stdout + done.stderr).strip()
    found = _SAVED.findall(out)
    if done.returncode != 0 or not found:
        raise FetchFailed(package, (out.splitlines() or ["pip download gave no output"])[-1])
    path = Path(found[-1])
    return path if path.is_absolute() else dest / path.name


def archive_version(archive: Path) -> str:
    """``trl-1.16.0-py3-none-any.whl`` and ``trl-1.16.0.tar.gz``: ``1.16.0``."""
    name = archive.name
    if name.endswith(".whl"):
        return name.split("-")[1]
    stem = re.sub(r"\.(tar\.gz|zip|tar\.bz2)$", "", name)
    return stem.rsplit("-", 1)[-1]


def _install_data(root: Path) -> None:
    """A platform wheel keeps its modules under ``<name>.data/purelib`` (or ``platlib``): move them to the root,
    where an installer puts them and where the recipe's paths start."""
    for lib in [*root.glob("*.data/purelib"), *root.glob("*.data/platlib")]:
        for item in lib.iterdir():
            if not (root / item.name).exists():
                item.rename(root / item.name)


def _unpack(archive: Path, into: Path) -> Path:
    """Unpack once (``into`` is kept as a cache); the root the recipe's paths are relative to."""
    if not into.is_dir():
        part = into.with_name(into.name + ".part")
        if archive.name.endswith((".whl", ".zip")):
            with zipfile.ZipFile(archive) as z:
                z.extractall(part)
            _install_data(part)
        else:
            with tarfile.open(archive) as t:
                t.extractall(part, filter="data")
        part.rename(into)
    tops = [p for p in into.iterdir()]
    if archive.name.endswith(".whl") or len(tops) != 1 or not tops[0].is_dir():
        return into
    return tops[0]  # an sdist's single top folder


def vllm_requirement(root: Path) -> tuple[str, ...]:
    """The vllm specifiers the release's metadata (a wheel's METADATA, an sdist's PKG-INFO) requires, markers
    dropped (``==0.29.0`` for ``vllm==0.29.0; extra == "vllm"``), each once."""
    found: list[str] = []
    for meta in [*root.glob("*.dist-info/METADATA"), *root.glob("PKG-INFO")]:
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"Requires-Dist:\s*vllm(?![\w-])\s*(?:\[[^]]*\])?\s*([^;]*)", line)
            if m:
                found.append(m.group(1).strip().strip("()"))
    return tuple(dict.fromkeys(found))


def release_tree(package: str, cache: Path, download: Downloader | None = None) -> SourceTree:
    """The newest release of ``package`` from the index (``download``, default :func:`pip_download`, looked up
    when called so that tests can replace it), unpacked under ``cache/drift``."""
    archive = (download or pip_download)(package, cache / "drift" / "downloads")
    version = archive_version(archive)
    root = _unpack(archive, cache / "drift" / "trees" / archive.name)
    return SourceTree(root, version, f"{package} {version} (index: {archive.name})", vllm_requirement(root))


def checkout_tree(path: Path) -> SourceTree:
    """A source tree the user gives (``--checkout``); BadInput when it is not a folder."""
    if not path.is_dir():
        raise BadInput(f"--checkout {path}: not a folder (give the root of the framework's source tree)")
    return SourceTree(path, "", f"checkout {path}", vllm_requirement(path))


def check_drift(recipes: Sequence[Recipe], cache: Path, checkout: Path | None = None,
                download: Downloader | None = None) -> tuple[FrameworkDrift, ...]:
    """Each recipe against its newest release (or ``checkout``, for the one recipe given); a recipe with no
    package, or whose download fails, is skipped with the reason."""
    if checkout is not None and len(recipes) != 1:
        raise BadInput(f"--checkout {checkout} is one framework's tree: name that framework with --framework "
                       f"(valid choices: {', '.join(r.name for r in recipes)})")
    out: list[FrameworkDrift] = []
    for r in recipes:
        if checkout is not None:
            tree = checkout_tree(checkout)
        elif not r.package:
            out.append(skipped(r, r.no_release or "no package on the index named in the recipe; give --checkout"))
            continue
        else:
            try:
                tree = release_tree(r.package, cache, download)
            except FetchFailed as e:
                out.append(skipped(r, f"download failed: {e.reason}"))
                continue
        out.append(check_recipe(r, tree.root, tree.label, tree.vllm_pins))
    return tuple(out)
