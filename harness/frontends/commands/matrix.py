"""``vllm-repro matrix``: run the selected cells and write JSON, Markdown and JUnit reports."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.axes import Axis
from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.events import EngineEvent
from harness.core.oracle import Outcome
from harness.core.outcome_groups import infra_failed
from harness.frontends.commands.command import Command
from harness.frontends.commands.face import colour, interruptible, stderr_console, stdout_console
from harness.frontends.commands.fwclient import add_matrix_client_option, matrix_client
from harness.frontends.commands.invocation import Context, fresh_log, run_context, setup_of
from harness.frontends.commands.options import (
    add_index_options,
    add_jobs_option,
    add_retry_option,
    add_run_options,
    add_version_options,
    add_wheelhouse_options,
    add_wheels_option,
    parse_jobs,
)
from harness.plan.faults import FAULTS, parse_inject, sensitivity_failures
from harness.plan.matrix import MatrixPlan, Selection, explicit_axes, plan_cells, selection_axes
from harness.plan.platforms import require_scheduler_tier
from harness.run import execute
from harness.run.context import Progress
from harness.run.gpus import visible_gpus
from harness.run.resume import RUN_FILE, keep_engine_logs, resume_state, rewrite_log, run_record
from harness.run.slots import Capacity, capacity
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, Results, ResultsLog

if TYPE_CHECKING:
    from rich.console import Console

    from harness.run.cluster import ClusterTarget

DESCRIPTION = (
    "Run the selected cells. One engine starts per (version, executor, async, TP) config; every pause mode, "
    "clear_cache value and scenario runs as a scenario of that engine. Cells the platform cannot run are reported "
    "UNSUPPORTED with the reason. Exit code: 0 when every runnable cell produced a verdict (token loss included: "
    "that is a finding), 1 when any cell is ERROR, TIMEOUT or BUILD-FAILED, or with --strict has a token fault or "
    "is FLAKY, or with --fail-on-unexpected differs from the known-bug table, or with --inject vllm#42043 the "
    "sensitivity self-test failed; 2 on bad input; 130 on Ctrl-C."
)


def _dest(a: Axis) -> str:
    # ``--async`` cannot be an attribute name: its dest is ``async_``.
    return "async_" if a.option == "async" else a.option.replace("-", "_")


def add_axis_options(p: argparse.ArgumentParser, cell_type: type[Cell] = Cell) -> None:
    """One option per axis of the cell's table that has one (``--executor``, ``--async``, ``--tier``, ...)."""
    for a in cell_type.table().axes:
        if a.option:
            extra: dict[str, Any] = {"metavar": "ASYNC"} if a.option == "async" else {}
            p.add_argument(f"--{a.option}", dest=_dest(a), help=a.help, **extra)


def matrix_axes(args: argparse.Namespace, platform: str, cell_type: type[Cell] = Cell) -> dict[str, tuple[Any, ...]]:
    """The ``Selection`` fields but versions from ``matrix`` options; BadInput names a bad value and the choices.

    The CI-file checks (tests/unit/ci_files.py) call it too, so a nightly cannot pass a value the CLI refuses.
    """
    return selection_axes(_raw_axes(args, platform, cell_type), platform, cell_type)


def matrix_explicit(args: argparse.Namespace, platform: str, cell_type: type[Cell] = Cell) -> frozenset[str]:
    """The axes the ``matrix`` options (or the preset) name: they keep their values on every release."""
    return explicit_axes(_raw_axes(args, platform, cell_type), cell_type)


def _raw_axes(args: argparse.Namespace, platform: str, cell_type: type[Cell]) -> dict[str, str | None]:
    raw = {a.option: getattr(args, _dest(a)) for a in cell_type.table().axes if a.option}
    # A preset's executor and batch-invariant mode (harness.plan.engine_args.Preset.axes) count where the
    # user chose none: the cell decides them, so the preset sets the axis, not an engine argument.
    preset = setup_of(args, platform).axes if getattr(args, "preset", None) else {}
    return {k: preset.get(k) if v is None else v for k, v in raw.items()}


@dataclass(frozen=True)
class MatrixSetup:
    """What the matrix options resolve to, beyond the shared context."""

    selection: Selection
    cfg: RunConfig
    target: ClusterTarget | None  # None: run on this host
    n_gpus: int | None  # visible GPUs on cuda, None on cpu
    capacity: Capacity  # engines at a time (--jobs), and the GPUs they share


