"""``vllm-repro frameworks drift``: are the recipes' cited source lines still in each framework's newest release
(issue 36 item 4)?  Exit 1 when a cited line is gone (CHANGED), 0 otherwise, 2 on bad input."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from harness.frontends.commands.command import Command
from harness.frontends.commands.invocation import Context
from harness.frontends.commands.workarounds import LEDGER_HELP
from harness.plan.matrix import split_list

if TYPE_CHECKING:
    from harness.verdicts.drift import CitationCheck, FrameworkDrift


def _check_line(c: CitationCheck) -> list[str]:
    head = f"    {c.status:<8} {c.at}"
    if c.status == "OK":
        return [f"{head}  ({c.call})"]
    if c.status == "MOVED":
        return [f"{head} -> line {c.line}  ({c.call})", f"             {c.quote}"]
    if c.status == "UNQUOTED":
        return [f"{head}  no quote in the recipe: not compared  ({c.call})"]
    where = f" line {c.nearest_line}" if c.nearest_line else ""
    return [f"{head}  ({c.call})", f"             was: {c.quote}", f"             nearest{where}: {c.nearest}"]


def render_framework(d: FrameworkDrift) -> list[str]:
    """One framework's drift: its source, then a line per citation (MOVED and CHANGED say what changed)."""
    if d.skipped:
        return [f"{d.framework}: SKIPPED: {d.skipped}"]
    verdict = "DRIFT" if d.drift else "no drift"
    counts = ", ".join(f"{d.count(s)} {s}" for s in ("OK", "MOVED", "CHANGED", "UNQUOTED") if d.count(s))
    lines = [f"{d.framework}: {verdict} against {d.source} ({counts})"]
    if d.release_pins:
        status = "PIN CHANGED" if d.pin_drift else "OK"
        lines.append(f"    {status:<8} vllm pin: recipe {d.pin}, release metadata {' or '.join(d.release_pins)}")
    for c in d.checks:
        lines += _check_line(c)
    return lines


def render_drift(results: tuple[FrameworkDrift, ...]) -> list[str]:
    out = [line for d in results for line in render_framework(d)]
    drifted = [d.framework for d in results if d.drift]
    out.append(f"drift in: {', '.join(drifted)}" if drifted else "no drift")
    return out


class FrameworksDrift(Command):
    name = "drift"
    help = ("compare each recipe's cited source lines with the framework's newest release (or --checkout); "
            "exit 1 when a cited line is gone")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--recipes", type=Path, help="recipe TOML (default: harness/verdicts/frameworks.toml)")
        parser.add_argument("--ledger", type=Path, help=LEDGER_HELP)
        parser.add_argument("--framework", default=None, metavar="NAME[,NAME]",
                            help="only these frameworks (default: every recipe)")
        parser.add_argument("--checkout", type=Path, default=None, metavar="PATH",
                            help="read this source tree instead of the index's release (one --framework)")
        parser.add_argument("--cache-dir", type=Path, default=None,
                            help="where releases are downloaded and unpacked (default: the harness's cache)")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.verdicts.drift import any_drift
        from harness.verdicts.drift_fetch import check_drift
        from harness.verdicts.frameworks import load_recipes, select

        # BadInput (exit 2) before anything is fetched
        recipes = select(load_recipes(args.recipes, args.ledger), split_list(args.framework))
        results = check_drift(recipes, ctx.cache, args.checkout)
        print("\n".join(render_drift(results)))
        return 1 if any_drift(results) else 0
