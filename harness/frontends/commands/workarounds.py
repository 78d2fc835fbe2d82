"""``vllm-repro workarounds list|check``: the workaround ledger, and per version whether each is still needed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.errors import BadInput
from harness.frontends.commands.cellrun import add_check_options, checked_versions, run_cells
from harness.frontends.commands.command import Command, CommandGroup
from harness.frontends.commands.invocation import Context

if TYPE_CHECKING:
    from harness.verdicts.results import Results
    from harness.verdicts.workarounds import Workaround

LEDGER_HELP = "ledger TOML (default: the one shipped with vllm-repro)"


def selected_ledger(args: argparse.Namespace) -> tuple[Workaround, ...]:
    """The ledger's workarounds, only those named by ``--id`` when given; BadInput names an unknown id."""
    from harness.verdicts.workarounds import load_ledger

    ledger = load_ledger(args.ledger)
    if args.id:
        known = [w.id for w in ledger]
        for i in args.id:
            if i not in known:
                raise BadInput(f"unknown workaround id {i!r}; valid choices: {', '.join(known)}")
        ledger = tuple(w for w in ledger if w.id in args.id)
    return tuple(ledger)


class WorkaroundsList(Command):
    name = "list"
    help = "print the ledger"

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--ledger", type=Path, help=LEDGER_HELP)
        parser.add_argument("--id", action="append", default=[],
                            help="list only these workaround ids (repeatable)")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        for w in selected_ledger(args):
            print(f"{w.id}: {w.issue} {w.title}\n  {w.setting} in {w.location}\n  {_fix(w)}; demonstrated by "
                  f"{w.cell}, workaround sets {w.applied}")
        return 0


class WorkaroundsCheck(Command):
    name = "check"
    help = "run each workaround's cell with and without it on every version"
    description = ("Per version: NEEDED (bug with the workaround off, none with it on), REMOVABLE (no bug either "
                   "way), BROKEN (bug even with the workaround), UNKNOWN (a cell could not run). Exit 1 with "
                   "--require-removable when any version NEEDS a workaround.")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--ledger", type=Path, help=LEDGER_HELP)
        parser.add_argument("--id", action="append", default=[],
                            help="check only these workaround ids (repeatable)")
        parser.add_argument("--require-removable", action="store_true",
                            help="exit 1 if any checked version still NEEDS a workaround")
        add_check_options(parser, reports="reports/workarounds")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.verdicts.report import write_reports

        ledger = selected_ledger(args)
        versions = checked_versions(ctx, "workarounds check", "0.21.0,0.22.0,0.32.0")
        results, reports = run_cells(ctx, (c for w in ledger for v in versions for c in w.cells(v)),
                                     f"workarounds check: {len(ledger)} workaround(s) x {len(versions)} version(s)",
                                     args.reports)
        write_reports(results, reports)
        needed = print_judgements(ledger, versions, results)
        print(f"reports: {reports}")
        return 1 if (needed and args.require_removable) else 0


def _fix(w: Workaround) -> str:
    # A framework's workaround may name no vLLM bug, so no fix (PipelineRL's async-scheduling: false).
    return f"fix {w.fix}, ledger: fixed in {w.fixed_in}" if w.fix or w.fixed_in else "no vLLM fix named"


def print_judgements(ledger: tuple[Workaround, ...], versions: tuple[str, ...], results: Results) -> bool:
    """Print each workaround's verdict per version; whether any version still NEEDS one."""
    from harness.verdicts.workarounds import judge

    needed = False
    for w in ledger:
        check = judge(w, list(versions), list(results.cells))
        print(f"{w.issue} {w.id}: {w.setting} in {w.location} ({_fix(w)})")
        for v in check.verdicts:
            print(f"  {v.version:<12} {v.status.value:<10} {v.evidence}")
            needed = needed or v.status.value == "NEEDED"
        first = check.first_removable
        print(f"  removable from: {first or 'not yet'}" + (f"; NOTE: {check.consistency}" if check.consistency else ""))
    return needed


class WorkaroundsCommand(CommandGroup):
    name = "workarounds"
    help = ("the workaround ledger: list it, or check per version whether each workaround is NEEDED, REMOVABLE "
            "or BROKEN")
    actions = (WorkaroundsList(), WorkaroundsCheck())