def matrix_setup(ctx: Context, args: argparse.Namespace) -> MatrixSetup:
    """Validate the matrix options (in the order bad input is reported) and resolve them."""
    platform = ctx.platform
    target = None
    if args.cluster:
        from harness.run.cluster import parse_cluster

        target = parse_cluster(args.cluster)
    inject = parse_inject(args.inject)
    jobs = parse_jobs(args.jobs)
    if args.repeat < 1:
        raise BadInput(f"--repeat must be at least 1, got {args.repeat}")
    n_gpus = len(visible_gpus()) if platform == "cuda" else None
    if args.weight_transfer == "nccl" and platform != "cuda":
        raise BadInput("--weight-transfer nccl needs CUDA GPUs; use reload (or auto) on cpu")
    cfg = replace(ctx.run_config, inject=inject, repeat=args.repeat, weight_transfer=args.weight_transfer,
                  n_gpus=n_gpus or 0, weight_sync_fresh_check=args.weight_sync_fresh_check)
    ctx.index  # noqa: B018 -- a bad index option is reported before a bad wheelhouse, as always
    wheels = ctx.wheels  # --wheels with --wheelhouse is refused before the wheelhouse is read
    ctx.recipe  # noqa: B018 -- a missing or broken wheelhouse, or no base for it, is bad input, not N BUILD-FAILED cells
    axes = matrix_axes(args, platform)
    require_scheduler_tier(platform, wheels, axes["tiers"], "--tier scheduler")
    sel = Selection(versions=ctx.versions, explicit=matrix_explicit(args, platform), **axes)
    if args.client:  # the side environment is built once every other option is checked
        if "client" not in axes["doors"]:
            raise BadInput("--client needs the client door: add --door client (or all)")
        cfg = replace(cfg, client=matrix_client(ctx, args.client))
    gpus = visible_gpus() if platform == "cuda" else []
    return MatrixSetup(sel, cfg, target, n_gpus, capacity(jobs, platform, gpus, cfg.gpu_memory_utilization))


@dataclass(frozen=True)
class RunLog:
    """Where a run's results go, and the finished cells a resumed run keeps."""

    reports: Path
    jsonl: Path
    kept: tuple[CellResult, ...]


def prepare_log(reports: Path, resume: bool, run_doc: dict[str, Any]) -> RunLog:
    """A fresh results log, or (``--resume``) the old one cut to the cells kept; then the run record."""
    if resume:
        kept = resume_state(reports, run_doc)
        jsonl = reports / "results.jsonl"
        rewrite_log(jsonl, kept)
        keep_engine_logs(reports)
    else:
        kept = []
        reports, jsonl = fresh_log(reports, "results.jsonl")
    (reports / RUN_FILE).write_text(json.dumps(run_doc, indent=2) + "\n")
    return RunLog(reports, jsonl, tuple(kept))


def pending_plan(setup: MatrixSetup, platform: str, kept: Iterable[CellResult]) -> MatrixPlan:
    """The plan of the selected cells not kept from an earlier run."""
    done_ids = {r.id for r in kept}
    # On a cluster GPUs are per node: TP cells are not judged by the driver's own GPUs.
    return plan_cells([c for c in setup.selection.cells() if c.id not in done_ids], platform,
                      None if setup.target else setup.n_gpus, setup.cfg.model_kind if setup.cfg.model_named else None)


def run_engines(ctx: Context, setup: MatrixSetup, plan: MatrixPlan, jsonl: Path,
                on_progress: Callable[[Progress], None]) -> Results:
    """Run the plan's engines here, or as Ray tasks with ``--cluster``."""
    backend = None
    if setup.target is not None:
        from harness.run.cluster import RayBackend

        backend = RayBackend(setup.target.address)
    rctx = run_context(ctx, setup.cfg, ResultsLog(jsonl), on_progress=on_progress, capacity=setup.capacity)
    return execute.execute_plan(plan, rctx, backend)


def merge_kept(kept: tuple[CellResult, ...], results: Results, sel: Selection) -> Results:
    """A resumed run's results: the kept cells and the new ones, in selection order."""
    if not kept:
        return results
    order = {c.id: i for i, c in enumerate(sel.cells())}
    merged = sorted([*kept, *results.cells], key=lambda r: order.get(r.id, len(order)))
    return Results(tuple(merged), {**results.meta, "resumed": {"kept": len(kept)},
                                   "engine_starts": results.meta.get("engine_starts")})


