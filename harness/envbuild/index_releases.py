"""The releases a package index offers for a package (PEP 691 JSON simple API): the raw list that version
selection (``harness.plan.releases``) and client environments (``harness.envbuild.client_env``) choose from."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from urllib.request import Request, urlopen

from harness.core.errors import BadInput
from harness.envbuild.index import DEFAULT_INDEX


@dataclass(frozen=True)
class Release:
    version: str
    wheel_tags: tuple[str, ...]  # platform tags of its wheels
    requires_python: str | None
    yanked: bool


Fetch = Callable[[str, str | None], list[Release]]


def fetch_releases(package: str, index_url: str | None) -> list[Release]:
    """Releases of ``package`` from a PEP 691 JSON simple index."""
    base = (index_url or DEFAULT_INDEX).rstrip("/")
    url = f"{base}/{package}/"
    req = Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urlopen(req, timeout=60) as resp:
            data = json.load(resp)
    except (OSError, ValueError) as exc:
        raise BadInput(
            f"cannot list versions of {package} from {url} ({exc}); give exact versions instead of a range"
        ) from exc
    by_version: dict[str, dict[str, object]] = {}
    norm = package.replace("-", "_")
    for f in data.get("files", []):
        fn: str = f.get("filename", "")
        if not fn.endswith(".whl") or not fn.lower().startswith(norm.lower() + "-"):
            continue
        parts = fn[:-4].split("-")
        if len(parts) < 5:
            continue
        ver, plat = parts[1], parts[-1]
        entry = by_version.setdefault(ver, {"tags": [], "rp": f.get("requires-python"), "yanked": True})
        tags = entry["tags"]
        assert isinstance(tags, list)
        tags.append(plat)
        # A release counts as yanked only if every file is.
        entry["yanked"] = bool(entry["yanked"]) and bool(f.get("yanked"))
    return [
        Release(v, tuple(e["tags"]), e["rp"], bool(e["yanked"]))  # type: ignore[arg-type]
        for v, e in by_version.items()
    ]
