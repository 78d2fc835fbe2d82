"""How outcomes are grouped and coloured, the same in every view (history table and plot, comparisons).

Outcomes are taken as strings: a history or report written by a newer vllm-repro may hold an outcome this one
does not know, which is shown as "other", never as OK.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from harness.core.oracle import Outcome

TOKEN_FAULTS = tuple(o.value for o in Outcome if o.is_finding)  # CRASH and STALL too: findings about vLLM
INFRA_FAILURES = tuple(o.value for o in Outcome if o.is_infra and o is not Outcome.UNSUPPORTED)
FLAKY = Outcome.FLAKY.value


def infra_failed(outcomes: Iterable[str]) -> bool:
    """The exit rule of every command that runs cells (``matrix``, ``frameworks check``): a cell that is ERROR,
    TIMEOUT or BUILD-FAILED got no verdict, so the run failed (exit 1), whatever the other cells say."""
    return any(o in INFRA_FAILURES for o in outcomes)


class Category(enum.Enum):
    OK = "OK"
    AMBIGUOUS = "ambiguous"
    TOKEN_FAULT = "token fault"
    UNSUPPORTED = "unsupported"
    INFRA = "infrastructure failure"
    FLAKY = "flaky"
    OTHER = "other outcome"
    NOT_RUN = "not run"


COLORS = {
    Category.OK: "#2ca02c",
    Category.AMBIGUOUS: "#f0e442",
    Category.TOKEN_FAULT: "#d62728",
    Category.UNSUPPORTED: "#a0a0a0",
    Category.INFRA: "#ffa000",
    Category.FLAKY: "#8e44ad",
    Category.OTHER: "#1f77b4",
    Category.NOT_RUN: "#ffffff",
}
LEGEND = {
    Category.OK: "OK",
    Category.AMBIGUOUS: "AMBIGUOUS (the streams cannot tell)",
    Category.TOKEN_FAULT: "finding (LOSS, DUPLICATE, …, CRASH, STALL)",
    Category.UNSUPPORTED: "UNSUPPORTED",
    Category.INFRA: "ERROR / TIMEOUT / BUILD-FAILED",
    Category.FLAKY: "FLAKY (varies across --repeat)",
    Category.OTHER: "other outcome",
    Category.NOT_RUN: "no run",
}
# rich styles of the terminal views.
STYLES = {
    Category.OK: "green",
    Category.AMBIGUOUS: "yellow",
    Category.TOKEN_FAULT: "bold red",
    Category.UNSUPPORTED: "dim",
    Category.INFRA: "yellow",
    Category.FLAKY: "magenta",
    Category.OTHER: "cyan",
    Category.NOT_RUN: "dim",
}


def category(outcome: str | None) -> Category:
    """How an outcome string is coloured; unknown strings (a newer vllm-repro's) are OTHER, never OK."""
    if outcome is None:
        return Category.NOT_RUN
    if outcome == Outcome.OK.value:
        return Category.OK
    if outcome == Outcome.AMBIGUOUS.value:
        return Category.AMBIGUOUS
    if outcome in TOKEN_FAULTS:
        return Category.TOKEN_FAULT
    if outcome == Outcome.UNSUPPORTED.value:
        return Category.UNSUPPORTED
    if outcome in INFRA_FAILURES:
        return Category.INFRA
    if outcome == FLAKY:
        return Category.FLAKY
    return Category.OTHER


def style(outcome: str | None) -> str:
    """The rich style of an outcome string."""
    return STYLES[category(outcome)]
