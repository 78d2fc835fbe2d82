"""The history view as a PNG heat-map (matplotlib, optional), and where each box landed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.errors import BadInput, ReproError
from harness.core.outcome_groups import COLORS, LEGEND, Category, category
from harness.verdicts.history.store import History
from harness.verdicts.history.table import history_caption
from harness.verdicts.history.view import HistoryView, show


class PlotUnavailable(ReproError):
    """matplotlib is not installed."""


@dataclass(frozen=True)
class PlotBox:
    row: str  # the row label
    config: str  # e.g. mp-async_on-keep-clear
    platform: str
    inject: tuple[str, ...]
    version: str
    outcome: str | None  # None: no run
    label: str
    color: str  # fill colour, "#rrggbb"
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 in PNG pixels, origin top-left, x1/y1 exclusive


@dataclass(frozen=True)
class HeatmapLayout:
    path: Path
    width: int
    height: int
    rows: tuple[str, ...]
    versions: tuple[str, ...]
    boxes: tuple[PlotBox, ...]
    runs: int
    excluded_injected_runs: int

    def box(self, row: str, version: str, platform: str | None = None) -> PlotBox:
        """The box of a row (its label, or a config such as ``mp-async_on-keep-clear``: upstream runs) and version."""
        found = [b for b in self.boxes if b.version == version and (platform is None or b.platform == platform)
                 and (b.row == row or (b.config == row and not b.inject))]
        if len(found) != 1:
            what = "no box" if not found else f"{len(found)} boxes (one per platform; pass platform=)"
            raise KeyError(f"{what} for row {row!r}, version {version!r}")
        return found[0]


def _matplotlib() -> tuple[Any, Any, Any]:
    # Imported here: matplotlib is an optional extra, and the Agg canvas is used directly (no pyplot, no global
    # backend switch), so plotting works without a display.
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError as exc:
        raise PlotUnavailable(
            f"history plot needs matplotlib, which is not installed ({exc}): pip install 'vllm-repro[plot]'"
        ) from exc
    return Figure, FigureCanvasAgg, (Patch, Rectangle)


def _text_color(fill: str) -> str:
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "white"


@dataclass(frozen=True)
class _Geometry:
    """Figure size and the heat-map's place in it, in inches (fixed: no layout engine moves the boxes)."""

    width: float
    height: float
    left: float
    bottom: float
    cell_w: float
    cell_h: float
    legend: tuple[Category, ...]
    legend_columns: int