@dataclass(frozen=True)
class MatrixExit:
    """The exit code of a matrix run, and the cells to name when --fail-on-unexpected decided it."""

    code: int
    unexpected: tuple[str, ...] = ()


def matrix_exit(cells: Iterable[CellResult], *, strict: bool, fail_on_unexpected: bool,
                sensitivity_failed: bool) -> MatrixExit:
    """1 on an infrastructure outcome, a token fault or FLAKY cell with --strict, an UNEXPECTED cell with
    --fail-on-unexpected, or a failed sensitivity self-test; else 0."""
    cells = list(cells)
    if infra_failed(c.outcome.value for c in cells):
        return MatrixExit(1)
    if strict and any(c.outcome.is_finding or c.outcome is Outcome.FLAKY for c in cells):
        return MatrixExit(1)
    unexpected = tuple(c.id for c in cells if c.expectation is not None and c.expectation.status == "UNEXPECTED")
    if fail_on_unexpected and unexpected:
        return MatrixExit(1, unexpected)
    return MatrixExit(1 if sensitivity_failed else 0)


class MatrixProgress:
    """The progress lines of a matrix run on stderr: one per finished cell, engine start and env build."""

    def __init__(self, console: Console, n_cells: int, done: int) -> None:
        self.console, self.n_cells, self.done = console, n_cells, done

    def __call__(self, p: Progress) -> None:
        from rich.markup import escape

        if p.kind == "cell" and p.cell is not None:
            self.done += 1
            tint = colour(p.cell.outcome.value)
            earlier = ", ".join(a.label or a.outcome for a in p.cell.attempts[:-1])
            retried = f" (attempt {len(p.cell.attempts)}; earlier: {escape(earlier)})" if p.cell.attempts else ""
            self.console.print(f"  [{self.done}/{self.n_cells}] {p.cell.id}: [{tint}]{escape(p.cell.summary)}[/]"
                               f"{retried}")
        elif p.kind == "event" and isinstance(p.event, EngineEvent):
            info = p.event.info
            if p.event.started is False:
                # vLLM refused the engine before it ran (e.g. a profile argument): the cells say why.
                self.console.print(f"  engine not started: vLLM {info.vllm_version}, torch {info.torch_version}")
                return
            self.console.print(f"  engine up in {info.get('startup_s')}s: vLLM {info.vllm_version}, torch "
                               f"{info.torch_version}, executor {info.executor_class}, effective async "
                               f"{info.effective_async}")
        elif p.kind in ("env", "engine-start"):
            self.console.print(f"[cyan]{escape(p.message)}[/]")


@contextlib.contextmanager
def _progress(console: Console, plan: MatrixPlan, n_cells: int, done: int,
              jobs: int) -> Iterator[Callable[[Progress], None]]:
    """A live board on a terminal; the plain, stable lines of MatrixProgress elsewhere (CI logs)."""
    if not console.is_terminal:
        yield MatrixProgress(console, n_cells, done)
        return
    from harness.frontends.commands.live import LiveBoard

    with LiveBoard(console, plan, n_cells, done=done, jobs=jobs) as board:
        yield board


def _announce(console: Console, ctx: Context, setup: MatrixSetup, plan: MatrixPlan, log: RunLog) -> int:
    """Print what the run will do; the number of cells it covers."""
    inject = setup.cfg.inject
    if inject:
        console.print(f"[bold red]FAULT INJECTION[/]: {', '.join(f'{f} ({FAULTS[f]})' for f in inject)}; the "
                      "results of this run do not describe upstream vLLM")
    n_cells = len(plan.cells) + len(log.kept)
    if setup.cfg.custom_setup:
        announce_setup(console, setup.cfg)
    console.print(f"[bold]vllm-repro[/] {n_cells} cells on {ctx.platform}: {len(plan.engines)} engine(s) to start, "
                  f"{len(plan.unsupported)} unsupported; results stream to {log.jsonl}")
    return n_cells


def announce_setup(console: Console, cfg: RunConfig) -> None:
    """One line: the model and engine arguments every engine of this run gets."""
    from rich.markup import escape

    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in cfg.engine_args.items()) or "none"
    preset = f" (preset {cfg.preset})" if cfg.preset else ""
    console.print(escape(f"model {cfg.model_label}; engine args{preset}: {args}"))


