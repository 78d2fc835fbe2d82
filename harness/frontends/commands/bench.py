"""``vllm-repro bench``: run a named workload (or read an earlier run) and say where its time went."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.bench.fuzz import load_fuzz
from harness.bench.run import BenchRun, load_run
from harness.core.errors import BadInput, bad_choice
from harness.frontends.commands.command import Command
from harness.frontends.commands.invocation import Context

# The workloads, as the commands a user runs (the README's and tox's); extra arguments after -- are appended.
WORKLOADS: dict[str, tuple[str, ...]] = {
    "repro": ("matrix",),
    "sched": ("matrix", "--tier", "scheduler", "--scenario", "all"),
    "frameworks": ("frameworks", "check"),
    "fuzz": ("fuzz",),  # the scheduler-tier fuzzer's ci profile; its examples per CPU second go in bench.json
}


class BenchCommand(Command):
    name = "bench"
    help = ("run a workload (repro, sched, frameworks, fuzz) and write where its time went, per engine and phase, as "
            "JSON, a table and a timeline picture; --from reads an earlier run's reports folder instead")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("workload", nargs="?", default="repro", help=f"one of {', '.join(WORKLOADS)}")
        parser.add_argument("--from", dest="from_reports", type=Path, default=None, metavar="REPORTS",
                            help="read this reports folder (a matrix, frameworks or fuzz run) instead of running")
        parser.add_argument("--out", type=Path, default=Path("reports/bench"),
                            help="where bench.json and timeline.png go (default reports/bench)")
        # REMAINDER, not "*": with subcommands, argparse (3.11) rejects what follows "--" for a "*" positional
        # ("unrecognized arguments: -- --versions ...").  REMAINDER also takes bench's own options written after the
        # workload; run() reads those back (_own_options).
        parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: arguments for the workload's command")
        self._own = parser

    def _own_options(self, args: argparse.Namespace) -> argparse.Namespace:
        """``args`` with bench's options written after the workload parsed, and ``extra`` what follows --."""
        own, workload_args = _split(list(args.extra))
        if own:
            args = self._own.parse_args([*own, args.workload], namespace=args)
        args.extra = workload_args
        return args

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.bench.timeline import draw

        args = self._own_options(args)
        if args.workload not in WORKLOADS:
            raise bad_choice("workload", args.workload, tuple(WORKLOADS))
        if args.from_reports is not None:
            run = _load(args.workload, args.from_reports, None, None, ())
        else:
            reports = args.out / "reports"
            started = time.time()
            wall = _run_workload(args.workload, args.extra, reports)
            run = _load(args.workload, reports, wall, started, (*WORKLOADS[args.workload], *args.extra))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(run.to_json(), indent=1) + "\n")
        draw(run, args.out / "timeline.png")
        _table(run)
        print(f"bench: {args.out / 'bench.json'}, {args.out / 'timeline.png'}")
        return 0


OWN_OPTIONS = ("--out", "--from")


def _split(extra: list[str]) -> tuple[list[str], list[str]]:
    """``extra`` as (bench's own options, the workload's arguments after --).  argparse keeps the "--" only when
    bench's options came before it; without it, leading ``--out X`` / ``--from X`` are bench's."""
    if "--" in extra:
        i = extra.index("--")
        return extra[:i], extra[i + 1:]
    i = 0
    while i < len(extra) and extra[i].split("=")[0] in OWN_OPTIONS:
        i += 1 if "=" in extra[i] else 2
    return extra[:i], extra[i:]


def _load(workload: str, reports: Path, wall: float | None, started: float | None, argv: tuple[str, ...]
          ) -> BenchRun:
    """The run's breakdown: a fuzz run from its processes' events (it leaves no results.json), the rest from
    results.json and the engines' events and logs."""
    if workload == "fuzz":
        return load_fuzz(reports, wall, started, argv or (workload,))
    return load_run(reports, workload, wall)


def _run_workload(workload: str, extra: list[str], reports: Path) -> float:
    """The workload's command in a process of its own (as a user runs it); its wall time."""
    if reports.exists() and any(reports.iterdir()):
        raise BadInput(f"{reports} is not empty: give another --out, or remove it")
    argv = [sys.executable, "-m", "harness.frontends.cli", *WORKLOADS[workload], "--reports", str(reports), *extra]
    t0 = time.monotonic()
    rc = subprocess.run(argv, check=False).returncode
    if rc not in (0, 1):  # 1: a run with ERROR cells still has a breakdown; 2: bad input, nothing ran
        raise BadInput(f"the {workload} workload exited {rc}: {' '.join(argv[3:])}")
    return round(time.monotonic() - t0, 3)


def _table(run: BenchRun) -> None:
    table = Table(title=f"where the time went: {run.workload} ({run.run_s:.0f} s run, {len(run.engines)} engines)")
    for col in ("phase", "seconds", "share of engine time"):
        table.add_column(col)
    phases = run.phase_seconds()
    engine_total = sum(v for k, v in phases.items() if k != "environments") or 1.0
    for phase, secs in phases.items():
        share = "" if phase == "environments" else f"{100 * secs / engine_total:.0f} %"
        if secs:
            table.add_row(phase, f"{secs:.1f}", share)
    Console().print(table)
    for v in run.workload_facts.get("fuzz", ()):
        print(f"fuzz {v['version']}: {v['examples']} examples in {v['cpu_s']} CPU s: {v['examples_per_cpu_s']} per CPU "
              f"second; reach of scheduler.py {v['reach_scheduler_py']} % ({v['reach_of_reachable']} % of what a "
              "CPU run can reach)")
