"""Draw the bug windows chart (harness.verdicts.windows.Chart) as a PNG; matplotlib is the optional ``plot`` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.core.errors import BadInput
from harness.core.outcome_groups import COLORS, LEGEND, Category
from harness.verdicts.history.plot import PlotUnavailable, save_png
from harness.verdicts.windows import Box, Chart

CELL_W, CELL_H = 0.42, 0.34  # inches per box
LABEL_W, TOP, BOTTOM = 6.3, 0.9, 1.25


def _matplotlib() -> tuple[Any, Any, Any, Any]:
    # Imported here, as history plot does: no pyplot and no global backend switch, so it runs headless.
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError as exc:
        raise PlotUnavailable(
            f"windows needs matplotlib, which is not installed ({exc}): pip install 'vllm-repro[plot]'") from exc
    return Figure, FigureCanvasAgg, Patch, Rectangle


def _text(box: Box) -> str:
    if box.outcome is None:
        return ""
    short = {"UNSUPPORTED": "n/a", "AMBIGUOUS": "?", "DIVERGED": "DIV", "DUPLICATE": "DUP", "TIMEOUT": "T/O",
             "BUILD-FAILED": "BF", "TRUNCATED": "TRN"}.get(box.outcome, box.outcome)
    return short + ("*" if box.mixed else "")


def _ink(fill: str) -> str:
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "white"


def _draw_row(ax: Any, chart: Chart, r: int, rectangle: Any) -> None:
    y = len(chart.rows) - 1 - r
    for c, box in enumerate(chart.boxes[r]):
        fill = COLORS[box.category]
        ax.add_patch(rectangle((c, y), 1, 1, facecolor=fill, edgecolor="#d0d0d0", linewidth=0.5))
        if box.in_window:  # the known-bug table's window: a dark frame
            ax.add_patch(rectangle((c + 0.06, y + 0.06), 0.88, 0.88, fill=False, edgecolor="#202020",
                                   linewidth=1.1, linestyle=(0, (2, 1))))
        if text := _text(box):
            ax.text(c + 0.5, y + 0.5, text, ha="center", va="center", fontsize=5.5, color=_ink(fill))
    col = {v: i for i, v in enumerate(chart.releases)}
    for versions, colour in ((chart.first_bad[r], "#000000"), (chart.first_fixed[r], "#0050c8")):
        for v in versions:  # a bisected edge: a thick bar on the left side of the release it names
            ax.plot([col[v], col[v]], [y - 0.05, y + 1.05], color=colour, linewidth=3.2, solid_capstyle="butt")


def draw(chart: Chart, out: Path, dpi: int = 110) -> Path:
    """Write ``chart`` as a PNG at ``out``; BadInput when there is nothing to draw or it cannot be written."""
    if not chart.rows or not chart.releases:
        raise BadInput("nothing to draw: no known-bug row or no measured release")
    figure, canvas_cls, patch, rectangle = _matplotlib()
    n_rows, n_cols = len(chart.rows), len(chart.releases)
    width, height = LABEL_W + n_cols * CELL_W + 0.3, TOP + n_rows * CELL_H + BOTTOM
    fig = figure(figsize=(width, height), dpi=dpi)
    canvas_cls(fig)
    ax = fig.add_axes((LABEL_W / width, BOTTOM / height, n_cols * CELL_W / width, n_rows * CELL_H / height))
    for r in range(n_rows):
        _draw_row(ax, chart, r, rectangle)
    ax.set_xlim(0, n_cols)
    ax.set_ylim(0, n_rows)
    ax.set_xticks([c + 0.5 for c in range(n_cols)], list(chart.releases), rotation=90, fontsize=6.5)
    ax.set_yticks([n_rows - 1 - r + 0.5 for r in range(n_rows)], [row.label for row in chart.rows], fontsize=6.5)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    fig.suptitle(f"Known AsyncScheduler bugs x vLLM releases ({chart.reports} committed reports, "
                 f"{chart.bisects} bisect logs)", fontsize=9, x=0.02, ha="left", y=1 - 0.25 / height)
    fig.text(0.02, 1 - 0.55 / height, "dashed frame: the known-bug table's window; black bar: bisected first bad; "
             "blue bar: bisected first fixed; * both a fault and OK measured", fontsize=6.5, ha="left")
    shown = [Category.OK, Category.TOKEN_FAULT, Category.AMBIGUOUS, Category.UNSUPPORTED, Category.INFRA,
             Category.NOT_RUN]
    fig.legend(handles=[patch(facecolor=COLORS[c], edgecolor="#909090", label=LEGEND[c]) for c in shown],
               loc="lower left", ncol=3, fontsize=6.5, frameon=False, bbox_to_anchor=(0.01, 0.0))
    save_png(fig, out, dpi, "the chart")
    return out
