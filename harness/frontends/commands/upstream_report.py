"""``vllm-repro upstream-report FINDING``: an upstream-ready report of one of the project's findings (issue 38
item 2; harness.upstream)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.frontends.commands.command import Command
from harness.frontends.commands.invocation import Context
from harness.frontends.commands.options import add_index_options

DEFAULT_OUT = Path("reports/upstream")


class UpstreamReportCommand(Command):
    name = "upstream-report"
    help = ("write an upstream-ready report of a finding (vLLM's bug-report form, a reproducer importing only vllm "
            "and pytest) and check the reproducer in bare envs: it must fail inside the window and pass before it")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("finding", help="the finding's name (harness/upstream/findings.toml)")
        parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                            help=f"the report goes to OUT/FINDING/ (default {DEFAULT_OUT})")
        parser.add_argument("--no-check", action="store_true",
                            help="write the folder without building bare envs or running the reproducer")
        add_index_options(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.upstream.findings import finding_named, load_findings
        from harness.upstream.make import make_report

        finding = finding_named(args.finding, load_findings())  # BadInput (exit 2) before anything is written
        folder, result = make_report(finding, args.out, ctx.cache, ctx.python, ctx.index, not args.no_check,
                                     log=lambda s: print(s, file=sys.stderr, flush=True))
        print(f"wrote {folder}")
        if result is None:
            print("bare-env check not run (--no-check)")
            return 0
        print(f"inside the window: {finding.package} {result.inside.version} {result.inside.status}")
        for v in result.before:
            print(f"before the window: {finding.package} {v.version} {v.status}")
        print(f"lower edge: {result.edge}")
        if result.fixed is not None:
            print(f"first fixed: {finding.package} {result.fixed.version} {result.fixed.status}")
        print("check: OK" if result.ok else "check: FAILED (see check.json)")
        return 0 if result.ok else 1
