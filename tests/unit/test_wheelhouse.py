"""Tests of harness.bundle.wheelhouse and the air-gapped install backend (harness.envbuild.from_wheelhouse).

Resolution and download are tested against fake ``uv``/``pip`` processes (the
real ones need the network); the install path runs the real ``venv`` + ``pip
install --no-index`` on tiny wheels built here, layered onto a fake base
interpreter whose "torch" is a stub module.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest

import harness.bundle.wheelhouse as wh
import harness.envbuild.envs as envs
import harness.envbuild.index as index_mod
import harness.envbuild.uv as envbuild_uv
from harness.bundle.wheelhouse import (
    Installed,
    Pin,
    matches_exclude,
    parse_freeze,
    parse_pins,
    pip_download_args,
    platform_tags,
    satisfied_by_installed,
    split_resolution,
    uv_python_platform,
)
from harness.core.errors import BadInput, EnvBuildError, ReproError
from harness.envbuild.wheelhouse_manifest import MANIFEST, SCHEMA_VERSION, WheelhouseError, load_manifest, wheels_for

# Marked per test: `unit` ones are pure and fast, `integration` ones build real venvs and run pip.

PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


# --------------------------------------------------------------------------- pure parts


@pytest.mark.unit
def test_parse_freeze_keeps_local_versions_and_skips_noise() -> None:
    text = "# comment\nTorch==2.11.0+cu130\n\ntyping_inspection==0.4.2\n-e git+https://x/y#egg=z\nfoo @ file:///w/foo.whl\n"
    got = parse_freeze(text)
    assert got["torch"] == Installed("Torch", "2.11.0+cu130")
    assert got["typing-inspection"].version == "0.4.2"  # canonical key
    assert got["foo"] == Installed("foo", None)
    assert len(got) == 3


@pytest.mark.unit
@pytest.mark.parametrize("line", ["numpy>=1.0", "numpy==not a version"])
def test_parse_freeze_rejects_non_pins(line: str) -> None:
    with pytest.raises(BadInput, match="line 2"):
        parse_freeze(f"six==1.17.0\n{line}\n")


@pytest.mark.unit
def test_device_freeze_list_parses() -> None:
    # The real list from the H200 node (issue 4), when the brief is present.
    path = Path("/tmp/brief/device-pip-freeze.txt")
    if not path.exists():
        pytest.skip("device freeze list not on this machine")
    got = parse_freeze(path.read_text())
    assert got["torch"].version is not None and got["transformers"].version == "5.17.0"


@pytest.mark.unit
@pytest.mark.parametrize(("resolved", "installed", "ok"), [
    ("2.11.0", "2.11.0+cu130", True),  # PEP 440: ==2.11.0 matches any local build of it
    ("2.11.0", "2.11.0", True),
    ("2.11.0+cu130", "2.11.0+cu130", True),
    ("2.11.0+cu130", "2.11.0+cu128", False),
    ("2.11.0+cu130", "2.11.0", False),
    ("4.57.6", "5.17.0", False),
    ("2.11.0", "2.11.0.post1", False),
    ("1.0", None, False),
])
def test_satisfied_by_installed(resolved: str, installed: str | None, ok: bool) -> None:
    assert satisfied_by_installed(resolved, installed) is ok


@pytest.mark.unit
def test_platform_tags_cover_every_older_glibc_and_the_aliases() -> None:
    tags = platform_tags("manylinux_2_39_x86_64")
    assert tags[0] == "manylinux_2_39_x86_64"
    for t in ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux_2_5_x86_64",
              "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"):
        assert t in tags
    assert "manylinux_2_40_x86_64" not in tags
    old = platform_tags("manylinux_2_17_aarch64")
    assert "manylinux_2_28_aarch64" not in old and "manylinux2014_aarch64" in old
    assert not any("x86_64" in t for t in old)


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["linux_x86_64", "manylinux2014_x86_64", "manylinux_2_39", "manylinux_3_1_x86_64",
                                 "manylinux_2_4_x86_64", "musllinux_1_2_x86_64"])
def test_platform_tags_reject_other_spellings(bad: str) -> None:
    with pytest.raises(BadInput, match="manylinux_2_39_x86_64"):
        platform_tags(bad)


@pytest.mark.unit
def test_uv_python_platform() -> None:
    assert uv_python_platform("manylinux_2_39_x86_64") == "x86_64-manylinux_2_39"


@pytest.mark.unit
def test_pip_download_args_list_every_tag() -> None:
    args = pip_download_args("3.12", "manylinux_2_28_x86_64")
    assert args.count("--platform") == len(platform_tags("manylinux_2_28_x86_64"))
    assert "--no-deps" in args and "--only-binary=:all:" in args
    assert args[args.index("--python-version") + 1] == "3.12" and "cp312" in args


@pytest.mark.unit
def test_matches_exclude_uses_canonical_names() -> None:
    pats = ("flashinfer-*", "nvidia-cutlass-dsl*")
    assert matches_exclude("flashinfer_python", pats) == "flashinfer-*"
    assert matches_exclude("FlashInfer.Cubin", pats) == "flashinfer-*"
    assert matches_exclude("nvidia-cutlass-dsl-libs-base", pats) == "nvidia-cutlass-dsl*"
    assert matches_exclude("flashinfer", pats) is None
    assert matches_exclude("xgrammar", pats) is None


@pytest.mark.unit
def test_split_resolution_keeps_installed_and_flags_replacements() -> None:
    pins = {"torch": Pin("torch", "2.11.0"), "transformers": Pin("transformers", "4.57.6"),
            "xgrammar": Pin("xgrammar", "0.2.1")}
    installed = {"torch": Installed("torch", "2.11.0+cu130"), "transformers": Installed("transformers", "5.17.0")}
    split = split_resolution(pins, installed)
    assert [p.name for p in split.download] == ["transformers", "xgrammar"]
    assert split.kept_installed == ({"name": "torch", "version": "2.11.0", "installed": "2.11.0+cu130"},)
    assert split.replaces_installed == ({"name": "transformers", "version": "4.57.6", "installed": "5.17.0"},)


@pytest.mark.unit
def test_parse_pins() -> None:
    pins = parse_pins("# header\nnumpy==2.3.5\nmistral-common[image]==1.11.2 ; python_version > '3.9'\n")
    assert pins == {"numpy": Pin("numpy", "2.3.5"), "mistral-common": Pin("mistral-common", "1.11.2")}
    with pytest.raises(EnvBuildError, match="unexpected line"):
        parse_pins("numpy>=2\n")


# --------------------------------------------------------------------------- resolution + download (fake uv/pip)

# What the fake index "resolves" for each requirement set, before overrides.
FAKE_RESOLUTION = {
    "vllm==0.21.0": {"vllm": "0.21.0", "torch": "2.11.0", "transformers": "5.17.0", "xgrammar": "0.2.1",
                     "flashinfer-python": "0.6.8", "flashinfer-cubin": "0.6.8", "numpy": "2.3.5", "ray": "2.55.1"},
    "vllm==0.22.0": {"vllm": "0.22.0", "torch": "2.11.0", "transformers": "5.17.0", "xgrammar": "0.2.1",
                     "flashinfer-python": "0.6.11", "llguidance": "1.7.6", "numpy": "2.3.5", "ray": "2.55.1"},
}


class FakeTools:
    """Stands in for ``subprocess.run`` of uv pip compile and pip download; records every call."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.calls: list[list[str]] = []
        self.preferences: list[str] = []

    def __call__(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(cmd)
        if cmd[1:3] == ["pip", "compile"]:
            return self._compile(cmd)
        if cmd[1:4] == ["-m", "pip", "download"]:
            return self._download(cmd)
        raise AssertionError(f"unexpected command {cmd}")

    def _compile(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        reqs = Path(cmd[3]).read_text().split()
        out = Path(cmd[cmd.index("-o") + 1])
        self.preferences = out.read_text().split()
        never = {ln.split(" ;")[0] for ln in Path(cmd[cmd.index("--override") + 1]).read_text().splitlines()}
        pins = {n: v for n, v in FAKE_RESOLUTION[reqs[0]].items() if n not in never}
        out.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    def _download(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        lines = []
        for req in Path(cmd[cmd.index("-r") + 1]).read_text().split():
            name, version = req.split("==")
            fname = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
            path = self.dest / fname
            if path.exists():
                lines.append(f"File was already downloaded {path}")
            else:
                path.write_bytes(f"wheel {req}".encode())
                lines.append(f"Saved {path}")
        return subprocess.CompletedProcess(cmd, 0, "\n".join(lines) + "\n", "")


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTools:
    dest = tmp_path / "wh"
    tools = FakeTools(dest)
    monkeypatch.setattr(wh.subprocess, "run", tools)
    monkeypatch.setattr(wh, "uv_bin", lambda: "uv")
    return tools


def _build(tmp_path: Path, versions: list[str], **kw: Any) -> wh.BuildReport:
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0+cu130\ntransformers==5.17.0\nnumpy==2.5.2\n")
    return wh.build_wheelhouse(tmp_path / "wh", versions, "3.12", "manylinux_2_39_x86_64", freeze,
                               index=envs.IndexConfig(resolve_as_of="none"), **kw)


@pytest.mark.unit
def test_build_wheelhouse_manifest(tmp_path: Path, fake_tools: FakeTools) -> None:
    report = _build(tmp_path, ["0.21.0", "0.22.0"])
    m = report.manifest
    assert (m.python, m.platform, m.package) == ("3.12", "manylinux_2_39_x86_64", "vllm")
    v21 = m.versions["0.21.0"]
    # torch (2.11.0 vs installed 2.11.0+cu130) and transformers are kept; flashinfer is excluded and recorded.
    assert {d["name"] for d in v21.kept_installed} == {"torch", "transformers"}
    assert v21.replaces_installed == ({"name": "numpy", "version": "2.3.5", "installed": "2.5.2"},)
    assert [(e["name"], e["version"]) for e in v21.excluded] == [("flashinfer-cubin", "0.6.8"),
                                                                 ("flashinfer-python", "0.6.8")]
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in v21.excluded[0]["reason"]
    assert v21.wheels[0].startswith("vllm-0.21.0-")  # the big one first
    assert not any(w.startswith(("torch-", "flashinfer", "transformers-")) for w in v21.wheels)
    assert sorted(v21.wheels) == sorted(f"{n}-{v}-py3-none-any.whl" for n, v in
                                        [("vllm", "0.21.0"), ("xgrammar", "0.2.1"), ("numpy", "2.3.5"),
                                         ("ray", "2.55.1")])
    # Shared wheels are stored and hashed once.
    v22 = m.versions["0.22.0"]
    assert set(v21.wheels) & set(v22.wheels) == {"xgrammar-0.2.1-py3-none-any.whl", "numpy-2.3.5-py3-none-any.whl",
                                                 "ray-2.55.1-py3-none-any.whl"}
    assert len(m.files) == len(set(v21.wheels) | set(v22.wheels))
    for fname, meta in m.files.items():
        assert meta["sha256"] == hashlib.sha256((tmp_path / "wh" / fname).read_bytes()).hexdigest()
    assert v21.bytes == sum(m.files[f]["bytes"] for f in v21.wheels)
    assert wheels_for(m, "0.22.0")[0].name == "vllm-0.22.0-py3-none-any.whl"


@pytest.mark.unit
def test_resolution_prefers_public_installed_versions(tmp_path: Path, fake_tools: FakeTools) -> None:
    _build(tmp_path, ["0.21.0"])
    # Preferences drop the local label: "2.11.0+cu130" is on no index.
    assert "torch==2.11.0" in fake_tools.preferences
    compile_cmd = next(c for c in fake_tools.calls if c[1:3] == ["pip", "compile"])
    assert compile_cmd[compile_cmd.index("--python-platform") + 1] == "x86_64-manylinux_2_39"
    assert "--exclude-newer" not in compile_cmd  # resolve_as_of="none"


@pytest.mark.unit
def test_exclude_newer_spares_installed_packages(tmp_path: Path, fake_tools: FakeTools) -> None:
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0+cu130\n")
    wh.build_wheelhouse(tmp_path / "wh", ["0.21.0"], "3.12", "manylinux_2_39_x86_64", freeze,
                        index=envs.IndexConfig(resolve_as_of="2026-05-29"))
    cmd = next(c for c in fake_tools.calls if c[1:3] == ["pip", "compile"])
    assert cmd[cmd.index("--exclude-newer") + 1] == "2026-05-29"
    assert cmd[cmd.index("--exclude-newer-package") + 1] == "torch=false"


@pytest.mark.unit
def test_no_exclusions_downloads_flashinfer(tmp_path: Path, fake_tools: FakeTools) -> None:
    m = _build(tmp_path, ["0.21.0"], exclude=()).manifest
    assert m.versions["0.21.0"].excluded == ()
    assert "flashinfer_python-0.6.8-py3-none-any.whl" in m.versions["0.21.0"].wheels


@pytest.mark.unit
def test_adding_a_version_keeps_the_others(tmp_path: Path, fake_tools: FakeTools) -> None:
    _build(tmp_path, ["0.21.0"])
    report = _build(tmp_path, ["0.22.0"])
    assert set(report.manifest.versions) == {"0.21.0", "0.22.0"}
    assert "xgrammar-0.2.1-py3-none-any.whl" not in report.downloaded  # already there


@pytest.mark.unit
def test_wheelhouse_for_another_target_is_refused(tmp_path: Path, fake_tools: FakeTools) -> None:
    _build(tmp_path, ["0.21.0"])
    with pytest.raises(BadInput, match="another --dest"):
        wh.build_wheelhouse(tmp_path / "wh", ["0.22.0"], "3.11", "manylinux_2_39_x86_64", None)


@pytest.mark.unit
@pytest.mark.parametrize(("kw", "match"), [
    ({"python": "312"}, "--python"),
    ({"platform": "manylinux_2_39"}, "platform"),
    ({"vllm_versions": []}, "--vllm"),
])
def test_build_rejects_bad_input(tmp_path: Path, fake_tools: FakeTools, kw: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"dest": tmp_path / "wh", "vllm_versions": ["0.21.0"], "python": "3.12",
                            "platform": "manylinux_2_39_x86_64"}
    with pytest.raises(BadInput, match=match):
        wh.build_wheelhouse(**{**args, **kw})


@pytest.mark.unit
def test_download_without_a_reported_wheel_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wh.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
    with pytest.raises(EnvBuildError, match=r"no wheel for numpy==2\.3\.5"):
        wh.download([Pin("numpy", "2.3.5")], tmp_path, "3.12", "manylinux_2_39_x86_64", [], lambda s: None)


@pytest.mark.unit
def test_failed_resolution_names_the_requirements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wh.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "no solution: llguidance>=1.7"))
    with pytest.raises(EnvBuildError, match=r"vllm==0\.22\.0.*llguidance"):
        wh.resolve(["vllm==0.22.0"], "3.12", "manylinux_2_39_x86_64", {}, [], (), None, tmp_path, lambda s: None,
                   "uv")


# --------------------------------------------------------------------------- tiny real wheels + manifest errors


def make_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A minimal valid pure-Python wheel (RECORD with hashes, as pip expects)."""
    dist = f"{name}-{version}.dist-info"
    contents = dict(files)
    contents[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    contents[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    contents[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in contents.items():
            z.writestr(path, text)
    return out


def make_wheelhouse(folder: Path, python: str = PY) -> Path:
    """vllm 0.21.0 needing a newer ``depa`` than the base has installed."""
    folder.mkdir(parents=True)
    wheels = [
        make_wheel(folder, "vllm", "0.21.0", {"vllm/__init__.py": "import depa\n__version__ = '0.21.0'\n"}),
        make_wheel(folder, "depa", "2.0", {"depa/__init__.py": "__version__ = '2.0'\n"}),
    ]
    files = {w.name: {"name": w.name.split("-")[0], "version": w.name.split("-")[1], "bytes": w.stat().st_size,
                      "sha256": hashlib.sha256(w.read_bytes()).hexdigest()} for w in wheels}
    entry = {"requirements": ["vllm==0.21.0"], "wheels": [w.name for w in wheels], "kept_installed": [],
             "replaces_installed": [{"name": "depa", "version": "2.0", "installed": "1.0"}],
             "excluded": [{"name": "flashinfer-python", "version": "0.6.8", "reason": "--exclude flashinfer-*"}],
             "resolved_as_of": None, "bytes": sum(f["bytes"] for f in files.values())}
    manifest = {"schema_version": SCHEMA_VERSION, "python": python, "platform": "manylinux_2_39_x86_64",
                "package": "vllm", "files": files, "versions": {"0.21.0": entry}}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


@pytest.mark.unit
def test_load_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(WheelhouseError, match="does not exist"):
        load_manifest(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WheelhouseError, match=r"no wheelhouse\.json"):
        load_manifest(tmp_path / "empty")
    (tmp_path / "empty" / MANIFEST).write_text("{")
    with pytest.raises(WheelhouseError, match="not valid JSON"):
        load_manifest(tmp_path / "empty")
    (tmp_path / "empty" / MANIFEST).write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(WheelhouseError, match="schema_version 99"):
        load_manifest(tmp_path / "empty")
    (tmp_path / "empty" / MANIFEST).write_text(json.dumps({"schema_version": SCHEMA_VERSION, "python": "3.12"}))
    with pytest.raises(WheelhouseError, match="lacks field"):
        load_manifest(tmp_path / "empty")
    assert issubclass(WheelhouseError, ReproError)


@pytest.mark.unit
def test_wheels_for_checks_presence_and_hashes(tmp_path: Path) -> None:
    folder = make_wheelhouse(tmp_path / "wh")
    m = load_manifest(folder)
    assert [p.name for p in wheels_for(m, "0.21.0")] == ["vllm-0.21.0-py3-none-any.whl", "depa-2.0-py3-none-any.whl"]
    with pytest.raises(WheelhouseError, match=r"0\.22\.0 is not in the wheelhouse .*it has: 0\.21\.0"):
        wheels_for(m, "0.22.0")
    dep = folder / "depa-2.0-py3-none-any.whl"
    data = bytearray(dep.read_bytes())
    data[-1] ^= 0xFF  # same size, different bytes
    dep.write_bytes(bytes(data))
    with pytest.raises(WheelhouseError, match="corrupt"):
        wheels_for(m, "0.21.0")
    dep.write_bytes(bytes(data[:-10]))  # truncated
    with pytest.raises(WheelhouseError, match="truncated"):
        wheels_for(m, "0.21.0")
    dep.unlink()
    with pytest.raises(WheelhouseError, match=r"depa-2\.0-py3-none-any\.whl listed for vLLM 0\.21\.0 is missing"):
        wheels_for(m, "0.21.0")


# --------------------------------------------------------------------------- air-gapped install (real venv + pip)


@pytest.fixture
def base_python(tmp_path: Path) -> Path:
    """A venv (like /opt/torch/.venv) holding a stub torch and an older ``depa``; pip from the system site."""
    base = tmp_path / "base"
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(base)
    site = Path(subprocess.run([str(base / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("__version__ = '2.11.0+cu130'\n")
    (site / "depa").mkdir()
    (site / "depa" / "__init__.py").write_text("__version__ = '1.0'\n")
    return base / "bin" / "python"


@pytest.mark.integration
def test_install_from_wheelhouse(tmp_path: Path, base_python: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No uv and no network on an air-gapped node: fail loudly if either is touched.
    monkeypatch.setattr(envbuild_uv, "uv_bin", lambda: pytest.fail("uv used for a wheelhouse install"))
    monkeypatch.setattr(index_mod, "release_time", lambda *a: pytest.fail("index queried for a wheelhouse install"))
    folder = make_wheelhouse(tmp_path / "wh")
    recipe = envs.wheelhouse_recipe("0.21.0", folder, str(base_python))
    assert recipe.python == PY and recipe.package == "vllm"
    env = envs.ensure_env(recipe, tmp_path / "cache")
    assert env.status["vllm_version"] == "0.21.0"
    assert env.status["torch_version"] == "2.11.0+cu130"  # the base's torch
    assert env.status["wheelhouse"]["excluded"] == ["flashinfer-python"]
    probe = subprocess.run(
        [str(env.python), "-c", "import depa, torch, vllm; print(depa.__version__, torch.__file__, vllm.__file__)"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    assert probe[0] == "2.0"  # the wheelhouse's depa shadows the base's 1.0
    assert probe[1].startswith(str(tmp_path / "base")) and probe[2].startswith(str(env.path))
    # The second call reuses the env; a changed manifest makes a new recipe (new hash), so a new env.
    again = envs.ensure_env(envs.wheelhouse_recipe("0.21.0", folder, str(base_python)), tmp_path / "cache")
    assert again.path == env.path and again.status["built_at"] == env.status["built_at"]


@pytest.mark.integration
def test_install_refuses_a_corrupt_wheel(tmp_path: Path, base_python: Path) -> None:
    folder = make_wheelhouse(tmp_path / "wh")
    recipe = envs.wheelhouse_recipe("0.21.0", folder, str(base_python))
    (folder / "depa-2.0-py3-none-any.whl").write_bytes(b"x")
    with pytest.raises(WheelhouseError, match="truncated or corrupt"):
        envs.ensure_env(recipe, tmp_path / "cache")
    assert not envs.env_status(tmp_path / "cache" / "envs" / recipe.name)


@pytest.mark.integration
def test_install_refuses_a_changed_manifest(tmp_path: Path, base_python: Path) -> None:
    folder = make_wheelhouse(tmp_path / "wh")
    recipe = envs.wheelhouse_recipe("0.21.0", folder, str(base_python))
    m = json.loads((folder / MANIFEST).read_text())
    m["versions"]["0.21.0"]["resolved_as_of"] = "2026-01-01"
    (folder / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(WheelhouseError, match="changed since this recipe was made"):
        envs.ensure_env(recipe, tmp_path / "cache")


@pytest.mark.integration
def test_recipe_errors(tmp_path: Path, base_python: Path) -> None:
    folder = make_wheelhouse(tmp_path / "wh")
    with pytest.raises(WheelhouseError, match=r"0\.22\.0 is not in the wheelhouse"):
        envs.wheelhouse_recipe("0.22.0", folder, str(base_python))
    with pytest.raises(WheelhouseError, match="does not exist"):
        envs.wheelhouse_recipe("0.21.0", tmp_path / "missing", str(base_python))
    other = make_wheelhouse(tmp_path / "wh39", python="3.99")
    with pytest.raises(BadInput, match=r"for Python 3.99 but .* is Python"):
        envs.wheelhouse_recipe("0.21.0", other, str(base_python))
    with pytest.raises(BadInput, match="cannot run base interpreter"):
        envs.wheelhouse_recipe("0.21.0", folder, str(tmp_path / "no-python"))


@pytest.mark.integration
def test_smoke_failure_is_a_build_error(tmp_path: Path, base_python: Path) -> None:
    folder = tmp_path / "wh"
    make_wheelhouse(folder)
    # A vllm that cannot import (its dependency left out of the manifest) must not yield a valid env.
    m = json.loads((folder / MANIFEST).read_text())
    m["versions"]["0.21.0"]["wheels"] = ["vllm-0.21.0-py3-none-any.whl"]
    (folder / MANIFEST).write_text(json.dumps(m))
    site = subprocess.run([str(base_python), "-c", "import depa, os; print(os.path.dirname(depa.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "__init__.py").write_text("raise ImportError('depa broken in the base')\n")
    with pytest.raises(EnvBuildError, match="smoke import of vllm/torch failed"):
        envs.ensure_env(envs.wheelhouse_recipe("0.21.0", folder, str(base_python)), tmp_path / "cache")
