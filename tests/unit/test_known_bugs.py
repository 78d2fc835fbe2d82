"""Tests of harness.verdicts.known_bugs: the shipped table, expectation() and check() on realistic cell results."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet
from synthetic import request_record

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome, cell_verdict
from harness.core.pattern import parse_pattern
from harness.core.recorded_streams import stream_records
from harness.plan.matrix import EXECUTORS, MODES
from harness.verdicts.known_bugs import Expectation, KnownBug, Rule, check, expectation, load_known_bugs
from harness.verdicts.results import CellResult, infra_result, judged_result

pytestmark = pytest.mark.unit

MAX_TOKENS = 24
PAUSE_AT = 6
RUNNING = 8
LATE = 2


@pytest.fixture(scope="module")
def bugs() -> tuple[KnownBug, ...]:
    return load_known_bugs()


def cell(version: str = "0.21.0", async_on: bool = True, mode: str = "keep", clear: bool = True,
         executor: str = "mp") -> Cell:
    return Cell(version, executor, async_on, mode, clear)


def _records(c: Cell, lose: dict[int, int]) -> list[dict[str, Any]]:
    # RUNNING requests paused at PAUSE_AT, LATE ones submitted during the pause; ``lose`` maps a request
    # index to the tokens it loses (running: at the pause index; late: at index 0).
    out = []
    for i in range(RUNNING + LATE):
        ref = [100 * (i + 1) + j for j in range(MAX_TOKENS)]
        running = i < RUNNING
        k = lose.get(i, 0)
        at = PAUSE_AT if running else 0
        obs = ref[:at] + ref[at + k:] if k else list(ref)
        out.append(request_record(
            f"{'r' if running else 'x'}{i:02d}", obs, ref, running=running, mode=c.mode,
            clear_cache=c.clear_cache, pause_at=PAUSE_AT, max_tokens=MAX_TOKENS, prompt=[i],
        ))
    return out


def ran(c: Cell, lose: dict[int, int] | None = None) -> CellResult:
    recs = _records(c, lose or {})
    return judged_result(c, cell_verdict(stream_records(recs)), stream_records(recs), None, 1.0)


ALL_RUNNING_LOSE_1 = dict.fromkeys(range(RUNNING), 1)


# --------------------------------------------------------------------------- the shipped table


def test_shipped_table(bugs: tuple[KnownBug, ...]) -> None:
    # Two windows of one bug, each measured by bisect on its tier: the engine's keep pause resets the cache
    # from 0.17.0; vLLM's scheduler drops the token after a drained reset in every release that installs.
    # (Further rows of the same bug cover other scenarios: the manual reset, ...; they have tests of their own.)
    engine, scheduler, manual = [b for b in bugs if b.id == "vllm#42043"][:3]
    assert engine.affected == manual.affected == SpecifierSet(">=0.17.0, <0.22.0")
    assert scheduler.affected == SpecifierSet(">=0.12.0, <0.22.0")
    # The rules name the scenarios that play a keep + clear_cache pause (non-pausing ones carry the default
    # mode and clear_cache without playing them).
    # The stale-kv scenarios' resets with requests kept (issue 37, the context-cell model) are rows of their own.
    on = "async_scheduling=on,mode=keep"
    for bug, cells in ((engine, (f"tier=engine,scenario=pause|weight-sync,{on},clear_cache=true",
                                 f"tier=engine,scenario=stale-kv-clear,{on},clear_cache=true")),
                       (scheduler, (f"tier=scheduler,scenario=pause,{on},clear_cache=true",)),
                       (manual, (f"tier=engine,scenario=manual-reset|manual-reset-reload,{on},clear_cache=false",
                                 f"tier=engine,scenario=stale-kv-running,{on},clear_cache=false"))):
        assert bug.fix == "vllm#42117"
        assert bug.fixed_in == "0.22.0"
        assert bug.cells == tuple(Rule(parse_pattern(c), Outcome.LOSS, 1) for c in cells)


# The scheduler-tier family as measured (docs/results/sched-family-2026-12-01/matrix, async on; async off
# is OK or UNSUPPORTED everywhere): what the shipped table must expect, release by release.
FAMILY_MEASURED = {
    "pause": "LOSS(1) LOSS(1) LOSS(1) OK OK OK OK OK OK",
    "reset-deep": "DIVERGED DIVERGED DIVERGED OK OK OK OK OK OK",
    "preempt-deep": "CRASH CRASH CRASH CRASH CRASH CRASH CRASH OK OK",
    "spec-reset": "CRASH CRASH CRASH LOSS(2) LOSS(2) LOSS(2) LOSS(2) OK OK",
    "spec-reset-partial": "OK OK OK LOSS(3) LOSS(3) LOSS(3) LOSS(3) OK OK",
    "spec-reset-twice": "OK OK OK CRASH CRASH OK OK OK OK",
    "reset-inflight": "OK OK OK OK OK OK OK OK OK",
    "preempt": "OK OK OK OK OK OK OK OK OK",
    "abort-some": "OK OK OK OK OK OK OK OK OK",
}
MEASURED_VERSIONS = ("0.12.0", "0.17.0", "0.21.0", "0.22.0", "0.24.0", "0.25.0", "0.26.0", "0.27.0", "0.32.0")


@pytest.mark.parametrize("scenario", sorted(FAMILY_MEASURED))
def test_the_scheduler_family_rows_expect_what_was_measured(bugs: tuple[KnownBug, ...], scenario: str) -> None:
    for version, label in zip(MEASURED_VERSIONS, FAMILY_MEASURED[scenario].split(), strict=True):
        on = Cell(version, "mp", True, scenario=scenario, tier="scheduler")
        assert expectation(on, bugs).label == label, (scenario, version)
        assert expectation(on.replace(async_on=False), bugs).outcome is Outcome.OK
        # The engine tier's rows never reach the scheduler-tier family (and vice versa).
        assert scenario == "pause" or expectation(on.replace(tier="engine"), bugs).outcome is Outcome.OK


@pytest.mark.parametrize(
    ("c", "expected"),
    [
        (cell("0.21.0"), Expectation(Outcome.LOSS, 1, "vllm#42043")),
        (cell("0.17.0"), Expectation(Outcome.LOSS, 1, "vllm#42043")),
        (cell("0.21.1"), Expectation(Outcome.LOSS, 1, "vllm#42043")),
        (cell("0.21.0", executor="ray-v2"), Expectation(Outcome.LOSS, 1, "vllm#42043")),
        (cell("0.16.0"), Expectation(Outcome.OK)),
        (cell("0.22.0"), Expectation(Outcome.OK)),
        (cell("0.32.0"), Expectation(Outcome.OK)),
        (cell("0.9.0"), Expectation(Outcome.OK)),
        (cell("0.21.0", async_on=False), Expectation(Outcome.OK)),
        (cell("0.21.0", clear=False), Expectation(Outcome.OK)),
        (cell("0.21.0", mode="wait"), Expectation(Outcome.OK)),
        (cell("0.21.0", mode="abort"), Expectation(Outcome.OK)),
        # Non-pausing scenarios carry keep + clear_cache without playing them (measured OK on 0.21.0).
        (replace(cell("0.21.0"), scenario="preempt"), Expectation(Outcome.OK)),
        (replace(cell("0.21.0"), scenario="weight-sync"), Expectation(Outcome.LOSS, 1, "vllm#42043")),
        (cell("1a2b3c4d5e6f"), Expectation(Outcome.OK)),  # a commit label is no version
    ],
)
def test_expectation_shipped(bugs: tuple[KnownBug, ...], c: Cell, expected: Expectation) -> None:
    assert expectation(c, bugs) == expected


def test_expectation_label() -> None:
    assert Expectation(Outcome.LOSS, 1, "b").label == "LOSS(1)"
    assert Expectation(Outcome.DIVERGED).label == "DIVERGED"
    assert Expectation(Outcome.OK).label == "OK"


@given(minor=st.integers(0, 40), patch=st.integers(0, 3), executor=st.sampled_from(EXECUTORS),
       async_on=st.booleans(), mode=st.sampled_from(MODES), clear=st.booleans())
def test_expectation_rule(minor: int, patch: int, executor: str, async_on: bool, mode: str, clear: bool) -> None:
    bugs = load_known_bugs()
    exp = expectation(Cell(f"0.{minor}.{patch}", executor, async_on, mode, clear), bugs)
    affected = 17 <= minor < 22 and async_on and mode == "keep" and clear
    assert exp == (Expectation(Outcome.LOSS, 1, "vllm#42043") if affected else Expectation(Outcome.OK))


# --------------------------------------------------------------------------- custom tables

CUSTOM = """
[[bug]]
id = "ray-only"
affected = ">=0.10"
[[bug.cells]]
executor = "ray-v2"
mode = "wait"
expect = "DIVERGED"

