"""``vllm-repro compare``: two results reports cell by cell (e.g. the CPU and GPU tiers)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.frontends.commands.command import Command
from harness.frontends.commands.face import stdout_console
from harness.frontends.commands.invocation import Context
from harness.verdicts.results import read_results


class CompareCommand(Command):
    name = "compare"
    help = "compare two results reports cell by cell (e.g. the CPU and GPU tiers)"
    description = ("For every cell both reports ran (a verdict, not UNSUPPORTED/ERROR/TIMEOUT/BUILD-FAILED), say "
                   "whether outcome, label and affected requests agree; list cells only one side ran. A scheduler-tier "
                   "report against an engine-tier one pairs cells across the tiers (ids without -sched): there the "
                   "requests hit are compared, not counted, and a difference each tier's known-bug rules expect is "
                   "reported as such. Exit code: 0 when every cell both ran agrees (or differs as the known-bug "
                   "table expects per tier), 1 otherwise (also when no cell ran on both), 2 on bad input.")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("a", type=Path, metavar="A.json")
        parser.add_argument("b", type=Path, metavar="B.json")
        parser.add_argument("--markdown", type=Path, help="also write the comparison as Markdown (to commit)")
        parser.add_argument("--across-tiers", action="store_true",
                            help="pair cells by id without the tier segment (automatic when each report holds one "
                                 "tier and the tiers differ)")
        parser.add_argument("--across-doors", action="store_true",
                            help="pair cells by id without the door segment, engine door against server door "
                                 "(automatic when each report holds one door and the doors differ; a report of "
                                 "both doors, given as A and B, compares its engine-door cells with its "
                                 "server-door cells)")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.verdicts.compare.pairs import compare
        from harness.verdicts.compare.render import markdown, render_terminal

        cmp = compare(read_results(args.a), read_results(args.b), str(args.a), str(args.b),
                      across_tiers=True if args.across_tiers else None,
                      across_doors=True if args.across_doors else None)
        render_terminal(cmp, stdout_console())
        if args.markdown:
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(markdown(cmp), encoding="utf-8")
            print(f"wrote {args.markdown}")
        return cmp.exit_code
