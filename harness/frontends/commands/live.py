"""What a person watches while a matrix runs on a terminal: one live board instead of a scroll of lines.

Environments and engines with their state and elapsed time, cells done of all, faults so far and an estimate
of the time left; UNSUPPORTED cells folded into one line per reason (the default CPU matrix has 96 of them).
When stderr is not a terminal (CI logs) the plain, stable lines of :class:`MatrixProgress` are printed instead.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.core.events import EngineEvent, SchedEvent
from harness.core.oracle import Outcome
from harness.plan.matrix import MatrixPlan
from harness.run.context import Progress

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

STATE_STYLE = {"queued": "dim", "starting": "cyan", "running": "bold cyan", "done": "green", "failed": "magenta"}


@dataclass
class EngineRow:
    id: str
    cells: int
    state: str = "queued"
    done: int = 0
    faults: int = 0
    t0: float | None = None
    t1: float | None = None

    def elapsed(self, now: float) -> str:
        if self.t0 is None:
            return ""
        return f"{(self.t1 or now) - self.t0:.0f}s"


@dataclass
class LiveBoard:
    """A live view of one matrix run, fed by its progress hook."""

    console: Console
    plan: MatrixPlan
    n_cells: int
    done: int = 0
    jobs: int = 1
    rows: dict[str, EngineRow] = field(default_factory=dict)
    envs: dict[str, str] = field(default_factory=dict)
    folded: Counter[str] = field(default_factory=Counter)
    faults: int = 0
    infra: int = 0
    t_start: float = field(default_factory=time.monotonic)
    live: Live | None = None

    def __post_init__(self) -> None:
        for key, cells in self.plan.engines:
            self.rows[key.id] = EngineRow(key.id, len(cells))
            self.envs.setdefault(key.version, "waiting")

    def __enter__(self) -> LiveBoard:
        from rich.live import Live

        # get_renderable: each refresh renders anew, so elapsed times tick between progress reports.
        self.live = Live(console=self.console, refresh_per_second=4, transient=False, get_renderable=self.render)
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.__exit__(*exc)

    def __call__(self, p: Progress) -> None:
        self.take(p)
        if self.live is not None:
            self.live.refresh()

    def take(self, p: Progress) -> None:
        """Fold one progress report into the board's state."""
        now = time.monotonic()
        row = self.rows.get(p.engine.id) if p.engine is not None else None
        if p.kind == "env":
            self._env(p.message)
        elif p.kind == "engine-start" and row is not None:
            row.state, row.t0 = "starting", now
            self.envs[p.engine.version] = "ready"  # type: ignore[union-attr]
        elif p.kind == "event" and row is not None and isinstance(p.event, EngineEvent | SchedEvent):
            row.state = "running"
        elif p.kind == "cell" and p.cell is not None:
            self._cell(p, row, now)

    def _env(self, message: str) -> None:
        for version in self.envs:
            if f"=={version} env" in message and self.envs[version] == "waiting":
                self.envs[version] = "building"

    def _cell(self, p: Progress, row: EngineRow | None, now: float) -> None:
        cell = p.cell
        assert cell is not None
        self.done += 1
        if cell.outcome is Outcome.UNSUPPORTED and row is None:
            self.folded[cell.reason or cell.summary] += 1
            return
        self.faults += cell.outcome.is_finding or cell.outcome is Outcome.FLAKY
        self.infra += cell.outcome in (Outcome.ERROR, Outcome.TIMEOUT, Outcome.BUILD_FAILED)
        if cell.outcome is Outcome.BUILD_FAILED:
            self.envs[cell.cell.version] = "failed"
        if row is not None:
            row.done += 1
            row.faults += cell.outcome.is_finding
            if row.done >= row.cells:
                row.state = "failed" if cell.outcome in (Outcome.ERROR, Outcome.TIMEOUT) else "done"
                row.t1 = now

    def eta(self, now: float) -> str:
        """Mean engine time so far x engines left / jobs; "?" until an engine has finished."""
        spans = [r.t1 - r.t0 for r in self.rows.values() if r.t0 is not None and r.t1 is not None]
        left = sum(1 for r in self.rows.values() if r.t1 is None)
        if not spans:
            return "?"
        return f"~{sum(spans) / len(spans) * -(-left // max(1, self.jobs)):.0f}s" if left else "0s"

    def render(self) -> RenderableType:
        from rich.console import Group
        from rich.table import Table

        now = time.monotonic()
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for col in ("engine", "state", "cells", "faults", "time"):
            table.add_column(col)
        shown = [r for r in self.rows.values() if r.state != "queued"]
        queued = len(self.rows) - len(shown)
        for r in shown:
            table.add_row(r.id, f"[{STATE_STYLE[r.state]}]{r.state}[/]", f"{r.done}/{r.cells}",
                          str(r.faults or ""), r.elapsed(now))
        lines: list[RenderableType] = [f"environments: {', '.join(f'{v} {s}' for v, s in self.envs.items()) or 'none'}",
                                    table]
        if queued:
            lines.append(f"[dim]{queued} engine(s) queued[/]")
        lines += [f"[yellow]{n} cell(s) UNSUPPORTED[/]: {why}" for why, n in self.folded.items()]
        lines.append(f"[bold]{self.done}/{self.n_cells}[/] cells, {self.faults} token fault(s), {self.infra} "
                     f"ERROR/TIMEOUT/BUILD-FAILED, {now - self.t_start:.0f}s elapsed, left {self.eta(now)}")
        return Group(*lines)
