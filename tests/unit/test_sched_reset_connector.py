"""The ``reset-connector`` / ``reset-connector-keep`` scenarios (repro/sched/reset_connector.py,
harness/sched/reset_connector.py) against toy schedulers: the script, the precondition, and an oracle that fails
when the KV connector's reset_cache() is called for reset_connector=False or not called for True."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from toy_sched import ToyAdapter, ToyScheduler

from harness.core.cell import Cell
from harness.core.events import as_scenario_event
from harness.core.oracle import Outcome
from harness.core.records import CellResult, EngineInfo
from harness.core.scenarios import BY_SCENARIO
from harness.run.scenario_results import scenario_result
from harness.sched.reset_connector import expected_resets
from harness.sched.tier import sched_result, sched_scenario
from repro.models.deterministic import cycle_permutation
from repro.sched.reset_connector import precondition
from repro.sched.scenario import run_scenario
from repro.sched.upstream import build_any_script

pytestmark = pytest.mark.unit

VOCAB = 64
PERM = cycle_permutation(VOCAB, 0)
ASYNC_CLS = "vllm.v1.core.sched.async_scheduler.AsyncScheduler"


class ReproNullConsumerConnector:
    """Stands for repro.sched.null_connector's class (same name): records its reset_cache() calls."""

    def __init__(self) -> None:
        self.reset_calls: list[bool | None] = []

    def reset_cache(self) -> bool | None:
        self.reset_calls.append(True)
        return True


class ConnectorScheduler(ToyScheduler):
    """The toy with a KV connector and vLLM's reset_prefix_cache(reset_running_requests, reset_connector)."""

    def __init__(self) -> None:
        super().__init__()
        self.connector: Any = ReproNullConsumerConnector()
        self.flags: list[bool] = []

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.flags.append(reset_connector)
        ok = super().reset_prefix_cache(reset_running_requests)
        return self._reset_connector() and ok if reset_connector else ok

    def _reset_connector(self) -> bool:
        return self.connector.reset_cache() is not False


class EagerScheduler(ConnectorScheduler):
    """Resets the connector's cache whatever the flag says (a bug)."""

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return super().reset_prefix_cache(reset_running_requests, True)


class DeafScheduler(ConnectorScheduler):
    """Takes reset_connector and never passes it on to the connector (a bug)."""

    def _reset_connector(self) -> bool:
        return True


def _cell(name: str, async_on: bool = True) -> Cell:
    return Cell("0.34.0", "mp", async_on, scenario=name, tier="scheduler")


def _event(sched: ToyScheduler, name: str, async_on: bool = True) -> dict[str, Any]:
    sched.async_ = async_on
    ev = run_scenario(ToyAdapter(sched), sched_scenario(_cell(name, async_on), "rc", 0), Path("."), PERM)
    assert ev["status"] == "ran", ev.get("reason")
    return {"event": "scenario", "id": "rc", **ev,
            "scheduler_class": ASYNC_CLS if async_on else "vllm.v1.core.sched.scheduler.Scheduler"}


def _judge(ev: dict[str, Any], name: str, async_on: bool = True) -> CellResult:
    return sched_result(_cell(name, async_on), as_scenario_event(ev), EngineInfo({"tier": "scheduler"}),
                        scenario_result)


def test_two_scenario_names_one_per_flag_neither_pausing_nor_on_the_engine_tier() -> None:
    for name in ("reset-connector", "reset-connector-keep"):
        assert BY_SCENARIO[name].tiers == ("scheduler",) and not BY_SCENARIO[name].pauses
    for flag in (True, False):
        script = build_any_script("reset_connector", {"connector": flag}, VOCAB, 0)
        ops = [op.op for op in script.ops]
        assert ops[4:] == ["step_until", "pause", "drain", "reset", "resume", "run"]
        assert script.setup.kv_consumer and [op.connector for op in script.ops if op.op == "reset"] == [flag]


