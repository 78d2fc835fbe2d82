"""Wheelhouses for air-gapped vLLM environments.

A wheelhouse is a folder of wheels plus ``wheelhouse.json`` (the manifest):
for each vLLM version, exactly which wheel files install it on top of an
interpreter that already holds torch (and whatever else a target machine has
installed).  ``build_wheelhouse`` runs on a machine with network access;
``harness.envbuild.from_wheelhouse`` installs from the result with no network at all.

Resolution (measured on an offline H200 node with torch 2.11.0+cu130):

* ``uv pip compile`` resolves ``vllm==X`` + ``ray`` for the *target* python and
  manylinux platform.  The target's installed packages are written into the
  ``-o`` file first: uv keeps an existing output file's pins as preferences,
  so installed versions win wherever vLLM's pins allow.  Every resolved
  package whose version equals the installed one (``2.11.0+cu130`` counts as
  ``2.11.0``, as PEP 440's ``==2.11.0`` does) is left out; the rest is
  downloaded -- including replacements for installed packages vLLM's pins
  reject (vLLM 0.21.0 needs transformers < 5; the node has 5.17.0).
* ``pip download --platform`` matches tags exactly, so every manylinux tag the
  target's glibc accepts is passed (manylinux_2_5 .. the target, plus the
  manylinux1/2010/2014 aliases).
* flashinfer (~300 MB) is excluded by default: vLLM imports it lazily and the
  runner sets ``VLLM_USE_FLASHINFER_SAMPLER=0``.  xgrammar and apache-tvm-ffi
  are *not* optional: vLLM 0.21.0's import path needs them even for greedy
  decoding.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness.core.errors import BadInput, EnvBuildError, ResolutionFailed
from harness.envbuild.index import IndexConfig, dependency_cutoff
from harness.envbuild.tools import Log, last_lines, uv_bin
from harness.envbuild.unresolvable import LAZY_KERNELS, ROUNDS, lazy_for, leave_out
from harness.envbuild.wheelhouse_manifest import MANIFEST, SCHEMA_VERSION, Manifest, load_manifest, sha256_file

# flashinfer-python pulls flashinfer-cubin (and -jit-cache on some versions):
# ~300 MB of kernels that vLLM only imports lazily (#42043 needs none of them).
DEFAULT_EXTRA = ("ray",)
DEFAULT_EXCLUDE = tuple(LAZY_KERNELS)
_PLATFORM_RE = re.compile(r"^manylinux_(\d+)_(\d+)_(x86_64|aarch64)$")
_ALIASES = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_PY_RE = re.compile(r"^3\.\d{1,2}$")


@dataclass(frozen=True)
class Installed:
    name: str  # as the freeze list spells it
    version: str | None  # None for a direct reference (``name @ url``): never counts as a match


@dataclass(frozen=True)
class Pin:
    name: str
    version: str


# --------------------------------------------------------------------------- pure parts


def parse_freeze(text: str) -> dict[str, Installed]:
    """``pip list --format=freeze`` (or ``pip freeze``) output -> canonical name -> Installed."""
    out: dict[str, Installed] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):  # blank, comment, -e/-r/--option lines
            continue
        if " @ " in line:
            name, version = line.split(" @ ", 1)[0].strip(), None
        elif "==" in line:
            name, _, version = (s.strip() for s in line.partition("=="))
            version = version.split(";", 1)[0].strip()
            try:
                Version(version)
            except InvalidVersion as exc:
                raise BadInput(f"installed list line {lineno}: bad version in {raw.strip()!r}") from exc
        else:
            raise BadInput(
                f"installed list line {lineno}: {raw.strip()!r} is not 'name==version'; "
                "give the output of 'pip list --format=freeze'"
            )
        out[canonicalize_name(name)] = Installed(name, version)
    return out


def read_installed(path: Path | None) -> dict[str, Installed]:
    """The installed list in ``path`` (None: nothing installed)."""
    if path is None:
        return {}
    try:
        return parse_freeze(Path(path).read_text())
    except OSError as exc:
        raise BadInput(f"cannot read installed-package list {path}: {exc.strerror}") from exc


def public_version(version: str) -> str:
    """``2.11.0+cu130`` -> ``2.11.0``."""
    return Version(version).public


def satisfied_by_installed(resolved: str, installed: str | None) -> bool:
    """Does the installed version stand in for the resolved pin ``==resolved``?

    PEP 440: ``==2.11.0`` (no local label) matches ``2.11.0+cu130``; a pin with
    a local label needs it exactly.
    """
    if installed is None:
        return False
    r, i = Version(resolved), Version(installed)
    if r.local:
        return r == i
    return r == Version(i.public)


def platform_tags(platform: str) -> tuple[str, ...]:
    """Every platform tag a ``manylinux_2_NN_ARCH`` target accepts, newest first (pip matches tags exactly)."""
    m = _PLATFORM_RE.match(platform)
    if not m or int(m.group(1)) != 2:
        raise BadInput(f"bad platform {platform!r}; give a glibc tag like manylinux_2_39_x86_64")
    minor, arch = int(m.group(2)), m.group(3)
    if minor < 5:
        raise BadInput(f"bad platform {platform!r}: manylinux starts at glibc 2.5; give e.g. manylinux_2_39_x86_64")
    tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)]
    tags += [f"{alias}_{arch}" for alias, (_, n) in _ALIASES.items() if n <= minor]
    return tuple(tags)


def uv_python_platform(platform: str) -> str:
    """``manylinux_2_39_x86_64`` -> uv's ``x86_64-manylinux_2_39``."""
    m = _PLATFORM_RE.match(platform)
    if not m:
        raise BadInput(f"bad platform {platform!r}; give a glibc tag like manylinux_2_39_x86_64")
    return f"{m.group(3)}-manylinux_{m.group(1)}_{m.group(2)}"


