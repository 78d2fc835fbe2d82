"""``vllm-repro frameworks check`` end to end on real CPU engines: PipelineRL's recipe on one release.

Two engine starts (async on, async off): the recipe's sequence (keep pause with clear_cache=False, weight swap,
resume) is its workaround's without-cell, so the check shares one result between the two, and the workaround
verdict comes from the ledger's pair.  Nightly: the CPU tier's weight-sync cells are already in `tox -e tests`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.envbuild.envs import default_cache_dir
from harness.frontends.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine, pytest.mark.slow, pytest.mark.nightly]


def test_pipelinerl_recipe_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    argv = ["frameworks", "check", "--framework", "pipelinerl", "--versions", "0.22.0", "--platform", "cpu",
            "--reports", str(reports), "--cache-dir", str(default_cache_dir())]
    assert main(argv) == 0
    out = capsys.readouterr().out
    cells = {c["id"]: c for c in json.loads((reports / "results.json").read_text())["cells"]}
    assert sorted(cells) == ["vllm0.22.0-mp-async_off-keep-noclear-weight_sync",
                             "vllm0.22.0-mp-async_on-keep-noclear-weight_sync"]
    # The cells ran (token streams judged), so the workaround has a verdict, never UNKNOWN.
    assert all(c["outcome"] in ("OK", "LOSS", "DUPLICATE", "DIVERGED") for c in cells.values()), cells
    assert "| pipelinerl (engine; pins ==0.18.1) |" in out
    verdict = next(line for line in out.splitlines() if line.startswith("    0.22.0: "))
    assert verdict.split(": ")[1] in ("NEEDED", "REMOVABLE", "BROKEN"), verdict
    assert (reports / "frameworks.md").read_text().splitlines()[0].startswith("| framework | 0.22.0 |")
