"""A release pins a package the index lacks, on a package no run imports (vLLM 0.34.0: flashinfer-python==0.7.3):
the env build and the wheelhouse leave it out, say so, and still fail on any other unresolvable pin."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from packaging.version import Version
from test_cputorch import DRY_RUN, FakeStep, offline  # noqa: F401 -- the fixture

import harness.envbuild.cputorch as cputorch
from harness.core.errors import EnvBuildError
from harness.envbuild.index import IndexConfig
from harness.envbuild.recipe import default_recipe
from harness.envbuild.unresolvable import CPU_TORCH_REASON, LAZY_KERNELS, leave_out, unresolvable_pins
from harness.envbuild.uv import UvBackend

pytestmark = pytest.mark.unit

# uv 0.11's words when vLLM 0.34.0's flashinfer pin is on no index (measured here, 2026-12-04).
FLASHINFER_0_7_3 = """Using Python 3.11.7 environment at: env
error: No solution found when resolving dependencies
  cause: Because there is no version of flashinfer-python==0.7.3 and vllm>=0.34.0 depends on
         flashinfer-python==0.7.3, we can conclude that vllm>=0.34.0 cannot be used.
         And because you require vllm==0.34.0, we can conclude that your requirements are unsatisfiable.
"""
TORCH_PIN = FLASHINFER_0_7_3.replace("flashinfer-python==0.7.3", "torch==2.14.0")
V34_ON_CPU = default_recipe("cpu", "0.34.0", "3.11", IndexConfig(find_links=("/w",)), wheels="cuda")
V34_ON_GPU = default_recipe("cuda", "0.34.0", "3.12", IndexConfig())


def test_the_pin_is_read_from_uvs_wrapped_explanation() -> None:
    assert unresolvable_pins(FLASHINFER_0_7_3) == {"flashinfer-python": "0.7.3"}
    assert unresolvable_pins("error: Flashinfer_Python==0.7.3 was not found in the package registry") == {
        "flashinfer-python": "0.7.3"}
    assert unresolvable_pins("error: network unreachable") == {}


def test_only_a_package_no_run_imports_is_left_out() -> None:
    (lo,) = leave_out(FLASHINFER_0_7_3, LAZY_KERNELS) or ()
    assert (lo.name, lo.pinned) == ("flashinfer-python", "0.7.3")
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in lo.to_dict()["reason"] and "0.7.3" in lo.to_dict()["reason"]
    assert leave_out(TORCH_PIN, LAZY_KERNELS) is None  # torch is never replaced
    assert leave_out(FLASHINFER_0_7_3 + TORCH_PIN, LAZY_KERNELS) is None  # nor when it is one of several
    assert leave_out(FLASHINFER_0_7_3, LAZY_KERNELS, already=["flashinfer-python"]) is None  # no endless retry


def test_cpu_torch_env_leaves_out_the_pin_and_records_it(tmp_path: Path, offline: None) -> None:  # noqa: F811
    step = FakeStep(tmp_path, [(0, ""), (1, FLASHINFER_0_7_3), (0, DRY_RUN), (0, "")])
    facts = UvBackend().install(V34_ON_CPU, step).facts
    (_venv, _), (_, first_ov), (_, second_ov), (_, install_ov) = step.calls  # type: ignore[attr-defined]
    assert "flashinfer-python ; sys_platform == 'never'" not in first_ov
    assert "flashinfer-python ; sys_platform == 'never'" in second_ov
    assert "flashinfer-python ; sys_platform == 'never'" in install_ov
    assert facts["unresolvable_left_out"] == [{"name": "flashinfer-python", "version": "0.7.3", "reason": (
        f"pin flashinfer-python==0.7.3 is on no configured index; left out: {CPU_TORCH_REASON}")}]


def test_cpu_torch_env_still_fails_on_a_pin_the_run_needs(tmp_path: Path, offline: None,  # noqa: F811
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cputorch, "cpu_torch_builds", lambda index, python: [Version("2.13.0+cpu")])
    with pytest.raises(EnvBuildError, match=r"dry-run failed: .*torch==2\.14\.0"):
        UvBackend().install(V34_ON_CPU, FakeStep(tmp_path, [(0, ""), (1, TORCH_PIN)]))


def test_gpu_env_leaves_out_a_lazy_kernel_only(tmp_path: Path, offline: None) -> None:  # noqa: F811
    step = FakeStep(tmp_path, [(0, ""), (1, FLASHINFER_0_7_3), (0, "")])
    facts = UvBackend().install(V34_ON_GPU, step).facts
    assert [d["name"] for d in facts["unresolvable_left_out"]] == ["flashinfer-python"]
    with pytest.raises(EnvBuildError, match=r"vllm==0\.34\.0 failed: .*torch==2\.14\.0"):
        UvBackend().install(V34_ON_GPU, FakeStep(tmp_path, [(0, ""), (1, TORCH_PIN)]))


def test_wheelhouse_leaves_out_the_pin_and_its_manifest_says_so(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import test_wheelhouse as twh

    import harness.bundle.wheelhouse as wh

    class Tools(twh.FakeTools):
        def _compile(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
            never = Path(cmd[cmd.index("--override") + 1]).read_text()
            if "flashinfer-python" not in never:
                return subprocess.CompletedProcess(cmd, 1, "", FLASHINFER_0_7_3)
            return super()._compile(cmd)

    monkeypatch.setitem(twh.FAKE_RESOLUTION, "vllm==0.34.0", {"vllm": "0.34.0", "torch": "2.14.0",
                                                               "numpy": "2.3.5", "ray": "2.55.1"})
    monkeypatch.setattr(wh.subprocess, "run", Tools(tmp_path / "wh"))
    monkeypatch.setattr(wh, "uv_bin", lambda: "uv")
    entry = twh._build(tmp_path, ["0.34.0"]).manifest.versions["0.34.0"]
    (excluded,) = entry.excluded
    assert (excluded["name"], excluded["version"]) == ("flashinfer-python", "0.7.3")
    assert "on no configured index" in excluded["reason"] and "--exclude flashinfer-*" in excluded["reason"]
    with pytest.raises(EnvBuildError, match=r"flashinfer-python==0\.7\.3"):  # --exclude none: nothing may go
        (tmp_path / "none").mkdir()
        twh._build(tmp_path / "none", ["0.34.0"], exclude=())


def test_kernels_a_release_imports_after_all_are_not_left_out_there() -> None:
    from harness.envbuild.unresolvable import lazy_for

    # 0.34.0's kernel_warmup imports the CuTe DSL (cutlass) and quack on every CUDA engine (measured on an H200).
    assert "nvidia-cutlass-dsl*" in lazy_for("0.33.0", LAZY_KERNELS)
    assert "nvidia-cutlass-dsl*" not in lazy_for("0.34.0", LAZY_KERNELS)
    assert "quack-kernels" not in lazy_for("0.35.1", LAZY_KERNELS)
    assert "flashinfer-*" in lazy_for("0.34.0", LAZY_KERNELS)
    assert lazy_for("abc1234", LAZY_KERNELS) == tuple(LAZY_KERNELS)