def check_python(python: str) -> str:
    if not _PY_RE.match(python):
        raise BadInput(f"bad --python {python!r}; give MAJOR.MINOR like 3.12")
    return python


def parse_pins(text: str) -> dict[str, Pin]:
    """``uv pip compile`` output (``name==version`` lines) -> canonical name -> Pin."""
    pins: dict[str, Pin] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        if "==" not in line:
            raise EnvBuildError(f"unexpected line in the resolution: {raw!r}")
        name, _, version = (s.strip() for s in line.partition("=="))
        pins[canonicalize_name(name.split("[", 1)[0])] = Pin(name.split("[", 1)[0], version)
    return pins


def matches_exclude(name: str, patterns: Iterable[str]) -> str | None:
    """The first pattern (fnmatch on canonical names) that excludes ``name``, else None."""
    canon = canonicalize_name(name)
    for p in patterns:
        if fnmatch.fnmatchcase(canon, p.lower().replace("_", "-").replace(".", "-")):
            return p
    return None


@dataclass(frozen=True)
class Split:
    """A resolution split into what the target has and what must be downloaded."""

    download: tuple[Pin, ...]
    kept_installed: tuple[dict[str, str], ...]
    replaces_installed: tuple[dict[str, str], ...]


def split_resolution(pins: dict[str, Pin], installed: dict[str, Installed]) -> Split:
    """Which resolved pins the installed list already satisfies, and which replace an installed version."""
    download: list[Pin] = []
    kept: list[dict[str, str]] = []
    replaces: list[dict[str, str]] = []
    for canon in sorted(pins):
        pin = pins[canon]
        inst = installed.get(canon)
        if inst is not None and satisfied_by_installed(pin.version, inst.version):
            kept.append({"name": pin.name, "version": pin.version, "installed": inst.version or ""})
            continue
        download.append(pin)
        if inst is not None:
            replaces.append({"name": pin.name, "version": pin.version, "installed": inst.version or inst.name + " @"})
    return Split(tuple(download), tuple(kept), tuple(replaces))


