"""The history view as a terminal table with a caption."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.core.outcome_groups import style
from harness.verdicts.history.view import HistoryView, Observation


def _streaks(observations: Sequence[Observation], keep: int = 6) -> str:
    # Run-length encoded labels, oldest first: "OK ×3 → LOSS(1) ×2".
    parts: list[list[Any]] = []
    for o in observations:
        if parts and parts[-1][0] == o.label:
            parts[-1][1] += 1
        else:
            parts.append([o.label, 1])
    text = [f"{label} ×{n}" if n > 1 else label for label, n in parts]
    if len(text) > keep:
        text = ["…", *text[-keep:]]
    return " → ".join(text)


def history_table(view: HistoryView) -> Table:
    """A rich table: one row per (cell config, version) with the latest outcome and the outcomes over time."""
    table = Table(title=f"vllm-repro history: {view.path}", show_lines=False)
    for name, kw in (("cell", {"no_wrap": True}), ("vLLM", {"no_wrap": True}), ("latest", {"no_wrap": True}),
                     ("since", {"no_wrap": True}), ("runs", {"justify": "right"}),
                     ("outcomes, old → new", {"min_width": 12})):
        table.add_column(name, **kw)
    for s in view.series:
        last = s.latest
        since = s.since.created[:16].replace("T", " ")
        table.add_row(Text(view.label(s.row), style="magenta" if s.row.inject else ""), Text(s.version),
                      Text(last.label, style=style(last.outcome)), Text(since),
                      Text(str(len(s.observations))), Text(_streaks(s.observations)))
    return table


def history_caption(view: HistoryView) -> str:
    """What the view covers, and how fault injection is treated."""
    text = f"{view.runs} run(s), {len(view.rows)} cell config(s), {len(view.versions)} version(s)."
    if view.injected_runs:
        text += (f" {view.injected_runs} run(s) used fault injection: their rows are marked [inject …]; the bug "
                 "was re-introduced on purpose, so they say nothing about upstream vLLM.")
    if view.excluded_injected_runs:
        text += f" {view.excluded_injected_runs} run(s) with fault injection left out."
    if view.hidden_unsupported_rows:
        text += f" {view.hidden_unsupported_rows} cell config(s) UNSUPPORTED on every version left out."
    return text


def render_history(view: HistoryView, console: Console) -> None:
    """Print the history table and its caption."""
    if not view.series:
        console.print(f"no runs in {view.path} match the selection")
        return
    console.print(history_table(view))
    console.print(Text(history_caption(view)))

