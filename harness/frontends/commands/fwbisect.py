"""``vllm-repro frameworks bisect``: the first release where one framework's call sequence turns SAFE (or UNSAFE).

The predicate is the framework's release verdict (``frameworks check``'s), so the answer is the framework's own
window: e.g. TRL's async GRPO sequence over the releases its pin allows (issue 22)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.errors import BadInput
from harness.frontends.commands.cellrun import add_check_options, checked_versions
from harness.frontends.commands.command import Command
from harness.frontends.commands.face import interruptible, probe_printer, stderr_console
from harness.frontends.commands.invocation import Context, fresh_log, run_context
from harness.frontends.commands.workarounds import LEDGER_HELP
from harness.plan.matrix import split_list
from harness.verdicts.results import ResultsLog

if TYPE_CHECKING:


    from harness.bisect.framework import FrameworkBisect
    from harness.verdicts.frameworks import Recipe

REPORT = "frameworks-bisect.json"


def one_recipe(args: argparse.Namespace) -> Recipe:
    """The one recipe ``--framework`` names; BadInput (naming the valid ones) for none, several or an unknown."""
    from harness.verdicts.frameworks import load_recipes, select

    recipes = load_recipes(args.recipes, args.ledger)
    names = split_list(args.framework)
    valid = ", ".join(r.name for r in recipes)
    if len(names) != 1:
        raise BadInput(f"frameworks bisect needs exactly one --framework NAME; valid choices: {valid}")
    (recipe,) = select(recipes, names)
    return recipe


def _example_range(recipe: Recipe) -> str:
    from packaging.specifiers import SpecifierSet

    tops = [s.version for s in SpecifierSet(recipe.pin) if s.operator in ("==", "<=")]
    return f"{recipe.floor or '0.16.0'}..{tops[0] if tops else 'latest'} ({recipe.name} pins vllm {recipe.pin})"


def _summary(run: FrameworkBisect) -> str:
    assert run.result is not None
    what = "safe" if run.find == "fix" else "unsafe"
    r = run.result
    return (f"{run.recipe.name}: first {what} release: {r.first_new} (last {'unsafe' if run.find == 'fix' else 'safe'}"
            f": {r.last_old}); {r.summary}")


class FrameworksBisect(Command):
    name = "bisect"
    help = "find the first release where one framework's call sequence turns SAFE (fix) or UNSAFE (regression)"
    description = ("Binary search over vLLM releases with one framework's release verdict as the predicate: every "
                   "cell of its sequence runs on its own door at each probed release (no engine-door stand-ins, no "
                   "workaround pair); UNSAFE = BAD, SAFE = GOOD, UNKNOWN (a cell UNSUPPORTED, ERROR, TIMEOUT) = SKIP. "
                   "The endpoints are probed first; an ill-posed range is refused (exit 2) with both endpoints' "
                   f"verdicts. Writes {REPORT} (every probe with its cells) and results.jsonl into --reports.")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--framework", default=None, metavar="NAME", help="the framework (one recipe name)")
        parser.add_argument("--recipes", type=Path,
                            help="recipe TOML (default: harness/verdicts/frameworks.toml shipped with vllm-repro)")
        parser.add_argument("--ledger", type=Path, help=LEDGER_HELP)
        parser.add_argument("--find", default="fix", help="fix (first SAFE after UNSAFE, default) or regression")
        add_check_options(parser, reports="reports/frameworks-bisect")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.bisect.framework import run_framework_bisect
        from harness.bisect.search import FIND_MODES

        if args.find not in FIND_MODES:
            raise BadInput(f"unknown --find mode {args.find!r}; valid choices: {', '.join(FIND_MODES)}")
        recipe = one_recipe(args)
        versions = list(checked_versions(ctx, "frameworks bisect", _example_range(recipe)))
        reports, jsonl = fresh_log(args.reports, "results.jsonl")
        console = stderr_console()
        console.print(f"[bold]frameworks bisect[/] {recipe.name} --find {args.find} over {len(versions)} releases "
                      f"({versions[0]} .. {versions[-1]}), door {recipe.door}, {len(recipe.cells)} cell(s) per probe")
        with interruptible(console, f"results of finished cells are in {jsonl}"):
            run = run_framework_bisect(recipe, versions, args.find, run_context(ctx, ctx.run_config,
                                                                                  ResultsLog(jsonl)),
                                       on_probe=probe_printer(console))
        (reports / REPORT).write_text(json.dumps({**run.to_dict(), "argv": list(ctx.argv)}, indent=2) + "\n")
        console.print(f"probe log: {reports / REPORT}")
        for w in run.to_dict()["warnings"]:
            console.print(f"warning: {w}", style="yellow", markup=False)
        if run.error is not None:
            print(f"vllm-repro: frameworks bisect refused: {recipe.name}: {run.error}", file=sys.stderr)
            return 2
        print(_summary(run))
        return 0

