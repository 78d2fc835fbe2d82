"""The vllm#52461 probe (repro.probes.logitsprocs) and the engine tier's logitsproc scenario, checked without vLLM:
the processor follows vLLM's batch updates (add, move, swap, remove) and keeps live references, the summary counts
what it was shown against what vLLM returned, the plugin dist-info declares the processor where vLLM looks for it
(and only the scenario's engine profile stages it), and on a fake engine a -1 shown is DIVERGED, real ids OK."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from fake_engine import SP, FakeLLM

import repro.scenarios.runs as runs
from harness.core.cell import Cell
from harness.core.oracle import Outcome, cell_verdict
from harness.core.profiles import PROFILES
from harness.core.recorded_streams import stream_records
from harness.core.scenarios import BY_SCENARIO
from harness.run.spec import RunConfig, build_spec, scenario_spec
from harness.run.staging import stage_entry_points
from repro.models.deterministic import BigramCycleSpec, build_checkpoint, load_perm
from repro.probes import logitsprocs as lp
from repro.scenarios import RUNNERS, SCENARIOS, logitsproc
from repro.scenarios.vocab import EngineContext

pytestmark = pytest.mark.unit


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


@dataclass
class Update:
    """vLLM's BatchUpdate shape: added (index, params, prompt_ids, output_ids), moved (a, b, direction), removed."""

    added: list[tuple[int, Any, list[int] | None, list[int]]] = field(default_factory=list)
    moved: list[tuple[int, int, str]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)


def proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> lp.RecordingProcessor:
    monkeypatch.setenv(lp.ENV_LOG, str(tmp_path / "steps.jsonl"))
    return lp.RecordingProcessor(None, None, False)


def steps(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]


def test_records_live_output_lists_per_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = proc(tmp_path, monkeypatch)
    out_a: list[int] = []
    p.update_state(Update(added=[(0, Params({"probe_key": "p0"}), [5, 6], out_a)]))
    p.apply("logits")
    out_a.append(-1)  # vLLM's async placeholder, appended to the very list the processor holds
    assert p.apply("logits") == "logits"  # never changes the logits
    assert [s["rows"] for s in steps(tmp_path)] == [{"p0": []}, {"p0": [-1]}]
    assert p.is_argmax_invariant() is False  # else vLLM skips it for greedy requests


def test_follows_moves_swaps_and_removals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = proc(tmp_path, monkeypatch)
    a, b = [1], [2]
    p.update_state(Update(added=[(0, Params({"probe_key": "a"}), None, a), (1, Params({"probe_key": "b"}), None, b)]))
    p.update_state(Update(moved=[(0, 1, "SWAP")]))
    assert p.rows == {1: ("a", a), 0: ("b", b)}
    p.update_state(Update(removed=[0], moved=[(1, 0, "UNIDIRECTIONAL")]))
    assert p.rows == {0: ("a", a)}
    p.update_state(None)  # vLLM passes None when nothing changed
    assert p.rows == {0: ("a", a)}


