"""``vllm-repro plan``: replay one pause schedule (e.g. a Hypothesis falsifying example) on engines."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.core.cell import parse_cell_id
from harness.core.errors import BadInput
from harness.export.engine_script import cell_plan, plan_json
from harness.frontends.commands.command import Command
from harness.frontends.commands.export import export_file
from harness.frontends.commands.invocation import Context, run_context
from harness.frontends.commands.options import (
    add_index_options,
    add_run_options,
    add_version_options,
    add_wheels_option,
)
from harness.plan.matrix import EXECUTORS, ON_OFF, parse_bools
from harness.plan.plan_file import check_plan, check_plan_fits, model_limits, read_plan
from harness.run.replay import PlanReplay, replay_plan, replay_sched_plan

DESCRIPTION = (
    "Run one JSON pause schedule ({\"requests\": [...], \"pauses\": [...]}, as printed by a failing property test) "
    "on each selected version and async setting, and print every request's verdict against its no-pause reference. "
    "A scheduler-tier plan ({\"tier\": \"scheduler\", \"script\": {...}}, as `vllm-repro fuzz` writes for a "
    "falsifying example) replays its op script on vLLM's scheduler of each selected version. A pause with "
    "\"reset\": true also resets the prefix cache, running requests included, while paused (the manual reset). "
    "--export-pytest writes either plan as one self-contained test file vLLM can paste instead of running it."
)
__all__ = ["PlanCommand", "print_replay", "read_plan"]  # read_plan: imported from here by older callers


def print_replay(r: PlanReplay) -> int:
    """One engine's replay: its verdict, then per request the label, pauses and whether #42043-style losses
    explain it; 1 when the engine gave no verdict."""
    if r.died is not None:
        print(f"{r.engine.id}: {r.died}")
        return 1
    if r.verdict is None:
        print(f"{r.engine.id}: {r.status.upper()}: {r.reason}")
        return 1
    print(f"{r.engine.id}: {r.verdict.summary}")
    if r.engine.tier == "scheduler":
        for q in r.requests:
            resets = ", ".join(f"{m}@{n}" for m, n in q.pauses)
            print(f"  {q.rid}: {q.label}; resets/aborts at tokens [{resets}]; finish {q.finish_reason}")
        return 0
    for q in r.requests:
        pauses = ", ".join(f"{m}@{n}" for m, n in q.pauses)
        print(f"  {q.rid}: {q.label}; pauses [{pauses}]; finish {q.finish_reason}; "
              f"preempted by keep+clear pauses at {list(q.preempted_at)}; "
              f"stream = reference minus #42043-style losses there: {q.explained_by_losses}")
    return 0


class PlanCommand(Command):
    name = "plan"
    help = "replay a pause schedule or a scheduler-tier op script (e.g. a Hypothesis falsifying example)"
    description = DESCRIPTION

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("plan_file", type=Path, metavar="PLAN.json")
        add_version_options(parser)
        parser.add_argument("--async", dest="async_", metavar="ASYNC",
                            help="on, off or both (default: on); engine-tier plans only")
        parser.add_argument("--executor", help="executor (default mp); engine-tier plans only")
        parser.add_argument("--export-pytest", type=Path, metavar="FILE",
                            help="write the plan as one self-contained test file to FILE, and run nothing: a "
                                 "scheduler-tier plan as a pytest file (imports only vllm and pytest; fails where "
                                 "the scheduler loses, repeats or shifts a token, stalls or raises); an engine-tier "
                                 "plan as a file runnable with python or pytest (imports only vllm; builds the tiny "
                                 "model, starts AsyncLLM with --async and --executor on vLLM's CPU platform, replays "
                                 "the plan, asserts every stream against its no-pause reference)")
        parser.add_argument("--from-cell", metavar="CELL_ID",
                            help="first write the engine-tier plan matrix cell CELL_ID runs (e.g. "
                                 "vllm0.21.0-mp-async_on-keep-clear; scenarios pause and manual-reset) to PLAN.json; "
                                 "its async and executor axes are then the defaults of --async and --executor")
        add_run_options(parser, reports="reports/plan")
        # A scheduler-tier plan the fuzzer found on the CUDA wheel replays there too (--wheels cuda on a CPU machine).
        add_wheels_option(parser)
        add_index_options(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        if args.from_cell is not None:
            self._write_cell_plan(ctx, args)
        plan = read_plan(args.plan_file)
        if args.export_pytest is not None:
            return export_file(plan, args)
        ctx.platform  # noqa: B018 -- a bad --platform is reported before a bad --executor
        if plan.get("tier") == "scheduler":
            return self._scheduler(ctx, args, plan)
        executor = args.executor or "mp"
        if executor not in EXECUTORS:
            raise BadInput(f"unknown executor {executor!r}; valid choices: {', '.join(EXECUTORS)}")
        cfg = ctx.run_config
        check_plan_fits(plan, str(args.plan_file), *model_limits(cfg.model_kind, cfg.model_params, cfg.engine_args))
        versions = ctx.versions
        asyncs = parse_bools("async setting", args.async_, ON_OFF, (True,))
        worst = 0
        for r in replay_plan(plan, versions, asyncs, executor, run_context(ctx, cfg)):
            worst = max(worst, print_replay(r))
        return worst

    @staticmethod
    def _write_cell_plan(ctx: Context, args: argparse.Namespace) -> None:
        """``--from-cell``: PLAN.json becomes that cell's plan (with the run's --num-requests, --max-tokens and
        --pause-after), and its version, async and executor axes the defaults of --versions, --async and
        --executor."""
        cell = parse_cell_id(args.from_cell)
        plan = check_plan(cell_plan(args.from_cell, ctx.run_config.scenario_params), args.from_cell)
        try:
            args.plan_file.parent.mkdir(parents=True, exist_ok=True)
            args.plan_file.write_text(plan_json(plan), encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"cannot write {args.plan_file}: {exc.strerror or exc}") from exc
        args.versions = args.versions or cell.version
        args.async_ = args.async_ or ("on" if cell.async_on else "off")
        args.executor = args.executor or cell.executor
        print(f"wrote {args.plan_file}: the plan of cell {cell.id}")

    @staticmethod
    def _scheduler(ctx: Context, args: argparse.Namespace, plan: dict[str, Any]) -> int:
        """A scheduler-tier plan: its script names the scheduler (and its depth), so --async/--executor do not apply."""
        if args.async_ is not None or args.executor is not None:
            raise BadInput(f"{args.plan_file} is a scheduler-tier plan: its script names the scheduler "
                           f"({plan['script'].get('scheduler', 'async')}); --async and --executor apply to "
                           "engine-tier plans only")
        cfg = ctx.run_config
        worst = 0
        for r in replay_sched_plan(plan["script"], ctx.versions, run_context(ctx, cfg)):
            worst = max(worst, print_replay(r))
        return worst