def pip_download_args(python: str, platform: str) -> list[str]:
    """Target options for ``pip download`` (CPython only: vLLM ships cp wheels)."""
    nodot = python.replace(".", "")
    args = ["--only-binary=:all:", "--no-deps", "--python-version", python, "--implementation", "cp",
            "--abi", f"cp{nodot}", "--abi", "abi3", "--abi", "none"]
    for tag in platform_tags(platform):
        args += ["--platform", tag]
    return args


# --------------------------------------------------------------------------- building (network)


@dataclass(frozen=True)
class BuildReport:
    manifest: Manifest
    downloaded: tuple[str, ...]  # files fetched by this call (others were already there)


def _run(cmd: list[str], timeout: float, log: Log) -> subprocess.CompletedProcess[str]:
    log("$ " + " ".join(cmd[:8]) + (" ..." if len(cmd) > 8 else ""))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise EnvBuildError(f"{cmd[0]} {cmd[1]} timed out after {timeout:.0f}s") from exc


def resolve(
    requirements: list[str],
    python: str,
    platform: str,
    installed: dict[str, Installed],
    index_args: list[str],
    overrides_never: Iterable[str],
    exclude_newer: str | None,
    workdir: Path,
    log: Log,
    uv: str,
) -> dict[str, Pin]:
    """One ``uv pip compile`` for the target, installed versions as preferences."""
    workdir.mkdir(parents=True, exist_ok=True)
    req = workdir / "requirements.in"
    req.write_text("\n".join(requirements) + "\n")
    out = workdir / "resolved.txt"
    # uv keeps an existing output file's pins as preferences.  Local labels
    # are dropped: "torch==2.11.0+cu130" is on no index, its public version is.
    out.write_text("".join(f"{i.name}=={public_version(i.version)}\n" for i in installed.values() if i.version))
    ov = workdir / "overrides.txt"
    ov.write_text("".join(f"{n} ; sys_platform == 'never'\n" for n in sorted(set(overrides_never))))
    cmd = [uv, "pip", "compile", str(req), "-o", str(out), "--python-version", python,
           "--python-platform", uv_python_platform(platform), "--only-binary", ":all:",
           "--override", str(ov), "--no-header", "--no-annotate", *index_args]
    if exclude_newer:
        cmd += ["--exclude-newer", exclude_newer]
        # The target's own packages may be newer than the cutoff: still keep them.
        for i in installed.values():
            cmd += ["--exclude-newer-package", f"{canonicalize_name(i.name)}=false"]
    proc = _run(cmd, 900, log)
    if proc.returncode:
        raise ResolutionFailed(
            f"resolving {' '.join(requirements)} for {python}/{platform} failed: {last_lines(proc.stderr, 8)}",
            proc.stderr)
    return parse_pins(out.read_text())


def resolve_excluding(
    requirements: list[str],
    python: str,
    platform: str,
    installed: dict[str, Installed],
    index_args: list[str],
    exclude: tuple[str, ...],
    exclude_newer: str | None,
    workdir: Path,
    log: Log,
    uv: str,
) -> tuple[dict[str, Pin], list[dict[str, str]]]:
    """Resolve with every excluded package (and what only it pulls in) left out; returns pins and exclusions.

    An excluded package pinned at a version no index holds (vLLM 0.34.0: ``flashinfer-python==0.7.3``) fails the
    first round: it is left out with that pin and its reason (harness.envbuild.unresolvable), never silently."""
    # First round without overrides: the manifest then says which version of
    # each excluded package vLLM would have installed.
    never: set[str] = set()
    excluded: dict[str, dict[str, str]] = {}
    reasons = {p: exclude_reason(p) for p in exclude}
    for _ in range(5 + ROUNDS):
        try:
            pins = resolve(requirements, python, platform, installed, index_args, never, exclude_newer, workdir,
                           log, uv)
        except ResolutionFailed as exc:
            left = leave_out(exc.stderr, reasons, never)
            if left is None:
                raise
            for lo in left:
                log(f"# {lo.name}=={lo.pinned} is on no configured index; left out ({lo.reason})")
                excluded[lo.name] = lo.to_dict()
                never.add(lo.name)
            continue
        found = {c: matches_exclude(c, exclude) for c in pins}
        new = {c: p for c, p in found.items() if p}
        if not new:
            break
        for c, pattern in new.items():
            excluded[c] = {"name": pins[c].name, "version": pins[c].version, "reason": exclude_reason(pattern)}
        never |= set(new)
    else:
        raise EnvBuildError(f"excluded packages keep reappearing in the resolution: {sorted(excluded)}")
    return pins, [excluded[c] for c in sorted(excluded)]


