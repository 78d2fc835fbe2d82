"""Faults the harness can inject on purpose (``--inject``), and the sensitivity self-test they feed.

``vllm#42043`` re-introduces the #42043 behaviour (keep pause + clear_cache
marks every frozen request to discard a frame that is not in flight) into a
vLLM where PR #42117 fixed it; the engine-side patch is ``repro/patches/inject.py``.
A nightly runs it to prove the oracle still sees the bug after upstream code
has moved on: every cell the injected bug covers must come out exactly as the
known-bug table says it does on an affected release.

``hang#pause`` makes ``pause_generation`` never return; it exists for the
reliability tests (a hang must become TIMEOUT, the run goes on).

``crash#reset`` makes vLLM's own AsyncScheduler assert fail in the engine core
after a keep pause with clear_cache: the self-test of the CRASH outcome (the
engine core died of an exception raised in vLLM's code, which must be CRASH,
never ERROR).  It is no bug of the table; what its cells must show is
:data:`INJECTED_ONLY`.
"""

from __future__ import annotations

from dataclasses import replace

from packaging.specifiers import SpecifierSet

from harness.core.errors import BadInput, bad_choice
from harness.core.oracle import Outcome
from harness.core.pattern import pattern_from_mapping
from harness.verdicts.known_bugs import KnownBug, Rule, annotate, load_known_bugs
from harness.verdicts.results import CellResult, Results

FAULTS: dict[str, str] = {
    "vllm#42043": "re-introduce vLLM #42043: a keep pause with clear_cache discards one output frame per "
                  "running request (the sensitivity self-test)",
    "hang#pause": "make pause_generation never return (reliability tests: a hang must become TIMEOUT)",
    "crash#reset": "make vLLM's own AsyncScheduler assert fail in the engine core after a keep pause with "
                   "clear_cache (the CRASH self-test: the cell must be CRASH, not ERROR)",
}
INJECTED_SUFFIX = " (injected)"
_KEEP_CLEAR_ASYNC = {"tier": "engine", "async_scheduling": True, "mode": "keep", "clear_cache": True}
# Injected faults that are no vLLM bug, with what their cells must show.
INJECTED_ONLY: dict[str, KnownBug] = {
    "crash#reset": KnownBug(
        "crash#reset", "vLLM's AsyncScheduler placeholder assert fails after a forced preemption (injected)", "",
        "", SpecifierSet(), (Rule(pattern_from_mapping(_KEEP_CLEAR_ASYNC, "crash#reset"), Outcome.CRASH),)),
}


def parse_inject(values: list[str] | None) -> tuple[str, ...]:
    """``--inject`` values (repeatable, comma-separated) as validated fault ids."""
    out: list[str] = []
    for raw in values or []:
        for item in (p.strip() for p in raw.split(",")):
            if not item:
                raise BadInput(f"empty --inject value in {raw!r}; valid faults: {', '.join(FAULTS)}")
            if item not in FAULTS:
                raise bad_choice("fault to inject", item, tuple(FAULTS))
            out.append(item)
    return tuple(dict.fromkeys(out))


def bugs_with_injection(inject: tuple[str, ...], bugs: tuple[KnownBug, ...] | None = None) -> tuple[KnownBug, ...]:
    """The known-bug table plus, for every injected bug, that bug on every version (checked first)."""
    table = bugs if bugs is not None else load_known_bugs()
    injected = [replace(b, id=b.id + INJECTED_SUFFIX, affected=SpecifierSet())
                for b in (*INJECTED_ONLY.values(), *table) if b.id in inject]
    return (*injected, *table)


def annotate_injected(result: CellResult, inject: tuple[str, ...], bugs: tuple[KnownBug, ...]) -> CellResult:
    """``result`` judged against the table with ``inject`` applied (see :func:`bugs_with_injection`)."""
    return annotate(result, bugs_with_injection(inject, bugs))


def sensitivity_failures(results: Results) -> list[str]:
    """Cells an injected bug covers that did not show it exactly (empty: the harness still sees the bug).

    A run that injected a bug but has no cell that bug covers fails too:
    the self-test would otherwise pass vacuously.  Cells the platform cannot
    run at all (UNSUPPORTED before any engine started) are not counted.
    """
    inject = tuple(f for f in (results.meta.get("inject") or []) if f != "hang#pause")
    if not inject:
        return []
    failures: list[str] = []
    covered = 0
    for cr in results.cells:
        exp = cr.expectation
        if exp is None or not str(exp.bug or "").endswith(INJECTED_SUFFIX):
            continue
        if cr.outcome is Outcome.UNSUPPORTED and cr.engine is None:
            # Planned out before any engine started (e.g. Ray on the CPU platform): not a cell of
            # this run.  An engine that could not apply the injection reports itself, so it counts.
            continue
        covered += 1
        if exp.status != "as expected":
            failures.append(f"{cr.id}: {exp.message or cr.summary}")
    if covered == 0:
        failures.append(f"no cell of this run is covered by the injected bug(s) {', '.join(inject)} "
                        "(select async on, mode keep, clear_cache true)")
    return failures
