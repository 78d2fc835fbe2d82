"""``vllm-repro history add|show|plot``: results over time."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.frontends.commands.command import Command, CommandGroup
from harness.frontends.commands.face import stdout_console
from harness.frontends.commands.invocation import Context
from harness.plan.matrix import PLATFORMS, split_list

DEFAULT_HISTORY = Path("reports/history.jsonl")


def add_history_file_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history", type=Path, default=DEFAULT_HISTORY,
                        help=f"history file (default {DEFAULT_HISTORY})")


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """The row and column filters of ``show`` and ``plot``."""
    parser.add_argument("--cells", help="comma-separated fnmatch patterns on the cell config or id, e.g. "
                                        "'mp-async_on-keep-*', and/or key=value cell axes, e.g. "
                                        "'executor=mp,async=on,tp=2'")
    parser.add_argument("--versions", help="comma-separated version labels (default: all)")
    parser.add_argument("--platform", choices=PLATFORMS, help="only runs of this platform")
    parser.add_argument("--hide-unsupported", action="store_true",
                        help="leave out cell configs that are UNSUPPORTED on every version")


def selection(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``history.view.show``/``history.plot.plot`` from the filter options."""
    return {"platform": args.platform, "cells": tuple(split_list(args.cells)),
            "versions": tuple(split_list(args.versions)), "hide_unsupported": args.hide_unsupported}


class HistoryAdd(Command):
    name = "add"
    help = "append a run (results.json or results.jsonl) to the history file"
    description = ("Append one run to the append-only history (JSONL, schema-versioned). A run already in the "
                   "history (same cells; its results.jsonl log counts as the same run) is not added again. A "
                   "corrupt history or report is refused (exit 2), naming file and line.")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("report", type=Path, metavar="REPORT.json")
        add_history_file_option(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.verdicts.history.store import add_run
        print(add_run(args.history, args.report).message)
        return 0


class HistoryShow(Command):
    name = "show"
    help = "per cell config and vLLM version: latest outcome and outcomes over time"

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_history_file_option(parser)
        add_selection_options(parser)
        parser.add_argument("--exclude-injected", action="store_true", help="leave out runs that used --inject")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.verdicts.history.store import read_history
        from harness.verdicts.history.table import render_history
        from harness.verdicts.history.view import show
        hist = read_history(args.history)
        render_history(show(hist, include_injected=not args.exclude_injected, **selection(args)), stdout_console())
        return 0


class HistoryPlot(Command):
    name = "plot"
    help = ("PNG heat-map of cell configs x versions coloured by the latest outcome (needs matplotlib: pip install "
            "'vllm-repro[plot]')")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_history_file_option(parser)
        add_selection_options(parser)
        parser.add_argument("--include-injected", action="store_true",
                            help="also plot runs that used --inject, in rows of their own (default: left out)")
        parser.add_argument("--out", type=Path, default=Path("reports/history.png"), help="PNG to write")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.verdicts.history.plot import plot
        from harness.verdicts.history.store import read_history
        hist = read_history(args.history)
        layout = plot(hist, args.out, include_injected=args.include_injected, **selection(args))
        left = f"; {layout.excluded_injected_runs} run(s) with fault injection left out" \
            if layout.excluded_injected_runs else ""
        print(f"wrote {layout.path}: {len(layout.rows)} cell configs x {len(layout.versions)} versions, "
              f"{layout.runs} run(s){left}")
        return 0


class HistoryCommand(CommandGroup):
    name = "history"
    help = "results over time: add a run, show outcomes per cell and version, plot them"
    actions = (HistoryAdd(), HistoryShow(), HistoryPlot())