def exclude_reason(pattern: str) -> str:
    """Why a package matched by ``--exclude pattern`` may be left out."""
    why = LAZY_KERNELS.get(pattern)
    return f"--exclude {pattern}" + (f": {why}" if why else "")


def download(
    pins: Iterable[Pin], dest: Path, python: str, platform: str, index_args: list[str], log: Log,
) -> dict[str, str]:
    """``pip download`` exactly these pins for the target; canonical name -> wheel file name in ``dest``."""
    pins = list(pins)
    if not pins:
        return {}
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(f"{p.name}=={p.version}\n" for p in pins))
        reqfile = f.name
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
               "-d", str(dest), *pip_download_args(python, platform), *index_args, "-r", reqfile]
        proc = _run(cmd, 3600, log)
    finally:
        os.unlink(reqfile)
    if proc.returncode:
        raise EnvBuildError(f"pip download failed: {last_lines(proc.stderr or proc.stdout, 8)}")
    # Map each pin to its file by the file names pip reported (a folder shared
    # by several downloads may hold other versions of the same project).
    reported = re.findall(r"(?:Saved|File was already downloaded)\s+(\S+\.whl)", proc.stdout)
    by_key: dict[tuple[str, Version], str] = {}
    for r in reported:
        fname = Path(r).name
        try:
            name, ver, _build, _tags = parse_wheel_filename(fname)
        except InvalidWheelFilename:
            continue
        by_key[(canonicalize_name(name), ver)] = fname
    files: dict[str, str] = {}
    for p in pins:
        canon = canonicalize_name(p.name)
        found = by_key.get((canon, Version(p.version)))
        if found is None:
            raise EnvBuildError(
                f"pip download reported no wheel for {p.name}=={p.version}; output: {last_lines(proc.stdout, 8)}"
            )
        files[canon] = found
    return files


@dataclass(frozen=True)
class _Target:
    """What every version added to one wheelhouse is resolved and downloaded for."""

    dest: Path
    python: str
    platform: str
    package: str
    index: IndexConfig
    installed: dict[str, Installed]
    installed_list: dict[str, Any]  # the manifest's record of the installed list (path, sha256, packages)
    exclude: tuple[str, ...]
    extra: tuple[str, ...]
    uv: str


def build_wheelhouse(
    dest: Path,
    vllm_versions: list[str],
    python: str,
    platform: str,
    installed_file: Path | None = None,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
    extra: tuple[str, ...] = DEFAULT_EXTRA,
    package: str = "vllm",
    index: IndexConfig | None = None,
    log: Log = lambda s: None,
) -> BuildReport:
    """Resolve and download ``package==V`` + ``extra`` for every V into ``dest``; write/extend its manifest.

    ``index`` None: PyPI with pip's find-links.
    Several versions share one folder: wheels are stored once and each version
    lists exactly the files it installs.
    """
    check_python(python)
    platform_tags(platform)
    if not vllm_versions:
        raise BadInput("no vLLM version given; pass --vllm X[,Y...]")
    installed = read_installed(installed_file)
    installed_list = {"path": str(installed_file) if installed_file else None,
                      "sha256": sha256_file(Path(installed_file)) if installed_file else None,
                      "packages": len(installed)}
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    data = _existing_manifest(dest, python, platform, package)
    target = _Target(dest, python, platform, package, index or IndexConfig(), installed, installed_list,
                     exclude, extra, uv_bin())
    downloaded: list[str] = []
    for v in vllm_versions:
        downloaded += _add_version(target, v, data, log)
    _write_manifest(dest, data)
    return BuildReport(load_manifest(dest), tuple(downloaded))


