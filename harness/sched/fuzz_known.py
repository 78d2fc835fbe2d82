"""Known findings of the scheduler fuzzer, harness side: which known-bug rows cover a release, and what came back.

The fuzzer (``repro/sched/fuzz.py``) is told, per version, the scheduler-tier rows of the known-bug table
(``harness/verdicts/known_bugs.toml``) that cover that release, for each scenario whose shape it can meet
(:data:`repro.sched.known.SCENARIOS`), so the window is the table's, the one place windows are kept.  A
failing example that fits one of them (and whose control, the trigger taken out, passes) comes back as a
known finding, once per row, and the run goes on; anything else is new (``harness.run.sched_fuzz.Falsifying``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.cell import Cell
from harness.verdicts.known_bugs import KnownBug, expectation, load_known_bugs
from repro.core.wire import FuzzKnown
from repro.sched.known import SCENARIOS


def known_rows(version: str, bugs: tuple[KnownBug, ...] | None = None) -> tuple[FuzzKnown, ...]:
    """The known-bug rows covering ``version`` on the scheduler tier, for every scenario the fuzzer can meet, with
    the async scheduler and without (a row may cover one only)."""
    table = load_known_bugs() if bugs is None else bugs
    out = []
    for scenario in SCENARIOS:
        for async_on in (True, False):
            exp = expectation(Cell(version=version, async_on=async_on, scenario=scenario, tier="scheduler"), table)
            if exp.bug is not None:
                out.append(FuzzKnown(scenario, async_on, exp.bug, exp.label))
    return tuple(out)


@dataclass(frozen=True)
class KnownFinding:
    """A known-bug row the run met: reported once, with how many examples hit it and the first one, minimised."""

    bug: str
    scenario: str
    expect: str  # the row's outcome on its own scenario
    failure: str  # what the state machine saw in the first example
    first_example: int
    examples: int
    script: dict[str, Any] = field(default_factory=dict)  # the ``ops`` params (``vllm-repro plan``)
    ops: int = 0


def known_findings(raw: Sequence[Mapping[str, Any]] | None) -> tuple[KnownFinding, ...]:
    """The ``known`` list of a ``fuzz`` event (absent: none)."""
    return tuple(KnownFinding(str(k["bug"]), str(k["scenario"]), str(k.get("expect", "")), str(k.get("failure", "")),
                              int(k.get("first_example", 0)), int(k.get("examples", 1)), dict(k.get("script") or {}),
                              int(k.get("ops", 0)))
                 for k in raw or ())


def known_document(k: KnownFinding, version: str) -> dict[str, Any]:
    """A known finding as JSON (fuzz.json), its script a plan ``vllm-repro plan`` replays."""
    return {"bug": k.bug, "scenario": k.scenario, "expect": k.expect, "failure": k.failure,
            "first_example": k.first_example, "examples": k.examples, "ops": k.ops,
            "plan": {"tier": "scheduler", "script": k.script, "found": {"version": version, "known": k.bug}}}
