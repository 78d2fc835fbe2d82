"""``vllm-repro report``: render reports from results files, merging several cell by cell."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.core.errors import BadInput
from harness.frontends.commands.command import Command
from harness.frontends.commands.face import stdout_console
from harness.frontends.commands.invocation import Context
from harness.verdicts.results import Results, read_results


def parse_meta(items: list[str]) -> dict[str, str]:
    """``--meta KEY=VALUE`` items as a dict; BadInput on an item without ``=`` or key."""
    extra: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--meta {item!r} is not KEY=VALUE; e.g. --meta driver=580.159.04")
        extra[key.strip()] = value
    return extra


class ReportCommand(Command):
    name = "report"
    help = ("render reports from results files (results.json or results.jsonl); several files are merged cell by "
            "cell (a later file wins)")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("results", type=Path, nargs="+")
        parser.add_argument("--out", type=Path, default=None, help="also write JSON/Markdown/JUnit into this folder")
        parser.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                            help="add a fact to the report's header, e.g. device='2x NVIDIA H200', "
                                 "driver=580.159.04")
        parser.add_argument("--rejudge", action="store_true",
                            help="compare every cell with this vllm-repro's known-bug table, not the one it ran "
                                 "under (after a bisect added a row); the header says so")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.verdicts.report import write_reports
        from harness.verdicts.report.terminal import render_terminal
        from harness.verdicts.results import merge_results

        extra = parse_meta(args.meta)
        results = merge_results([(p, read_results(p)) for p in args.results], extra)
        if args.rejudge:
            results = rejudged(results)
        render_terminal(results, stdout_console())
        if args.out:
            paths = write_reports(results, args.out)
            print(f"reports: {paths.json}, {paths.markdown}, {paths.junit}")
        return 0


def rejudged(results: Results) -> Results:
    """``results`` with every cell's known-bug comparison made again against the current table."""
    from harness import __version__
    from harness.verdicts.known_bugs import annotate, load_known_bugs

    bugs = load_known_bugs()
    return Results(tuple(annotate(c, bugs) for c in results.cells),
                   {**results.meta, "rejudged": f"known-bug table of vllm-repro {__version__}"})