def _add_version(t: _Target, v: str, data: dict[str, Any], log: Log) -> list[str]:
    """Resolve and download vLLM ``v`` into the wheelhouse; record it in ``data``; return the files fetched."""
    as_of = dependency_cutoff(t.index, t.package, v)
    requirements = [f"{t.package}=={v}", *t.extra]
    log(f"resolving {' + '.join(requirements)} for cp{t.python} {t.platform} (as of {as_of or 'today'})")
    with tempfile.TemporaryDirectory(prefix="vllm-repro-wh-") as tmp:
        pins, excluded = resolve_excluding(requirements, t.python, t.platform, t.installed, t.index.uv_args(),
                                           lazy_for(v, t.exclude), as_of, Path(tmp), log, t.uv)
    split = split_resolution(pins, t.installed)
    before = {p.name for p in t.dest.glob("*.whl")}
    log(f"{v}: {len(pins)} packages resolved, {len(split.kept_installed)} installed on the target, "
        f"{len(split.download)} to download")
    # pip spells the index options as uv does.
    files = download(split.download, t.dest, t.python, t.platform, t.index.uv_args(), log)
    for canon, fname in files.items():
        meta = data["files"].get(fname)
        p = t.dest / fname
        if meta is None or meta["bytes"] != p.stat().st_size:
            data["files"][fname] = {"name": pins[canon].name, "version": pins[canon].version,
                                    "bytes": p.stat().st_size, "sha256": sha256_file(p)}
    # vllm first: a partially copied wheelhouse fails on the big file early.
    order = sorted(files.values(), key=lambda f: (not f.startswith(t.package.replace("-", "_") + "-"), f))
    data["versions"][v] = {
        "requirements": requirements,
        "resolved": {pins[c].name: pins[c].version for c in sorted(pins)},
        "wheels": order,
        "kept_installed": list(split.kept_installed),
        "replaces_installed": list(split.replaces_installed),
        "excluded": excluded,
        "resolved_as_of": as_of,
        "installed_list": dict(t.installed_list),
        "bytes": sum(data["files"][f]["bytes"] for f in order),
    }
    return sorted(set(files.values()) - before)


def _write_manifest(dest: Path, data: dict[str, Any]) -> None:
    # A version rebuilt with other pins leaves files no version lists: forget them.
    used = {f for e in data["versions"].values() for f in e["wheels"]}
    data["files"] = {f: meta for f, meta in sorted(data["files"].items()) if f in used}
    data["updated"] = datetime.now().astimezone().isoformat(timespec="seconds")
    tmpm = dest / (MANIFEST + ".tmp")
    tmpm.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmpm.replace(dest / MANIFEST)


def _existing_manifest(dest: Path, python: str, platform: str, package: str) -> dict[str, Any]:
    if not (dest / MANIFEST).exists():
        return {"schema_version": SCHEMA_VERSION, "python": python, "platform": platform, "package": package,
                "files": {}, "versions": {}}
    m = load_manifest(dest)
    if (m.python, m.platform, m.package) != (python, platform, package):
        raise BadInput(
            f"{dest} holds a wheelhouse for {m.package} on cp{m.python} {m.platform}, not {package} on cp{python} "
            f"{platform}; use another --dest"
        )
    return json.loads((dest / MANIFEST).read_text())