@pytest.mark.parametrize("async_on", [True, False])
@pytest.mark.parametrize(("name", "flag", "calls"), [("reset-connector", True, 1), ("reset-connector-keep", False, 0)])
def test_a_faithful_scheduler_is_ok_with_the_flag_passed_and_the_calls_counted(
        async_on: bool, name: str, flag: bool, calls: int) -> None:
    sched = ConnectorScheduler()
    ev = _event(sched, name, async_on)
    assert sched.flags == [flag]  # passed explicitly, False too
    assert ev["connector"]["reset_cache_calls"] == [True] * calls and expected_resets(ev["ops_log"]) == calls
    pre = ev["precondition"]
    assert pre["met"], pre
    assert pre["evidence"]["in_flight_at_reset"] == [0] and pre["evidence"]["running_at_reset"] == [4]
    res = _judge(ev, name, async_on)
    assert res.outcome is Outcome.OK and res.summary.endswith(f"reset_cache() called {calls}x"), res.summary
    assert f"(reset_connector={flag})" in res.summary and "4 request(s) kept" in res.summary


def test_reset_cache_called_when_false_was_asked_is_diverged() -> None:
    res = _judge(_event(EagerScheduler(), "reset-connector-keep"), "reset-connector-keep")
    assert res.outcome is Outcome.DIVERGED, res.summary
    assert "reset_cache() was called 1 time(s); the reset(s) with reset_connector=False ask for 0" in res.summary


def test_reset_cache_not_called_when_true_was_asked_is_diverged() -> None:
    res = _judge(_event(DeafScheduler(), "reset-connector"), "reset-connector")
    assert res.outcome is Outcome.DIVERGED, res.summary
    assert "called 0 time(s); the reset(s) with reset_connector=True ask for 1" in res.summary


@pytest.mark.parametrize("flag_lost", [True, False])
def test_a_release_without_the_parameter_is_unsupported_naming_its_signature(flag_lost: bool) -> None:
    sched = ToyScheduler(flag=flag_lost)  # flag: 0.21's discard flag, a LOSS the cell must not report as its own
    sched.connector = ReproNullConsumerConnector()  # type: ignore[attr-defined]
    ev = run_scenario(ToyAdapter(sched), sched_scenario(_cell("reset-connector"), "rc", 0), Path("."), PERM)
    why = ("this release's reset_prefix_cache(reset_running_requests: 'bool' = False) -> 'bool' has no "
           "reset_connector")
    assert ev["status"] == "unsupported" and ev["reason"] == why and "records" not in ev
    res = _judge({"event": "scenario", "id": "rc", **ev}, "reset-connector")
    assert res.outcome is Outcome.UNSUPPORTED and why in res.summary, res.summary


def test_the_precondition_names_a_missing_parameter_and_a_skipped_flag_expects_no_call() -> None:
    ev = _event(ConnectorScheduler(), "reset-connector")
    pre = precondition(ev["ops_log"], {**ev["connector"], "signature": "reset_prefix_cache(self, a=False)"})
    assert not pre["met"] and "reset_prefix_cache(self, a=False) has no reset_connector" in pre["what"]
    log = [dict(e, skipped_connector="no flag") if e["op"]["op"] == "reset" else e for e in ev["ops_log"]]
    assert expected_resets(ev["ops_log"]) == 1 and expected_resets(log) == 0


def test_no_recording_connector_or_a_reset_with_a_frame_in_flight_fails_the_precondition() -> None:
    sched = ConnectorScheduler()
    sched.connector = None
    ev = _event(sched, "reset-connector-keep")
    assert "KV connector is None, not the recording ReproNullConsumerConnector" in ev["precondition"]["what"]
    assert _judge(ev, "reset-connector-keep").outcome is Outcome.UNSUPPORTED
    ok = _event(ConnectorScheduler(), "reset-connector")
    log = [dict(e, in_flight_at_reset=1) if e["op"]["op"] == "reset" else e for e in ok["ops_log"]]
    pre = precondition(log, ok["connector"])
    assert not pre["met"] and "a reset ran with 1 frame(s) in flight, 4 request(s) running" in pre["what"]
