"""The run shared by the commands that check a fixed list of cells per version (``workarounds check``,
``frameworks check``): their options, the checks made before anything starts, and one plan run to a fresh log."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from harness.core.errors import BadInput
from harness.frontends.commands.face import interruptible, stderr_console
from harness.frontends.commands.invocation import Context, fresh_log, run_context
from harness.frontends.commands.options import (
    add_index_options,
    add_retry_option,
    add_run_options,
    add_version_options,
    add_wheelhouse_options,
    add_wheels_option,
    parse_jobs,
)
from harness.plan.matrix import plan_cells
from harness.plan.shared_server import share_server
from harness.verdicts.results import ResultsLog

if TYPE_CHECKING:
    from pathlib import Path

    from harness.core.cell import Cell
    from harness.run.slots import Capacity
    from harness.run.spec import RunConfig
    from harness.verdicts.results import CellResult, Results


def add_check_options(parser: argparse.ArgumentParser, reports: str) -> None:
    """Versions, run, retry, index and build options: the same as ``matrix`` takes for them, so a check runs on an
    air-gapped GPU node (``--wheelhouse``) or with the CUDA wheels on CPU (``--wheels``) as the matrix does."""
    add_version_options(parser)
    add_run_options(parser, reports=reports)
    add_retry_option(parser)
    add_index_options(parser)
    add_wheels_option(parser)
    add_wheelhouse_options(parser)


def checked_versions_options(ctx: Context) -> None:
    """The index and build options checked: BadInput before an env is built or a file written."""
    ctx.index  # noqa: B018 -- a bad index option is reported first, as the matrix does
    ctx.wheels  # noqa: B018 -- --wheels with --wheelhouse is refused before the wheelhouse is read
    ctx.recipe  # noqa: B018 -- a missing or broken wheelhouse is bad input, not N BUILD-FAILED cells


def checked_versions(ctx: Context, command: str, example: str) -> tuple[str, ...]:
    """The versions to check; every input problem is BadInput before an env is built or a file written."""
    ctx.index  # noqa: B018 -- a bad index option is reported before a missing --versions
    if not ctx.args.versions:
        raise BadInput(f"{command} needs --versions, e.g. {example}")
    checked_versions_options(ctx)
    return ctx.versions


def run_cells(ctx: Context, cells: Iterable[Cell], title: str, reports: Path, cfg: RunConfig | None = None,
              settled: Iterable[CellResult] = ()) -> tuple[Results, Path]:
    """Plan ``cells`` (one engine per engine config), run them with results appended as they come, and return the
    results with the reports folder they were written to; ``cfg``: the run's settings (default: the options'),
    ``settled``: results decided without a run (logged first, kept in the results)."""
    from harness.run import execute

    cfg = cfg or ctx.run_config
    settled = list(settled)
    cap = check_capacity(ctx, cfg)
    plan = share_server(plan_cells(list(cells), ctx.platform), cfg.client)
    folder, jsonl = fresh_log(reports, "results.jsonl")
    console = stderr_console()
    console.print(f"[bold]{title}[/]: {len(plan.cells)} cell(s) on {len(plan.engines)} engine(s)")
    log = ResultsLog(jsonl)
    for res in settled:
        log.append(res)
    with interruptible(console, f"results of finished cells are in {jsonl}"):
        results = execute.execute_plan(plan, run_context(
            ctx, cfg, log, on_progress=lambda p: console.print(f"  {p.message}") if p.kind == "cell" else None,
            **({"capacity": cap} if cap else {})))
    return (replace(results, cells=(*settled, *results.cells)) if settled else results), folder


def check_capacity(ctx: Context, cfg: RunConfig) -> Capacity | None:
    """The engines at a time of a command with ``--jobs`` (``frameworks check``): the matrix's capacity, so on the
    CPU platform the next engine starts up while one runs its scenarios (harness.run.turns); None (one at a time,
    as before) for a command without the option."""
    from harness.run.gpus import visible_gpus
    from harness.run.slots import capacity

    raw = getattr(ctx.args, "jobs", None)
    if raw is None:
        return None
    jobs = parse_jobs(raw)
    gpus = visible_gpus() if ctx.platform == "cuda" else []
    return capacity(jobs, ctx.platform, gpus, cfg.gpu_memory_utilization)
