"""vllm#57970's scenario (repro.scenarios.connector_stale) judged without vLLM: a request admitted after the weight swap
that loaded the store entry written before it is DIVERGED at 0 on its KV record, one that missed is OK, and a run whose
fingerprints cannot tell A's KV from B's is no verdict (the precondition fails)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.core.oracle import Outcome, cell_verdict
from harness.core.profiles import PROFILES
from harness.core.recorded_streams import stream_records
from harness.core.scenarios import BY_SCENARIO
from harness.verdicts.known_bugs import check, load_known_bugs
from harness.verdicts.results import judged_result
from repro.models.deterministic import cycle_permutation, expected_continuation
from repro.probes import kv_example as kx
from repro.scenarios import RUNNERS, SCENARIOS, connector_stale
from repro.scenarios.connector_stale_judge import kv_records, stale_summary, token_records

pytestmark = pytest.mark.unit

PERM_A, PERM_B = cycle_permutation(64, 0), cycle_permutation(64, 1)


def _entry(store: Path, name: str, payload: bytes) -> str:
    folder = store / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.layers.0.self_attn.attn.safetensors").write_bytes(payload)
    return str(folder.resolve())


def _records(tmp_path: Path, ext: int, b_payload: bytes = b"B") -> tuple[list[dict[str, Any]], Any]:
    """P sent again after the swap; the connector answered ``ext`` external tokens for it."""
    store = tmp_path / "kv-store"
    folder = _entry(store, "p", b"A")
    at_swap = kx.snapshot(store)
    kx.wipe(store)
    assert not any(store.iterdir())
    _entry(store, "p", b_payload)  # what the control stores: the KV weights B compute
    control = {folder: kx.fingerprint(Path(folder))}
    prompt = [5, 6, 7]
    driver = {"rid": "s-p-again", "prompt": prompt, "max_tokens": 4, "submit": ["after", 0], "pauses": [],
              "observed": expected_continuation(PERM_B, prompt[-1], 4), "finish_reason": "length", "error": None}
    tokens = token_records([driver], "keep", PERM_A, PERM_B, models_ok=True)
    log = [{"op": "reset_cache", "returned": None},
           {"op": "match", "rid": "s-p-again-0a1b2c3d", "local": 0, "ext": ext, "folder": folder}]
    kv = kv_records(tokens, log, at_swap, control)
    return tokens + kv, stale_summary(kv, 1, {"called": False})


def test_stale_load_is_diverged_a_miss_is_ok_and_equal_kv_cannot_tell(tmp_path: Path) -> None:
    recs, cond = _records(tmp_path / "stale", ext=64)
    verdict = cell_verdict(stream_records(json.loads(json.dumps(recs))))
    assert verdict.outcome is Outcome.DIVERGED and verdict.label == "DIVERGED"
    assert [r.outcome for r in verdict.requests] == [Outcome.OK, Outcome.DIVERGED]  # tokens fine, KV stale
    assert verdict.requests[1].verdict.at == 0
    assert cond.met and cond.what.startswith("1/1 requests admitted after the swap started from KV computed")

    # The known-bug row expects DIVERGED in the -kv records only (the token records stay OK) from 0.23.0 on.
    bugs, streams = load_known_bugs(), stream_records(json.loads(json.dumps(recs)))
    for version, status in (("0.32.0", "as expected"), ("0.22.1", "UNEXPECTED")):
        c = Cell(version, "mp", False, "keep", True, scenario="connector-stale")
        assert check(judged_result(c, verdict, streams, None, 1.0), bugs).status == status

    recs, cond = _records(tmp_path / "miss", ext=0)
    assert cell_verdict(stream_records(recs)).outcome is Outcome.OK
    assert cond.met and cond.what.startswith("no request admitted after the swap loaded KV from before it")

    recs, cond = _records(tmp_path / "blind", ext=64, b_payload=b"A")  # B's KV bytes equal A's
    assert not cond.met and "cannot tell" in cond.why_not and "1/1 requests admitted" in cond.why_not


def test_scenario_table_profile_and_plan() -> None:
    sc = BY_SCENARIO["connector-stale"]
    assert sc.profile == "kv-example" and sc.modes == ("keep", "wait") and sc.clear_caches == (True,)
    cfg = PROFILES["kv-example"].args["kv_transfer_config"]
    assert (cfg["kv_connector"], cfg["kv_connector_module_path"]) == (kx.CONNECTOR, kx.MODULE)
    assert SCENARIOS["connector_stale"] is connector_stale.build and "connector_stale" in RUNNERS
    plan = connector_stale.build("s", {"mode": "wait", "num_requests": 2}, 64, 0)
    assert [r.rid for r in plan.requests] == ["s-r00", "s-r01", "s-p-again"]
    assert plan.requests[-1].submit == ("after", 0) and len(plan.requests[-1].prompt) == 66
    assert plan.pauses[0].mode == "wait" and plan.pauses[0].clear_cache
    for bad in ({"clear_cache": False}, {"mode": "abort"}, {"pause_after": 17}, {"prompt_len": 64}):
        with pytest.raises(ValueError):
            connector_stale.build("s", bad, 64, 0)


class _SleepLLM:
    """The calls a level-1 sleep door makes, and what ``is_sleeping()`` answers (``wakes``: it really wakes)."""

    def __init__(self, wakes: bool = True) -> None:
        self.calls: list[str] = []
        self.asleep, self.wakes = False, wakes

    async def sleep(self, level: int = 1, mode: str = "abort", reset_connector: bool = True) -> None:
        self.calls.append(f"sleep({level},{mode},{reset_connector})")
        self.asleep = True

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"wake_up({tags})")
        self.asleep = self.asleep and not (self.wakes and tags == ["kv_cache"])

    async def is_sleeping(self) -> bool:
        return self.asleep


@pytest.mark.parametrize("reset_connector", [True, False])
def test_the_sleep_door_sleeps_with_reset_connector_wakes_weights_then_kv(reset_connector: bool) -> None:
    import asyncio

    llm = _SleepLLM()
    door = connector_stale.sleep_door(llm, "keep", reset_connector)
    asyncio.run(door["enter"]())
    asyncio.run(door["leave"]())
    assert llm.calls == [f"sleep(1,keep,{reset_connector})", "wake_up(['weights'])", "wake_up(['kv_cache'])"]
    with pytest.raises(connector_stale.ScenarioFailed, match="still reports"):
        stuck = _SleepLLM(wakes=False)
        door = connector_stale.sleep_door(stuck, "keep", reset_connector)
        asyncio.run(door["enter"]())
        asyncio.run(door["leave"]())


def test_a_sleep_without_reset_connector_is_unsupported() -> None:
    class Old:  # vLLM 0.33.0: AsyncLLM.sleep(self, level=1, mode="abort")
        async def sleep(self, level: int = 1, mode: str = "abort") -> None: ...

    with pytest.raises(connector_stale.ScenarioUnsupported, match="reset_connector"):
        connector_stale.check_sleep_connector(Old())
    connector_stale.check_sleep_connector(_SleepLLM())


@pytest.mark.parametrize(("name", "flag"), [("sleep-connector", True), ("sleep-connector-keep", False)])
def test_the_sleep_connector_cells_run_connector_stale_through_a_sleep(tmp_path: Path, name: str, flag: bool) -> None:
    from harness.run.spec import RunConfig, scenario_spec

    sc = BY_SCENARIO[name]
    assert sc.profile == "kv-example-sleep" and PROFILES[sc.profile].gpu_alone
    assert PROFILES[sc.profile].args["enable_sleep_mode"] is True
    assert PROFILES[sc.profile].args["kv_transfer_config"] == PROFILES["kv-example"].args["kv_transfer_config"]
    cfg = RunConfig(platform="cuda", work_dir=tmp_path, model_cache=tmp_path / "models")
    spec = scenario_spec(Cell("0.34.0", "mp", True, "wait", True, 1, name, "v2"), cfg)
    assert spec.scenario == "connector_stale"
    assert {k: spec.params[k] for k in ("mode", "via", "reset_connector")} == {
        "mode": "wait", "via": "sleep", "reset_connector": flag}
    connector_stale.build("s", spec.params, 64, 0)  # the runner takes every parameter the harness sends
