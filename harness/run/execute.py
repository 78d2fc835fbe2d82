"""Run a planned matrix: one loop for every backend; each cell result is logged as soon as it is known.

The backend (``harness.run.local.LocalBackend`` here, ``harness.run.cluster.RayBackend``
on a Ray cluster) starts the engines; this loop judges every result against the
known-bug table, appends it to the results log, reports progress, and builds
the run's meta.
"""

from __future__ import annotations

import platform as _platform
import threading
from datetime import datetime
from typing import Any

from harness import __version__
from harness.core.oracle import Outcome
from harness.plan.faults import bugs_with_injection
from harness.plan.matrix import MatrixPlan
from harness.run.context import Backend, Progress, ProgressHook, RunContext
from harness.run.local import LocalBackend
from harness.run.spec import RunConfig
from harness.verdicts.known_bugs import annotate
from harness.verdicts.results import CellResult, Results, ResultsLog, infra_result

__all__ = ["CellRecorder", "Progress", "ProgressHook", "execute_plan", "run_meta", "setup_meta"]


def execute_plan(plan: MatrixPlan, ctx: RunContext, backend: Backend | None = None) -> Results:
    """Run every engine of ``plan`` on ``backend`` (default: this machine); every cell gets one result."""
    if ctx.log is None:
        raise ValueError("execute_plan needs a results log in its RunContext (ctx.log)")
    started = datetime.now().astimezone()
    offset = ctx.log.size()
    record = CellRecorder(plan, ctx.cfg, ctx.log, ctx.say)
    report = (backend or LocalBackend()).run(plan.engines, ctx, record)
    meta = run_meta(ctx.cfg, started, list(ctx.argv), report.envs, report.engine_starts)
    if ctx.capacity.jobs > 1 or backend is not None:
        ctx.log.reorder_since(offset, record.sequential())
    return record.results({**meta, **report.meta})


class CellRecorder:
    """Where a run's cell results go: judged against the known-bug table, logged at once, kept once.

    Records the plan's UNSUPPORTED cells on creation.  Every backend records through it.
    """

    def __init__(self, plan: MatrixPlan, cfg: RunConfig, log: ResultsLog, say: ProgressHook) -> None:
        self.plan, self.log, self.say = plan, log, say
        self.lock = threading.RLock()
        # With --inject the injected bug covers every version: its cells must show it (the self-test).
        self.bugs = bugs_with_injection(cfg.inject)
        self.done: dict[str, CellResult] = {}
        for cell, reason in plan.unsupported:
            self(infra_result(cell, Outcome.UNSUPPORTED, reason))

    def __call__(self, res: CellResult) -> None:
        with self.lock:  # engines side by side report from their own threads
            if res.id in self.done:  # a Ray task's result can arrive after its ERROR was recorded
                return
            res = annotate(res, self.bugs)
            self.log.append(res)
            self.done[res.id] = res
            earlier = ", ".join(a.label or a.outcome for a in res.attempts[:-1])
            retried = f" (attempt {len(res.attempts)}; earlier: {earlier})" if res.attempts else ""
            self.say(Progress("cell", f"{res.id}: {res.summary}{retried}", res.cell.engine, res))

    def sequential(self) -> list[CellResult]:
        """Every recorded cell in the order a one-engine-at-a-time run records them: unsupported, then by engine."""
        order = [c for c, _ in self.plan.unsupported] + [c for _, cs in self.plan.engines for c in cs]
        return [self.done[c.id] for c in order if c.id in self.done]

    def results(self, meta: dict[str, Any]) -> Results:
        """Every recorded cell, in plan order."""
        order = {c.id: i for i, c in enumerate(self.plan.cells)}
        return Results(tuple(sorted(self.done.values(), key=lambda r: order.get(r.id, 0))), meta)


def run_meta(
    cfg: RunConfig, started: datetime, argv: list[str] | None, envs: dict[str, Any], engine_starts: int
) -> dict[str, Any]:
    """The ``meta`` of a run's Results (what ran where, with which settings)."""
    return {
        "tool_version": __version__,
        "created": started.isoformat(timespec="seconds"),
        "finished": datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": cfg.platform,
        "host": {"machine": _platform.machine(), "node": _platform.node(), "python": _platform.python_version()},
        "argv": argv or [],
        "envs": envs,
        "engine_starts": engine_starts,
        "inject": list(cfg.inject),
        "repeat": cfg.repeat,
        "retry_infra": cfg.retry_infra,
        **setup_meta(cfg),
    }


def setup_meta(cfg: RunConfig) -> dict[str, Any]:
    """The model, engine arguments and preset every engine of the run got (the report header shows them)."""
    return {"model": {"kind": cfg.model_kind, "label": cfg.model_label, "params": dict(cfg.model_params)},
            "engine_args": dict(cfg.engine_args), "preset": cfg.preset}
