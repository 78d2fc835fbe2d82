"""The env folders under the cache: where an env lives, its status file, its lock, listing and pruning."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATUS_FILE = "vllm-repro-env.json"


def default_cache_dir() -> Path:
    """``$VLLM_REPRO_CACHE``, else ``$XDG_CACHE_HOME/vllm-repro``, else ``~/.cache/vllm-repro``."""
    if os.environ.get("VLLM_REPRO_CACHE"):
        return Path(os.environ["VLLM_REPRO_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllm-repro"


def env_dir(cache_dir: Path, name: str) -> Path:
    """The folder of the env called ``name`` (a recipe's name) in the cache."""
    return cache_dir / "envs" / name


def build_log(path: Path) -> Path:
    """The build log of the env at ``path``: beside it, so it outlives a failed build."""
    return path.parent / f"{path.name}.build.log"


def env_status(path: Path) -> dict[str, Any] | None:
    """The status of a built env, or None if it is absent or incomplete."""
    try:
        return json.loads((path / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def env_lock(path: Path) -> Iterator[None]:
    """Hold the lock of the env at ``path`` (builds, reuse and pruning of one env never overlap)."""
    lockfile = path.parent / f".{path.name}.lock"
    lockfile.parent.mkdir(parents=True, exist_ok=True)
    with open(lockfile, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def touch(path: Path) -> None:
    # Last use is the status file's mtime: what `envs prune --older-than` goes by.
    with contextlib.suppress(OSError):
        os.utime(path / STATUS_FILE)


def last_used(path: Path) -> float:
    """When the env was last built or used (seconds since the epoch; the folder's mtime if incomplete)."""
    for p in (path / STATUS_FILE, path):
        with contextlib.suppress(OSError):
            return p.stat().st_mtime
    return 0.0


def env_size(path: Path) -> int:
    """Bytes of files under ``path``, each inode counted once (uv hard-links files from its cache)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_size
    return total


def prune_envs(
    cache_dir: Path, older_than_days: float | None = None, max_total_bytes: int | None = None,
    dry_run: bool = False, now: float | None = None,
) -> list[Path]:
    """Remove incomplete envs, envs unused for ``older_than_days``, then least recently used ones over the size cap."""
    now = time.time() if now is None else now
    rows = [(p, s, last_used(p)) for p, s in list_envs(cache_dir)]
    doomed: list[Path] = [p for p, s, _ in rows if not (s and s.get("valid"))]
    if older_than_days is not None:
        doomed += [p for p, s, t in rows if p not in doomed and now - t > older_than_days * 86400]
    if max_total_bytes is not None:
        keep = sorted(((t, p) for p, _s, t in rows if p not in doomed), reverse=True)
        total = 0
        for _t, p in keep:
            total += env_size(p)
            if total > max_total_bytes:
                doomed.append(p)
    if not dry_run:
        for p in doomed:
            with env_lock(p):
                shutil.rmtree(p, ignore_errors=True)
            build_log(p).unlink(missing_ok=True)
    return doomed


def list_envs(cache_dir: Path) -> list[tuple[Path, dict[str, Any] | None]]:
    """Every env folder under the cache with its status (None: incomplete)."""
    root = cache_dir / "envs"
    if not root.is_dir():
        return []
    return [(p, env_status(p)) for p in sorted(root.iterdir()) if p.is_dir()]