def _geometry(view: HistoryView, labels: Sequence[str]) -> _Geometry:
    nrows, ncols = len(view.rows), len(view.versions)
    cell_w, cell_h = 1.25, 0.42  # inches
    left = 0.4 + 0.075 * max(len(t) for t in labels)
    width = max(left + ncols * cell_w + 0.3, 8.0)
    legend = tuple(c for c in Category if c is not Category.OTHER or any(
        category(s.latest.outcome) is c for s in view.series))
    ncol = 3 if width < 9 else 4
    top, bottom = 1.1, 0.6 + 0.25 * -(-len(legend) // ncol)
    return _Geometry(width, top + nrows * cell_h + bottom, left, bottom, cell_w, cell_h, legend, ncol)


def _heatmap_axes(fig: Any, view: HistoryView, labels: Sequence[str], g: _Geometry) -> Any:
    nrows, ncols = len(view.rows), len(view.versions)
    # Fixed axes geometry (no layout engine): the boxes computed below are where savefig puts them.
    ax = fig.add_axes((g.left / g.width, g.bottom / g.height, ncols * g.cell_w / g.width,
                       nrows * g.cell_h / g.height))
    ax.set_xlim(0, ncols)
    ax.set_ylim(nrows, 0)
    ax.set_xticks([c + 0.5 for c in range(ncols)], list(view.versions), fontsize=9)
    ax.set_yticks([r + 0.5 for r in range(nrows)], list(labels), fontsize=9)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    return ax


def _draw_boxes(ax: Any, view: HistoryView, rectangle: Any) -> list[tuple[int, int, str | None, str, str]]:
    # One coloured box per (row, version) with the latest label; (row, column, outcome, text, fill) of each.
    drawn: list[tuple[int, int, str | None, str, str]] = []
    for r, row in enumerate(view.rows):
        for c, version in enumerate(view.versions):
            s = view.get(row, version)
            outcome = s.latest.outcome if s else None
            fill = COLORS[category(outcome)]
            text = s.latest.label if s else "—"
            ax.add_patch(rectangle((c, r), 1, 1, facecolor=fill, edgecolor="white", linewidth=2))
            ax.text(c + 0.5, r + 0.5, text if len(text) <= 16 else text[:15] + "…", ha="center", va="center",
                    fontsize=8, color=_text_color(fill) if s else "#909090")
            drawn.append((r, c, outcome, text, fill))
    return drawn


def _titles_and_legend(fig: Any, view: HistoryView, g: _Geometry, patch: Any) -> None:
    title = "vllm-repro history: latest outcome per cell and vLLM version"
    sub = history_caption(view)
    fig.text(0.5, 1 - 0.25 / g.height, title, ha="center", va="center", fontsize=11, weight="bold")
    fig.text(0.5, 1 - 0.5 / g.height, sub if len(sub) < 160 else sub[:157] + "…", ha="center", va="center",
             fontsize=7, color="#555555")
    fig.legend(handles=[patch(facecolor=COLORS[c], edgecolor="#888888", label=LEGEND[c]) for c in g.legend],
               loc="lower center", ncol=g.legend_columns, frameon=False, fontsize=8,
               bbox_to_anchor=(0.5, 0.1 / g.height))


def save_png(fig: Any, out: Path, dpi: int, what: str = "the plot") -> None:
    """Write ``fig`` to ``out`` whole or not at all (a temporary file renamed into place)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BadInput(f"cannot write {what} to {out}: {exc.strerror}") from exc


def plot(
    history: History,
    out: Path,
    *,
    include_injected: bool = False,
    platform: str | None = None,
    cells: Sequence[str] = (),
    versions: Sequence[str] = (),
    hide_unsupported: bool = False,
    dpi: int = 100,
) -> HeatmapLayout:
    """Write a PNG heat-map of cell configs x versions coloured by the latest run's outcome.

    OK green, token faults red, UNSUPPORTED grey, ERROR/TIMEOUT/BUILD-FAILED amber, FLAKY purple, any other
    outcome blue, no run white.  Runs with fault injection are left out unless ``include_injected``, and then
    get rows of their own.  Returns where each box landed in the PNG.
    """
    view = show(history, include_injected=include_injected, platform=platform, cells=cells, versions=versions,
                hide_unsupported=hide_unsupported)
    if not view.series:
        why = f" ({view.excluded_injected_runs} run(s) with fault injection left out)" \
            if view.excluded_injected_runs else ""
        raise BadInput(f"nothing to plot: no run in {history.path} matches the selection{why}")
    Figure, FigureCanvasAgg, (Patch, Rectangle) = _matplotlib()
    labels = [view.label(r) for r in view.rows]
    g = _geometry(view, labels)
    fig = Figure(figsize=(g.width, g.height), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    ax = _heatmap_axes(fig, view, labels, g)
    drawn = _draw_boxes(ax, view, Rectangle)
    _titles_and_legend(fig, view, g, Patch)
    canvas.draw()
    w_px, h_px = canvas.get_width_height()
    boxes = []
    for r, c, outcome, text, fill in drawn:
        (x0, y0), (x1, y1) = ax.transData.transform([(c, r + 1), (c + 1, r)])
        row = view.rows[r]
        boxes.append(PlotBox(labels[r], row.config, row.platform, row.inject, view.versions[c], outcome, text, fill,
                             (round(x0), round(h_px - y1), round(x1), round(h_px - y0))))
    save_png(fig, out, dpi)
    return HeatmapLayout(out, w_px, h_px, tuple(labels), view.versions, tuple(boxes), view.runs,
                         view.excluded_injected_runs)
