"""``vllm-repro plan``: replay one pause schedule (e.g. a Hypothesis falsifying example) on engines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness.commands.base import Command
from harness.commands.context import Context, run_context
from harness.commands.options import add_index_options, add_run_options, add_version_options
from harness.errors import BadInput
from harness.matrix import EXECUTORS, ON_OFF, parse_bools
from harness.replay import PlanReplay, replay_plan

DESCRIPTION = (
    "Run one JSON pause schedule ({\"requests\": [...], \"pauses\": [...]}, as printed by a failing property test) "
    "on each selected version and async setting, and print every request's verdict against its no-pause reference."
)


def read_plan(path: Path) -> dict[str, Any]:
    """The plan in ``path``; BadInput when it cannot be read or is not a plan."""
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read plan {path}: {exc}") from exc
    if not isinstance(plan, dict) or "requests" not in plan:
        raise BadInput(f"{path}: not a plan (expected {{\"requests\": [...], \"pauses\": [...]}})")
    return plan


def print_replay(r: PlanReplay) -> int:
    """One engine's replay: its verdict, then per request the label, pauses and whether #42043-style losses
    explain it; 1 when the engine gave no verdict."""
    if r.died is not None:
        print(f"{r.engine.id}: {r.died}")
        return 1
    if not r.ran or r.verdict is None:
        print(f"{r.engine.id}: {r.status.upper()}: {r.reason}")
        return 1
    print(f"{r.engine.id}: {r.verdict.summary}")
    for q in r.requests:
        pauses = ", ".join(f"{m}@{n}" for m, n in q.pauses)
        print(f"  {q.rid}: {q.label}; pauses [{pauses}]; finish {q.finish_reason}; "
              f"preempted by keep+clear pauses at {list(q.preempted_at)}; "
              f"stream = reference minus #42043-style losses there: {q.explained_by_losses}")
    return 0


class PlanCommand(Command):
    name = "plan"
    help = "replay a pause schedule (e.g. a Hypothesis falsifying example) on engines"
    description = DESCRIPTION

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("plan_file", type=Path, metavar="PLAN.json")
        add_version_options(parser)
        parser.add_argument("--async", dest="async_", metavar="ASYNC", help="on, off or both (default: on)")
        parser.add_argument("--executor", default="mp", help="executor (default mp)")
        add_run_options(parser, reports="reports/plan")
        add_index_options(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        plan = read_plan(args.plan_file)
        ctx.platform  # noqa: B018 -- a bad --platform is reported before a bad --executor
        if args.executor not in EXECUTORS:
            raise BadInput(f"unknown executor {args.executor!r}; valid choices: {', '.join(EXECUTORS)}")
        cfg = ctx.run_config
        versions = ctx.versions
        asyncs = parse_bools("async setting", args.async_, ON_OFF, (True,))
        worst = 0
        for r in replay_plan(plan, versions, asyncs, args.executor, run_context(ctx, cfg)):
            worst = max(worst, print_replay(r))
        return worst
