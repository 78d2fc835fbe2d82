"""A wheelhouse's manifest (``wheelhouse.json``): for each vLLM version, exactly which wheel files install it,
with their sizes and hashes.  ``harness.bundle.wheelhouse`` writes it; the air-gapped install side
(``harness.envbuild.from_wheelhouse``) reads it and checks every wheel against it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.errors import EnvBuildError

SCHEMA_VERSION = 1
MANIFEST = "wheelhouse.json"


class WheelhouseError(EnvBuildError):
    """A wheelhouse folder or its manifest is missing, incomplete or corrupt."""


@dataclass(frozen=True)
class VersionEntry:
    """What the manifest says about one vLLM version."""

    version: str
    requirements: tuple[str, ...]
    wheels: tuple[str, ...]  # file names, in install order
    kept_installed: tuple[dict[str, str], ...]
    replaces_installed: tuple[dict[str, str], ...]
    excluded: tuple[dict[str, str], ...]
    resolved_as_of: str | None
    bytes: int


@dataclass(frozen=True)
class Manifest:
    path: Path  # the wheelhouse folder
    sha256: str  # of wheelhouse.json's bytes: part of an env's cache key
    python: str
    platform: str
    package: str
    files: dict[str, dict[str, Any]]  # file name -> {"sha256", "bytes", "name", "version"}
    versions: dict[str, VersionEntry]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()



def load_manifest(folder: Path) -> Manifest:
    """Read and check ``folder/wheelhouse.json`` (not the wheels: see ``wheels_for``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WheelhouseError(f"wheelhouse folder {folder} does not exist; build one with 'vllm-repro wheelhouse'")
    mpath = folder / MANIFEST
    try:
        raw = mpath.read_bytes()
    except OSError as exc:
        raise WheelhouseError(
            f"{folder} has no {MANIFEST} ({exc.strerror}); it is not a wheelhouse built by 'vllm-repro wheelhouse'"
        ) from exc
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise WheelhouseError(f"{mpath} is not valid JSON ({exc}); rebuild the wheelhouse") from exc
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        found = data.get("schema_version") if isinstance(data, dict) else None
        raise WheelhouseError(
            f"{mpath} has schema_version {found!r}; this harness reads {SCHEMA_VERSION}: rebuild the wheelhouse"
        )
    try:
        versions = {
            v: VersionEntry(
                version=v,
                requirements=tuple(e["requirements"]),
                wheels=tuple(e["wheels"]),
                kept_installed=tuple(e.get("kept_installed", ())),
                replaces_installed=tuple(e.get("replaces_installed", ())),
                excluded=tuple(e.get("excluded", ())),
                resolved_as_of=e.get("resolved_as_of"),
                bytes=int(e.get("bytes", 0)),
            )
            for v, e in data["versions"].items()
        }
        return Manifest(folder, hashlib.sha256(raw).hexdigest(), data["python"], data["platform"],
                        data["package"], dict(data["files"]), versions)
    except (KeyError, TypeError, AttributeError) as exc:
        raise WheelhouseError(f"{mpath} lacks field {exc}; rebuild the wheelhouse") from exc


def wheels_for(manifest: Manifest, version: str, verify: bool = True) -> list[Path]:
    """The wheel files that install ``version``; each checked against the manifest's size and sha256."""
    entry = manifest.versions.get(version)
    if entry is None:
        have = ", ".join(sorted(manifest.versions)) or "none"
        raise WheelhouseError(
            f"vLLM {version} is not in the wheelhouse {manifest.path} (it has: {have}); "
            f"add it with 'vllm-repro wheelhouse --vllm {version} --dest {manifest.path}'"
        )
    paths: list[Path] = []
    for fname in entry.wheels:
        p = manifest.path / fname
        meta = manifest.files.get(fname)
        if meta is None:
            raise WheelhouseError(f"{MANIFEST} of {manifest.path} lists {fname} for {version} but has no hash for it")
        if not p.is_file():
            raise WheelhouseError(f"wheel {fname} listed for vLLM {version} is missing from {manifest.path}")
        if verify:
            size = p.stat().st_size
            if size != meta["bytes"] or sha256_file(p) != meta["sha256"]:
                raise WheelhouseError(
                    f"wheel {p} does not match the manifest (size {size}, expected {meta['bytes']}, or sha256 "
                    "differs): the copy is truncated or corrupt; copy the wheelhouse again"
                )
        paths.append(p)
    return paths
