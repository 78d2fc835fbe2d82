"""The report as a terminal table, with the workaround verdict paragraph."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.core.oracle import Outcome
from harness.verdicts.report.cell_text import (
    CellsLike,
    cells_of,
    detail,
    effective,
    expectation_text,
    injection_banner,
    sorted_cells,
)
from harness.verdicts.report.workaround_text import ISSUE, paragraph_parts
from harness.verdicts.results import CellResult, Results

OUTCOME_STYLES = {
    Outcome.OK: "green",
    Outcome.AMBIGUOUS: "yellow",
    Outcome.LOSS: "bold red",
    Outcome.DUPLICATE: "bold red",
    Outcome.DIVERGED: "bold red",
    Outcome.TRUNCATED: "red",
    Outcome.CRASH: "bold red",
    Outcome.STALL: "bold red",
    Outcome.UNSUPPORTED: "dim yellow",
    Outcome.ERROR: "magenta",
    Outcome.TIMEOUT: "magenta",
    Outcome.BUILD_FAILED: "magenta",
    Outcome.FLAKY: "bold magenta",
}


def terminal_table(results_or_cells: CellsLike) -> Table:
    """A rich table of the cells with the outcome coloured (OK green, token faults red, infra magenta)."""
    table = Table(title=f"vllm-repro: {ISSUE}", show_lines=False)
    for name, kw in (("cell", {"no_wrap": True}), ("outcome", {"no_wrap": True}), ("summary / reason", {}),
                     ("known bugs", {}), ("effective", {"no_wrap": True}), ("time", {"justify": "right"})):
        table.add_column(name, **kw)
    cells = sorted_cells(cells_of(results_or_cells))
    # Cells the platform cannot run (no engine was asked) fold into one row per
    # reason; the Markdown and JUnit reports still list each of them.
    folded: dict[str, list[CellResult]] = {}
    for cr in cells:
        if cr.outcome is Outcome.UNSUPPORTED and cr.engine is None:
            folded.setdefault(cr.reason or cr.summary, []).append(cr)
    for cr in cells:
        if cr.outcome is Outcome.UNSUPPORTED and cr.engine is None:
            continue
        style = OUTCOME_STYLES.get(cr.outcome, "")
        eff_async, eff_exec = effective(cr)
        eff = f"async {eff_async}, {eff_exec}" if eff_async or eff_exec else ""
        duration = f"{cr.duration_s:.1f}s" if cr.duration_s is not None else ""
        # Text objects keep "[...]" in reasons from being read as rich markup.
        exp = expectation_text(cr)
        table.add_row(Text(cr.id), Text(cr.outcome.value, style=style), Text(detail(cr)),
                      Text(exp, style="bold red" if exp.startswith("UNEXPECTED") else "dim"), Text(eff),
                      Text(duration))
    for reason, group in folded.items():
        executors = ",".join(dict.fromkeys(c.cell.executor for c in group))
        label = f"{len(group)} cells ({executors})"
        table.add_row(Text(label), Text("UNSUPPORTED", style=OUTCOME_STYLES[Outcome.UNSUPPORTED]), Text(reason),
                      Text(""), Text(""), Text(""))
    return table


def render_terminal(results: CellsLike, console: Console) -> None:
    """Print the cell table and the workaround verdict paragraph."""
    banner = injection_banner(results) if isinstance(results, Results) else None
    if banner:
        console.print(Text(banner, style="bold red"))
    console.print(terminal_table(results))
    paragraph = Text()
    for text, style in paragraph_parts(results):
        paragraph.append(text, style=style or "")
    console.print(paragraph)


