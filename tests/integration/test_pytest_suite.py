"""The post_resume suite itself, run as a user would (subprocess pytest): expectations and xdist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _pytest(tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, Path]:
    reports = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/integration/test_post_resume.py", "-p", "no:cacheprovider",
         "--repro-reports", str(reports), "-rfEs", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=1500, env={**os.environ, **(env or {})},
    )
    return proc.returncode, proc.stdout + proc.stderr, reports


def test_wrong_known_bug_table_fails_exactly_the_affected_items(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.toml"
    # Claims #42043 was fixed before 0.21.0: 0.21.0 is now expected OK everywhere.
    wrong.write_text('[[bug]]\nid = "vllm#42043"\naffected = "<0.21.0"\n\n[[bug.cells]]\nasync_scheduling = true\n'
                     'mode = "keep"\nclear_cache = true\nexpect = "LOSS"\nk = 1\n')
    rc, out, _ = _pytest(tmp_path, "wrong", "--vllm-versions", "0.21.0", "--executors", "mp",
                         "--scenarios", "pause,weight-sync", "-k", "post_resume and async_on and keep",
                         "--known-bugs", str(wrong))
    assert rc == 1, out
    failed = sorted(line.split()[1].split("::")[-1] for line in out.splitlines() if line.startswith("FAILED "))
    # Exactly the cells the real bug affects: the pause cell and the weight-sync cell of keep + clear.
    assert failed == ["test_post_resume[vllm0.21.0-mp-async_on-keep-clear-weight_sync]",
                      "test_post_resume[vllm0.21.0-mp-async_on-keep-clear]"], out
    assert "2 failed, 2 passed" in out, out
    # The message names what was expected, what came, and the first post-resume token.
    assert "expected OK, got LOSS(1) in 8/10 requests" in out
    assert "first post-resume token #" in out and "observed" in out


@pytest.mark.nightly  # one real-engine test of the pytest face stays in tox -e tests: the one above
def test_xdist_gives_the_same_outcomes_with_one_engine_per_config(tmp_path: Path) -> None:
    # The default profile's pausing scenarios: one engine per async setting (other profiles start their own).
    sel = ["--vllm-versions", "0.21.0", "--executors", "mp", "--scenarios", "pause,weight-sync", "-k",
           "post_resume and keep"]
    log0, log2 = tmp_path / "starts0.txt", tmp_path / "starts2.txt"
    rc0, out0, rep0 = _pytest(tmp_path, "n0", *sel, "-n", "0", env={"VLLM_REPRO_ENGINE_LOG": str(log0)})
    rc2, out2, rep2 = _pytest(tmp_path, "n2", *sel, "-n", "2", "--dist", "loadgroup",
                              env={"VLLM_REPRO_ENGINE_LOG": str(log2)})
    assert rc0 == 0, out0
    assert rc2 == 0, out2

    def outcomes(rep: Path) -> dict[str, str]:
        doc = json.loads((rep / "results.json").read_text())
        return {c["id"]: c["outcome"] for c in doc["cells"]}

    assert outcomes(rep0) == outcomes(rep2)
    assert outcomes(rep0)["vllm0.21.0-mp-async_on-keep-clear"] == "LOSS"
    configs = {"vllm0.21.0-mp-async_on", "vllm0.21.0-mp-async_off"}
    for log in (log0, log2):
        starts = [line.split()[0] for line in log.read_text().splitlines()]
        assert sorted(starts) == sorted(configs), starts  # one start per engine config, no more
