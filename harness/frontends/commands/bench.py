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

from harness.bench.run import BenchRun, load_run
from harness.core.errors import BadInput, bad_choice
from harness.frontends.commands.base import Command
from harness.frontends.commands.context import Context

# The workloads, as the commands a user runs (the README's and tox's); extra arguments after -- are appended.
WORKLOADS: dict[str, tuple[str, ...]] = {
    "repro": ("matrix",),
    "sched": ("matrix", "--tier", "scheduler", "--scenario", "all"),
    "frameworks": ("frameworks", "check"),
}


class BenchCommand(Command):
    name = "bench"
    help = ("run a workload (repro, sched, frameworks) and write where its time went, per engine and phase, as "
            "JSON, a table and a timeline picture; --from reads an earlier run's reports folder instead")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("workload", nargs="?", default="repro", help=f"one of {', '.join(WORKLOADS)}")
        parser.add_argument("--from", dest="from_reports", type=Path, default=None, metavar="REPORTS",
                            help="read this reports folder (a matrix or frameworks run) instead of running")
        parser.add_argument("--out", type=Path, default=Path("reports/bench"),
                            help="where bench.json and timeline.png go (default reports/bench)")
        parser.add_argument("extra", nargs="*", help="after --: arguments for the workload's command")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.bench.plot import draw


        if args.workload not in WORKLOADS:
            raise bad_choice("workload", args.workload, tuple(WORKLOADS))
        if args.from_reports is not None:
            run = load_run(args.from_reports, args.workload)
        else:
            reports = args.out / "reports"
            wall = _run_workload(args.workload, _extra(args.extra), reports)
            run = load_run(reports, args.workload, wall)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(run.to_json(), indent=1) + "\n")
        draw(run, args.out / "timeline.png")
        _table(run)
        print(f"bench: {args.out / 'bench.json'}, {args.out / 'timeline.png'}")
        return 0


def _extra(extra: list[str]) -> list[str]:
    return extra[1:] if extra[:1] == ["--"] else list(extra)


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
