"""``vllm-repro plan``: replay one pause schedule (e.g. a Hypothesis falsifying example) on engines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness.commands.base import Command
from harness.commands.context import Context
from harness.commands.options import add_index_options, add_run_options, add_version_options
from harness.envs import VllmEnv, ensure_env
from harness.errors import BadInput
from harness.matrix import EXECUTORS, ON_OFF, EngineKey, parse_bools
from harness.runner import RunConfig

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


def replay(env: VllmEnv, key: EngineKey, cfg: RunConfig, plan: dict[str, Any]) -> int:
    """Run ``plan`` on one engine and print each request's verdict; 1 when the engine gave none."""
    from harness.session import EngineSession, SessionDead

    session = EngineSession(env, key, cfg)
    try:
        session.start()
        ev = session.run({"id": "plan", "scenario": "plan", "params": plan, "seed": 0})
    except SessionDead as exc:
        print(f"{key.id}: {exc}")
        return 1
    finally:
        session.close()
    if ev.get("status") != "ran":
        print(f"{key.id}: {str(ev.get('status')).upper()}: {ev.get('reason')}")
        return 1
    print_verdict(key, ev["records"])
    return 0


def print_verdict(key: EngineKey, records: list[dict[str, Any]]) -> None:
    """The engine's verdict, then per request: label, pauses, and whether #42043-style losses explain it."""
    from harness.oracle import cell_verdict, fit_losses, preempted_at_keep_clear

    verdict = cell_verdict(records)
    print(f"{key.id}: {verdict.summary}")
    for rv, rec in zip(verdict.requests, records, strict=True):
        points = preempted_at_keep_clear(rec)
        fit = fit_losses(rec["reference"], rec["observed"], rec["max_tokens"], points)
        pauses = ", ".join(f"{p['mode']}@{p['client_tokens']}" for p in rec.get("pauses") or [])
        print(f"  {rv.rid}: {rv.verdict.label}; pauses [{pauses}]; finish {rec.get('finish_reason')}; "
              f"preempted by keep+clear pauses at {points}; "
              f"stream = reference minus #42043-style losses there: {fit is not None}")


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
        versions, prebuilt = ctx.versions, ctx.prebuilt
        asyncs = parse_bools("async setting", args.async_, ON_OFF, (True,))
        worst = 0
        for v in versions:
            env = prebuilt.get(v) or ensure_env(ctx.recipe(v), ctx.cache)
            for a in asyncs:
                worst = max(worst, replay(env, EngineKey(v, args.executor, a), cfg, plan))
        return worst
