"""vLLM 0.34.0's KV loan (repro/scenarios/kv_loan.py, repro/probes/kv_loan.py) against a fake engine that lends its
KV memory the way ``kv_cache_lent_for_weight_update`` does: only when reclaimable (after a clear_cache pause)."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from test_weight_sync_scenario import _SP, FakeLLM, _ctx, checkpoints  # noqa: F401 -- module-scoped fixture

from harness.core.cell import Cell
from harness.core.oracle import Outcome, cell_verdict
from harness.core.profiles import PROFILES
from harness.core.recorded_streams import stream_records
from harness.core.scenarios import BY_SCENARIO
from harness.plan.matrix import plan_cells
from repro.core.wire import check_event
from repro.probes import kv_loan as probe
from repro.scenarios import kv_loan, runs
from repro.scenarios.vocab import ScenarioFailed, ScenarioUnsupported

pytestmark = pytest.mark.unit


class LoanLLM(FakeLLM):
    """A fake 0.34.0 engine with an extensible KV cache: a clear_cache pause marks it reclaimable, resume clears
    it, a reload under a forced factor lends it (release + recommit) only when reclaimable (``lend_anyway``: a
    broken engine that lends kept requests' KV)."""

    def __init__(self, model_dir: Path, *, extensible: bool = True, lend_anyway: bool = False,
                 stay_reclaimable: bool = False, **kw: Any) -> None:
        super().__init__(model_dir, **kw)
        self.extensible, self.lend_anyway, self.stay_reclaimable = extensible, lend_anyway, stay_reclaimable
        self.reclaimable, self.forced, self.released, self.recommitted = False, False, 0, 0

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        await super().pause_generation(mode, clear_cache)
        self.reclaimable = clear_cache

    async def resume_generation(self) -> None:
        await super().resume_generation()
        self.reclaimable = self.stay_reclaimable

    async def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> Any:
        if method == "repro_kv_loan":
            force = (kwargs or {}).get("force")
            self.forced = self.forced if force is None else force
            return [{"available": True, "extensible": self.extensible, "reclaimable": self.reclaimable,
                     "physical_bytes": 1 << 30, "factor": probe.FORCED_FACTOR if self.forced else 3,
                     "forced": self.forced, "release_physical_calls": self.released,
                     "recommit_calls": self.recommitted}]
        if method == "reload_weights" and self.forced and (self.reclaimable or self.lend_anyway):
            self.released += 1
            self.recommitted += 1
        return await super().collective_rpc(method, kwargs)


def _play(llm: FakeLLM, ck: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          clear_cache: bool) -> dict[str, Any]:
    monkeypatch.setattr(runs, "_vllm_api", lambda: (_SP, "DELTA"))
    sc = {"id": "kv_loan-keep", "scenario": "kv_loan", "seed": 17,
          "params": {"mode": "keep", "clear_cache": clear_cache, "max_tokens": 24}}
    return asyncio.run(kv_loan.run(llm, sc, _ctx(ck, tmp_path), timeout=30))


@pytest.mark.parametrize("clear_cache", [True, False])
def test_the_loan_follows_the_clear_cache_pause_and_every_token_is_checked(
        checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        clear_cache: bool) -> None:
    llm = LoanLLM(checkpoints["a"])
    out = _play(llm, checkpoints, tmp_path, monkeypatch, clear_cache)
    pre = out["precondition"]
    assert pre["met"], pre
    swap = pre["evidence"]["swap"]
    assert (swap["reclaimable"], swap["released"], swap["recommitted"]) == (
        (True, 1, 1) if clear_cache else (False, 0, 0))
    assert pre["evidence"]["reclaimable_after_resume"] is False
    assert not llm.forced  # vLLM's own factor is back after the cell
    assert cell_verdict(stream_records(out["records"])).outcome is Outcome.OK
    # What the engine sends the harness must pass the wire (a field it does not know is a WireError: the first H200
    # run of this scenario was refused so).
    check_event({"event": "scenario", "t": 0.0, "id": "kv_loan-keep", "status": "ran", **out}, strict=True)


def test_no_loan_after_a_clear_pause_is_a_failed_precondition(
        checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    llm = LoanLLM(checkpoints["a"])

    async def pause_without_flag(mode: str, clear_cache: bool) -> None:
        await FakeLLM.pause_generation(llm, mode, clear_cache)  # the engine never marks its KV reclaimable

    llm.pause_generation = pause_without_flag  # type: ignore[method-assign]
    pre = _play(llm, checkpoints, tmp_path, monkeypatch, True)["precondition"]
    assert not pre["met"] and "no KV loan" in pre["what"]


def test_a_loan_of_kept_requests_kv_is_reported_not_hidden(
        checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    with pytest.raises(ScenarioFailed, match="kept requests held their KV"):
        _play(LoanLLM(checkpoints["a"], lend_anyway=True), checkpoints, tmp_path, monkeypatch, False)


def test_a_loss_across_the_loan_is_a_finding(
        checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    out = _play(LoanLLM(checkpoints["a"], bug=True), checkpoints, tmp_path, monkeypatch, True)
    assert cell_verdict(stream_records(out["records"])).label == "LOSS(1)"


def test_an_engine_without_an_extensible_cache_is_unsupported(
        checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    with pytest.raises(ScenarioUnsupported, match="not extensible"):
        _play(LoanLLM(checkpoints["a"], extensible=False), checkpoints, tmp_path, monkeypatch, True)


def test_the_worker_probe_counts_release_and_recommit_and_restores_the_factor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Cache:
        def __init__(self) -> None:
            self.buffer = types.SimpleNamespace(physical_bytes=64)

        def release_physical(self) -> None:
            self.buffer.physical_bytes = 0

        def recommit(self) -> None:
            self.buffer.physical_bytes = 64

    mod = types.ModuleType(probe.MODULE)
    mod.ExtensibleKVCache = Cache  # type: ignore[attr-defined]
    mod.WEIGHT_UPDATE_PEAK_LAYER_FACTOR = 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, probe.MODULE, mod)
    monkeypatch.setattr(probe, "COUNTS", dict.fromkeys(probe.COUNTED, 0))
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(extensible_kv_cache=Cache()),
                                   _kv_cache_reclaimable=True)
    first = probe.kv_loan(worker, force=True)
    assert first["forced"] and mod.WEIGHT_UPDATE_PEAK_LAYER_FACTOR == probe.FORCED_FACTOR  # type: ignore[attr-defined]
    worker.model_runner.extensible_kv_cache.release_physical()
    worker.model_runner.extensible_kv_cache.recommit()
    last = probe.kv_loan(worker, force=False)
    assert (last["release_physical_calls"], last["recommit_calls"], last["forced"]) == (1, 1, False)
    assert mod.WEIGHT_UPDATE_PEAK_LAYER_FACTOR == 3  # type: ignore[attr-defined]
    assert last["extensible"] and last["reclaimable"] is True and last["physical_bytes"] == 64


def test_the_kv_loan_cells_run_alone_on_the_extensible_profile_in_keep_mode() -> None:
    shape = BY_SCENARIO["kv-loan"]
    assert shape.modes == ("keep",) and shape.clear_caches == (True, False)
    assert PROFILES[shape.profile].args == {"enable_extensible_kv_cache": True} and PROFILES[shape.profile].gpu_alone
    plan = plan_cells([Cell("0.34.0", "mp", True, "keep", c, 1, "kv-loan", "v2") for c in (True, False)], "cuda", 1)
    assert not plan.unsupported and len(plan.engines) == 1
