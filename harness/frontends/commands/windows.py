"""``vllm-repro windows``: the bug windows chart, every known-bug row x every release measured."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.frontends.commands.command import Command
from harness.frontends.commands.invocation import Context

DEFAULT_RESULTS = Path("docs/results")


class WindowsCommand(Command):
    name = "windows"
    help = ("PNG chart of every known-bug row x every vLLM release measured in results folders, coloured by "
            "outcome, with the bisected first bad / first fixed releases marked (needs matplotlib: pip install "
            "'vllm-repro[plot]')")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--results", type=Path, nargs="+", default=[DEFAULT_RESULTS], metavar="DIR",
                            help=f"folders searched for reports and bisect logs (default {DEFAULT_RESULTS})")
        parser.add_argument("--known-bugs", type=Path, default=None, metavar="TOML",
                            help="known-bug table (default: the one shipped with vllm-repro)")
        parser.add_argument("--out", type=Path, default=Path("reports/windows.png"), help="PNG to write")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.verdicts import windows
        from harness.verdicts.known_bugs import load_known_bugs
        from harness.verdicts.windows_plot import draw

        results, bisects, reports = windows.load(args.results)
        chart = windows.build(load_known_bugs(args.known_bugs), results, bisects, reports)
        draw(chart, args.out)
        print(f"wrote {args.out}: {len(chart.rows)} known-bug rows x {len(chart.releases)} releases "
              f"({reports} reports, {len(bisects)} bisect logs)")
        return 0