def test_summary_counts_placeholders_and_wrong_prefixes(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text("\n".join(json.dumps({"step": i, "rows": rows}) for i, rows in enumerate([
        {"p0": [], "p1": []}, {"p0": [7], "p1": [-1]}, {"p0": [7, 8], "p1": [-1, -1]}, {"other": [3]}])))
    s = lp.summarize(log, {"p0": [7, 8, 9], "p1": [4, 5, 6]})
    assert s["total"] == {"snapshots": 6, "with_minus_one": 2, "wrong_prefix": 2}
    assert s["per_request"]["p0"] == {"snapshots": 3, "with_minus_one": 0, "wrong_prefix": 0}
    assert s["first_wrong"] == {"p1": {"shown": [-1], "returned_prefix": [4]}}
    assert lp.summarize(tmp_path / "missing.jsonl", {"p0": [1]})["total"]["snapshots"] == 0


def test_plugin_dist_info_declares_the_entry_point(tmp_path: Path) -> None:
    lp.write_plugin_dist_info(tmp_path)
    eps = [ep for dist in importlib.metadata.distributions(path=[str(tmp_path)]) for ep in dist.entry_points
           if ep.group == "vllm.logits_processors"]
    assert [(ep.name, ep.value) for ep in eps] == [("repro_probe", lp.FQCN)]


# --------------------------------------------------------------------------- the engine tier's logitsproc scenario


class ShowingLLM(FakeLLM):
    """A fake engine whose 'logits processor' logs, before each step, the output ids it is shown: the real ones, or
    (``placeholders``) a -1 for each, as vLLM's async worker leaves them for a plugin processor (vllm#52461)."""

    def __init__(self, perm: list[int], log: Path, placeholders: bool) -> None:
        super().__init__(perm, on_step=self._show)
        self.log, self.placeholders = log, placeholders
        self.shown: dict[str, tuple[str, list[int]]] = {}

    async def generate(self, prompt: dict[str, list[int]], sp: SP, request_id: str) -> AsyncIterator[Any]:
        self.shown[request_id + "-0badcafe"] = (lp.prompt_key(prompt["prompt_token_ids"]), [])
        last = prompt["prompt_token_ids"][-1]
        async for out in super().generate(prompt, sp, request_id):
            _, ids = self.shown[request_id + "-0badcafe"]
            for _ in out.outputs[0].token_ids:
                last = self.perm[last]
                ids.append(-1 if self.placeholders else last)
            yield out

    def _show(self, fake: FakeLLM, rid: str, n: int) -> None:
        key, ids = self.shown[rid]
        with open(self.log, "a") as f:
            f.write(json.dumps({"step": n, "rows": {key: list(ids)}}) + "\n")


@pytest.fixture(scope="module")
def perm_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cache = tmp_path_factory.mktemp("models")
    d = build_checkpoint(BigramCycleSpec(), cache)
    return {"spec": BigramCycleSpec(), "dir": d, "cache": cache, "perm": load_perm(d)}


def _play(perm_model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          placeholders: bool) -> dict[str, Any]:
    monkeypatch.chdir(tmp_path)  # the engine's work dir, where the processor writes
    monkeypatch.setattr(runs, "_vllm_api", lambda: (SP, "DELTA"))
    ctx = EngineContext(model_spec=perm_model["spec"], model_dir=perm_model["dir"], perm=perm_model["perm"],
                        model_cache=perm_model["cache"], work_dir=tmp_path, tensor_parallel_size=1,
                        start_engine=lambda d: pytest.fail("no fresh engine"))
    llm = ShowingLLM(perm_model["perm"], tmp_path / lp.DEFAULT_LOG, placeholders)
    sc = {"id": "logitsproc", "scenario": "logitsproc", "params": {"max_tokens": 12}, "seed": 3}
    return asyncio.run(RUNNERS["logitsproc"](llm, sc, ctx, 30))


def test_placeholders_shown_to_the_plugin_are_diverged_at_the_first_token(
        perm_model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _play(perm_model, tmp_path, monkeypatch, placeholders=True)
    assert out["precondition"]["met"], out["precondition"]
    rec = out["records"][0]
    assert rec["observed"] == [-1] and rec["reference"] == rec["returned"] and len(rec["returned"]) == 12
    assert rec["reference_matches_model"] and rec["snapshots"] == 12 and rec["snapshots_with_minus_one"] == 11
    v = cell_verdict(stream_records(out["records"]))
    assert v.outcome is Outcome.DIVERGED, v.summary


def test_real_ids_shown_to_the_plugin_are_ok(perm_model: dict[str, Any], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = _play(perm_model, tmp_path, monkeypatch, placeholders=False)
    assert out["precondition"]["met"] and out["events"][-1]["snapshots_wrong"] == 0
    assert all(r["observed"] == r["returned"][:11] for r in out["records"])
    v = cell_verdict(stream_records(out["records"]))
    assert v.outcome is Outcome.OK, v.summary


def test_a_processor_vllm_never_called_is_an_unmet_precondition() -> None:
    rec = {"rid": "r0", "prompt": [5, 6], "observed": [1, 2, 3]}
    assert logitsproc.judge_record(rec, [])["snapshots"] == 0
    assert logitsproc.read_snapshots(Path("/nonexistent/steps.jsonl")) == {}


def test_only_the_profile_engines_get_the_plugin_entry_point(tmp_path: Path) -> None:
    assert stage_entry_points(tmp_path / "plain", PROFILES["default"].entry_points) is None
    stage_entry_points(tmp_path, PROFILES[BY_SCENARIO["logitsproc"].profile].entry_points)
    eps = [(ep.group, ep.name, ep.value) for dist in importlib.metadata.distributions(path=[str(tmp_path)])
           for ep in dist.entry_points]
    assert eps == [("vllm.logits_processors", "repro_probe", lp.FQCN)]


def test_the_harness_parameters_reach_the_scenario_and_its_engine_is_its_own(tmp_path: Path) -> None:
    cell = replace(Cell("0.21.0", "mp", True), scenario="logitsproc")
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "w", model_cache=tmp_path / "m",
                    scenario_params={"num_requests": 6, "max_tokens": 20, "pause_after": 8})
    sc = scenario_spec(cell, cfg)
    assert sc.scenario == "logitsproc" and "pause_after" not in sc.params  # no event at a token count
    plan = SCENARIOS[sc.scenario](sc.id, sc.params, 512, sc.seed)
    assert [r.max_tokens for r in plan.requests] == [20] * 6 and not plan.pauses
    assert len({tuple(r.prompt) for r in plan.requests}) == 6  # the processor keys requests by prompt
    assert build_spec(cell.engine, (cell,), cfg).engine_id.endswith("-logitsproc_plugin")
    assert cell.id == "vllm0.21.0-mp-async_on-logitsproc"