def _sensitivity_failed(console: Console, results: Results, inject: tuple[str, ...]) -> bool:
    """With --inject: print the self-test's outcome; whether it failed."""
    from rich.markup import escape

    if not inject:
        return False
    failures = sensitivity_failures(results)
    if failures:
        console.print("[bold red]SENSITIVITY SELF-TEST FAILED[/]: the injected bug was not seen where it must be:")
        for f in failures:
            console.print(f"  {escape(f)}")
        return True
    if "vllm#42043" in inject:
        console.print("[bold green]sensitivity self-test passed[/]: every cell the injected bug covers shows it")
    return False


class MatrixCommand(Command):
    name = "matrix"
    help = "run the matrix and write JSON, Markdown and JUnit reports"
    description = DESCRIPTION

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_version_options(parser)
        _add_axis_options(parser)
        add_run_options(parser, reports="reports")
        add_wheels_option(parser)
        add_retry_option(parser)
        add_wheelhouse_options(parser)
        _add_run_mode_options(parser)
        add_index_options(parser)
        add_matrix_client_option(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.verdicts.report import write_reports
        from harness.verdicts.report.terminal import render_terminal

        setup = matrix_setup(ctx, args)
        console = stderr_console()
        log = prepare_log(args.reports, args.resume, run_record(setup.selection, setup.cfg, ctx.platform, ctx.wheels))
        if args.resume:
            console.print(f"[bold]resuming[/] {args.reports}: {len(log.kept)} finished cell(s) kept")
        plan = pending_plan(setup, ctx.platform, log.kept)
        n_cells = _announce(console, ctx, setup, plan, log)
        with interruptible(console, f"results of finished cells are in {log.jsonl}"), \
                _progress(console, plan, n_cells, len(log.kept), setup.capacity.jobs) as progress:
            results = run_engines(ctx, setup, plan, log.jsonl, progress)
        results = merge_kept(log.kept, results, setup.selection)
        paths = write_reports(results, log.reports)
        render_terminal(results, stdout_console())
        console.print(f"reports: {paths.json}, {paths.markdown}, {paths.junit}")
        failed = _sensitivity_failed(console, results, setup.cfg.inject)
        verdict = matrix_exit(results.cells, strict=args.strict, fail_on_unexpected=args.fail_on_unexpected,
                              sensitivity_failed=failed)
        if verdict.unexpected:
            console.print(f"[bold red]{len(verdict.unexpected)} cell(s) differ from the known-bug table[/]: "
                          + ", ".join(verdict.unexpected[:8]))
        return verdict.code


def _add_axis_options(m: argparse.ArgumentParser) -> None:
    add_axis_options(m)
    m.add_argument("--weight-transfer", default="auto", choices=("auto", "reload", "nccl"),
                   help="how weight-sync swaps weights: reload (in place), nccl (a trainer process on a GPU the "
                        "engine does not use sends them), auto = nccl on cuda when such a GPU is visible, else "
                        "reload (on the server door always reload, through POST /collective_rpc)")
    m.add_argument("--weight-sync-fresh-check", action="store_true",
                   help="weight-sync: also replay prompt + pre-pause tokens on a fresh engine loaded with B, as "
                        "upstream's example does (one more engine start per weight-sync cell)")


def _add_run_mode_options(m: argparse.ArgumentParser) -> None:
    add_jobs_option(m)
    m.add_argument("--cluster", metavar="ray[:ADDRESS]", default=None,
                   help="run each engine config as a Ray task: 'ray' starts a local Ray for the run; 'ray:auto' or "
                        "'ray:HOST:PORT' (GCS address; run vllm-repro on a node of the cluster) joins one. Each task "
                        "asks for 1 CPU and TP GPUs and builds its vLLM env on its node. Needs "
                        "pip install 'vllm-repro[cluster]'")
    m.add_argument("--strict", action="store_true", help="exit 1 when any cell has a token fault")
    m.add_argument("--fail-on-unexpected", action="store_true",
                   help="exit 1 when any cell differs from the known-bug table (UNEXPECTED): a new loss, or a "
                        "known bug gone; for nightlies, where the known loss on old releases is expected")
    m.add_argument("--inject", action="append", metavar="FAULT",
                   help=f"deliberately inject a fault ({', '.join(FAULTS)}); vllm#42043 re-introduces the bug into "
                        "a fixed vLLM as a sensitivity self-test: exit 1 unless every cell it covers shows it. "
                        "Every report of such a run says so")
    m.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run every cell N times on its engine; a cell whose runs disagree is FLAKY (default 1)")
    m.add_argument("--resume", action="store_true",
                   help="continue the run in --reports: keep its finished cells, run the missing, ERROR and TIMEOUT "
                        "ones (the selection and settings must match)")