[[bug]]
id = "mp-or-uni"
affected = ">=0.10, <0.30"
[[bug.cells]]
executors = ["mp", "uni"]
mode = "wait"
expect = "DUPLICATE"
k = 2
"""


def _table(tmp_path: Path, text: str) -> tuple[KnownBug, ...]:
    p = tmp_path / "bugs.toml"
    p.write_text(text)
    return load_known_bugs(p)


def test_executor_filtering(tmp_path: Path) -> None:
    bugs = _table(tmp_path, CUSTOM)
    assert expectation(cell("0.20.0", mode="wait", executor="ray-v2"), bugs) == Expectation(Outcome.DIVERGED,
                                                                                            None, "ray-only")
    for ex in ("mp", "uni"):
        assert expectation(cell("0.20.0", mode="wait", executor=ex), bugs) == Expectation(Outcome.DUPLICATE, 2,
                                                                                          "mp-or-uni")
    assert expectation(cell("0.20.0", mode="wait", executor="ray-v1"), bugs) == Expectation(Outcome.OK)
    # Outside mp-or-uni's range; ray-only still applies.
    assert expectation(cell("0.31.0", mode="wait", executor="mp"), bugs) == Expectation(Outcome.OK)
    assert expectation(cell("0.31.0", mode="wait", executor="ray-v2"), bugs).bug == "ray-only"
    # The mode key still has to match.
    assert expectation(cell("0.20.0", mode="keep", executor="ray-v2"), bugs) == Expectation(Outcome.OK)


def test_empty_table_expects_ok(tmp_path: Path) -> None:
    bugs = _table(tmp_path, "# no bugs\n")
    assert bugs == ()
    assert expectation(cell("0.21.0"), bugs) == Expectation(Outcome.OK)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[[bug]\n", "invalid TOML"),
        ('[[bug]]\naffected = ">=1"\n', "bug[0].id: missing"),
        ('[[bug]]\nid = "x"\n', "bug[0].affected: missing"),
        ('[[bug]]\nid = "x"\naffected = "banana"\n', "banana"),
        ('[[bug]]\nid = "x"\naffected = ">=1"\n[[bug.cells]]\nexpect = "LOST"\n', 
         "bug[0].cells[0].expect: expected one of OK, "),
        ('[[bug]]\nid = "x"\naffected = ">=1"\n[[bug.cells]]\nmode = "keep"\n', "bug[0].cells[0].expect: missing"),
        ('[[bug]]\nid = "x"\naffected = ">=1"\n[[bug.cells]]\nasync = true\nexpect = "LOSS"\n',
         "bug[0].cells[0].async: unknown key"),
    ],
)
def test_malformed_tables(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(BadInput) as exc:
        _table(tmp_path, text)
    assert str(exc.value).startswith(str(tmp_path / "bugs.toml"))
    assert needle in str(exc.value)


def test_malformed_table_names_the_bug(tmp_path: Path) -> None:
    text = '[[bug]]\nid = "ok"\naffected = ">=1"\n[[bug]]\nid = "x"\naffected = "nope"\n'
    with pytest.raises(BadInput, match=r"bug\[1\]\.affected: expected a PEP 440 version specifier"):
        _table(tmp_path, text)


def test_missing_table_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read known-bug table"):
        load_known_bugs(tmp_path / "nope.toml")


def test_malformed_affected_type(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="malformed"):
        _table(tmp_path, '[[bug]]\nid = "x"\naffected = 5\n')


# --------------------------------------------------------------------------- check


def test_check_loss_as_expected(bugs: tuple[KnownBug, ...]) -> None:
    cr = ran(cell("0.21.0"), ALL_RUNNING_LOSE_1)
    assert cr.summary == f"LOSS(1) in {RUNNING}/{RUNNING + LATE} requests ({RUNNING}/{RUNNING} running at pause)"
    ch = check(cr, bugs)
    assert ch.status == "as expected"
    assert ch.expected == Expectation(Outcome.LOSS, 1, "vllm#42043")
    assert "vllm#42043" in ch.message


@pytest.mark.parametrize("c", [cell("0.32.0"), cell("0.21.0", async_on=False), cell("0.21.0", mode="wait"),
                               cell("0.21.0", clear=False), cell("0.16.0")])
def test_check_ok_as_expected(bugs: tuple[KnownBug, ...], c: Cell) -> None:
    ch = check(ran(c), bugs)
    assert ch.status == "as expected"
    assert ch.expected == Expectation(Outcome.OK)


def test_check_unexpected_when_the_loss_disappears(bugs: tuple[KnownBug, ...]) -> None:
    ch = check(ran(cell("0.21.0")), bugs)
    assert ch.status == "UNEXPECTED"
    assert "expected LOSS(1) from vllm#42043" in ch.message
    assert f"r00: expected LOSS(1 at {PAUSE_AT}), got OK" in ch.message


def test_check_unexpected_when_only_some_running_requests_lose(bugs: tuple[KnownBug, ...]) -> None:
    ch = check(ran(cell("0.21.0"), {0: 1, 1: 1, 2: 1}), bugs)
    assert ch.status == "UNEXPECTED"
    assert f"r03: expected LOSS(1 at {PAUSE_AT}), got OK" in ch.message


def test_check_unexpected_loss_of_two(bugs: tuple[KnownBug, ...]) -> None:
    cr = ran(cell("0.21.0"), dict.fromkeys(range(RUNNING), 2))
    assert cr.outcome is Outcome.LOSS
    ch = check(cr, bugs)
    assert ch.status == "UNEXPECTED"
    assert f"r00: expected LOSS(1 at {PAUSE_AT}), got LOSS(2 at {PAUSE_AT})" in ch.message


def test_check_unexpected_when_a_late_request_loses(bugs: tuple[KnownBug, ...]) -> None:
    late = RUNNING  # the first request submitted during the pause
    cr = ran(cell("0.21.0"), {**ALL_RUNNING_LOSE_1, late: 1})
    assert cr.outcome is Outcome.LOSS
    ch = check(cr, bugs)
    assert ch.status == "UNEXPECTED"
    assert f"x{late:02d}: expected OK, got LOSS(1 at 0)" in ch.message


def test_check_unexpected_loss_on_a_fixed_version(bugs: tuple[KnownBug, ...]) -> None:
    cr = ran(cell("0.32.0"), ALL_RUNNING_LOSE_1)
    ch = check(cr, bugs)
    assert ch.status == "UNEXPECTED"
    assert ch.expected == Expectation(Outcome.OK)
    assert ch.message == f"expected OK, got {cr.summary}"


@pytest.mark.parametrize("c", [cell("0.21.0", async_on=False), cell("0.21.0", clear=False),
                               cell("0.21.0", mode="wait")])
def test_check_unexpected_loss_where_no_bug_applies(bugs: tuple[KnownBug, ...], c: Cell) -> None:
    assert check(ran(c, {0: 1}), bugs).status == "UNEXPECTED"


@pytest.mark.parametrize("outcome", [Outcome.UNSUPPORTED, Outcome.ERROR, Outcome.TIMEOUT, Outcome.BUILD_FAILED])
@pytest.mark.parametrize("version", ["0.21.0", "0.32.0"])
def test_check_not_run(bugs: tuple[KnownBug, ...], outcome: Outcome, version: str) -> None:
    c = cell(version)
    ch = check(infra_result(c, outcome, "the reason"), bugs)
    assert ch.status == "not run"
    assert ch.message == f"{outcome.value}: the reason"
    assert ch.expected == expectation(c, bugs)


# --------------------------------------------------------------------------- one fault per pause

SECOND_PAUSE = 18


def _two_pause_record(rid: str, lose_at: tuple[int, ...], *, dup_at: int | None = None,
                      second: dict[str, Any] | None = None) -> dict[str, Any]:
    """A request running at two keep + clear_cache pauses (after 6 and 18 tokens), losing one token at each
    index in ``lose_at`` (and, with ``dup_at``, repeating the two tokens before that index)."""
    ref = [500 + j for j in range(MAX_TOKENS + 8)]
    obs, j = [], 0
    while len(obs) < MAX_TOKENS:
        i = len(obs)
        j += lose_at.count(i) - (2 if i == dup_at else 0)
        obs.append(ref[j])
        j += 1
    rec = request_record(rid, obs, ref, running=True, pause_at=PAUSE_AT, max_tokens=MAX_TOKENS)
    rec["pauses"][0].update(engine_status="PREEMPTED", engine_preemptions=1)
    rec["pauses"].append({**rec["pauses"][0], "k": 1, "client_tokens": SECOND_PAUSE, "engine_preemptions": 2,
                          **(second or {})})
    return rec


def _two_pauses(records: list[dict[str, Any]]) -> CellResult:
    return judged_result(cell("0.21.0"), cell_verdict(stream_records(records)), stream_records(records), None, 1.0)


def test_one_loss_per_pause_is_as_expected(bugs: tuple[KnownBug, ...]) -> None:
    cr = _two_pauses([_two_pause_record(f"r{i}", (PAUSE_AT, SECOND_PAUSE)) for i in range(3)])
    assert [r.verdict.label for r in cr.requests] == [f"LOSS(1 at {PAUSE_AT}; 1 at {SECOND_PAUSE})"] * 3
    assert cr.summary == "LOSS(1; 1) in 3/3 requests (3/3 running at pause)"
    assert check(cr, bugs).status == "as expected"


def test_a_missing_loss_at_the_second_pause_is_unexpected(bugs: tuple[KnownBug, ...]) -> None:
    cr = _two_pauses([_two_pause_record("r0", (PAUSE_AT, SECOND_PAUSE)), _two_pause_record("r1", (PAUSE_AT,))])
    ch = check(cr, bugs)
    assert ch.status == "UNEXPECTED"
    assert ch.message.endswith(f"r1: expected LOSS(1 at {PAUSE_AT}; 1 at {SECOND_PAUSE}), got LOSS(1 at {PAUSE_AT})")


def test_a_duplicate_at_the_second_pause_is_unexpected(bugs: tuple[KnownBug, ...]) -> None:
    cr = _two_pauses([_two_pause_record("r0", (PAUSE_AT,), dup_at=SECOND_PAUSE)])
    assert cr.requests[0].verdict is not None
    assert cr.requests[0].verdict.label == f"LOSS(1 at {PAUSE_AT}); DUPLICATE(2 at {SECOND_PAUSE})"
    assert cr.summary == "LOSS(1); DUPLICATE(2) in 1/1 requests (1/1 running at pause)"
    assert check(cr, bugs).status == "UNEXPECTED"


def test_a_request_queued_at_the_second_pause_loses_only_at_the_first(bugs: tuple[KnownBug, ...]) -> None:
    # Not rescheduled since the first reset: the second reset preempts nothing, its count stays at 1.
    queued = _two_pause_record("r1", (PAUSE_AT,), second={"engine_preemptions": 1, "client_tokens": PAUSE_AT + 4})
    cr = _two_pauses([_two_pause_record("r0", (PAUSE_AT, SECOND_PAUSE)), queued])
    assert check(cr, bugs).status == "as expected"


def test_a_request_aborted_at_its_second_pause_can_lose_only_at_the_first(bugs: tuple[KnownBug, ...]) -> None:
    # The sleep scenario: sleep(level=1) keeps the requests (one loss each on 0.21.0), sleep(level=2) aborts them.
    aborted = _two_pause_record("r0", (PAUSE_AT,), second={"mode": "abort", "engine_status": None,
                                                           "engine_preemptions": None, "frozen": False})
    aborted.update(observed=aborted["observed"][:SECOND_PAUSE], finish_reason="abort")
    cr = _two_pauses([aborted])
    assert cr.requests[0].verdict is not None and cr.requests[0].verdict.label == f"LOSS(1 at {PAUSE_AT})"
    assert check(cr, bugs).status == "as expected", check(cr, bugs).message
    clean = _two_pause_record("r0", (), second={"mode": "abort", "engine_status": None, "engine_preemptions": None,
                                                "frozen": False})
    clean.update(observed=clean["observed"][:SECOND_PAUSE], finish_reason="abort")
    assert check(_two_pauses([clean]), bugs).status == "UNEXPECTED"  # the keep pause's loss is still expected


def test_two_pauses_at_one_index_may_lose_one_or_two_there(bugs: tuple[KnownBug, ...]) -> None:
    back_to_back = {"client_tokens": PAUSE_AT}
    for lose in ((PAUSE_AT,), (PAUSE_AT, PAUSE_AT)):
        cr = _two_pauses([_two_pause_record("r0", lose, second=back_to_back)])
        assert check(cr, bugs).status == "as expected", cr.summary
    three = _two_pauses([_two_pause_record("r0", (PAUSE_AT,) * 3, second=back_to_back)])
    assert check(three, bugs).status == "UNEXPECTED"


# --------------------------------------------------------------------------- CRASH rules

CRASH_TABLE = """
[[bug]]
id = "vllm#46066"
affected = ">=0.20, <0.23"
[[bug.cells]]
async_scheduling = true
mode = "keep"
expect = "CRASH"
"""


def test_a_rule_can_expect_a_crash(tmp_path: Path) -> None:
    bugs = _table(tmp_path, CRASH_TABLE)
    c = cell("0.21.0")
    assert expectation(c, bugs) == Expectation(Outcome.CRASH, None, "vllm#46066")
    crashed = CellResult(c, Outcome.CRASH, "AssertionError: assert x >= 0 at vllm/a.py:1:f",
                         reason="AssertionError: assert x >= 0 at vllm/a.py:1:f")
    assert check(crashed, bugs).status == "as expected"
    for other in (ran(c), ran(c, ALL_RUNNING_LOSE_1), infra_result(c, Outcome.ERROR, "engine died")):
        ch = check(other, bugs)
        assert ch.status == ("not run" if other.outcome is Outcome.ERROR else "UNEXPECTED"), ch
        if ch.status == "UNEXPECTED":
            assert ch.message == f"expected CRASH from vllm#46066, got {other.summary}"
    # A crash where the table expects OK is a finding, never "as expected".
    assert check(crashed, _table(tmp_path, "# none\n")).status == "UNEXPECTED"


def test_a_rule_can_expect_a_stall_and_a_timeout_never_meets_it(tmp_path: Path) -> None:
    bugs = _table(tmp_path, CRASH_TABLE.replace('"CRASH"', '"STALL"').replace("46066", "42043"))
    c = cell("0.21.0")
    assert expectation(c, bugs) == Expectation(Outcome.STALL, None, "vllm#42043")
    reason = "vLLM's scheduler never finished a request: run to completion: nothing scheduled or delivered"
    stalled = infra_result(c, Outcome.STALL, reason)
    assert check(stalled, bugs).status == "as expected"
    crashed = CellResult(c, Outcome.CRASH, "AssertionError at vllm/a.py:1:f")
    assert check(crashed, bugs).message == f"expected STALL from vllm#42043, got {crashed.summary}"
    # A wall-clock hang of a process is infrastructure: not run, never the stall the table expects.
    assert check(infra_result(c, Outcome.TIMEOUT, "no event in 120 s"), bugs).status == "not run"
    assert check(stalled, _table(tmp_path, "# none\n")).status == "UNEXPECTED"


def test_a_cell_without_a_pause_expects_a_whole_stream_fault_in_every_request(tmp_path: Path) -> None:
    # vllm#52461's logitsproc cell: no pause, no in-flight operation; every request's stream (what the plugin
    # processor was shown) diverges at 0.  Without the "every request" reading nothing would be running at a
    # pause, so the rule would expect OK of each request and call its own fault UNEXPECTED.
    bugs = _table(tmp_path, '[[bug]]\nid = "lp"\ntitle = "t"\naffected = ">=0.21.0"\n[[bug.cells]]\n'
                            'tier = "engine"\nscenario = "logitsproc"\nasync_scheduling = true\nexpect = "DIVERGED"\n')
    c = replace(Cell("0.32.0", "mp", True), scenario="logitsproc")

    def result(shown: list[list[int]]) -> CellResult:
        recs = [{**request_record(f"r{i}", s, [7, 8, 9], running=False, max_tokens=len(s), prompt=[i]),
                 "submit": "start"} for i, s in enumerate(shown)]
        return judged_result(c, cell_verdict(stream_records(recs)), stream_records(recs), None, 1.0)

    assert check(result([[-1], [-1]]), bugs).status == "as expected"
    assert check(result([[-1], [7, 8]]), bugs).status == "UNEXPECTED"  # one request shown the real ids
    assert check(result([[7, 8], [7]]), bugs).status == "UNEXPECTED"
