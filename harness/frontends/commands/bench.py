"""``vllm-repro bench``: run a named workload (or read an earlier run) and say where its time went."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.bench.cpu import CpuSample, CpuSampler
from harness.bench.fuzz import load_fuzz
from harness.bench.per_scenario import profile_totals, scenario_totals
from harness.bench.pytest_run import load_pytest
from harness.bench.run import BenchRun, load_bench_json, load_run
from harness.bench.svg import write_svg
from harness.core.errors import BadInput, bad_choice
from harness.frontends.commands.command import Command
from harness.frontends.commands.invocation import Context

# The workloads, as the commands a user runs (the README's and tox's); extra arguments after -- are appended.
WORKLOADS: dict[str, tuple[str, ...]] = {
    "repro": ("matrix",),
    "sched": ("matrix", "--tier", "scheduler", "--scenario", "all"),
    "frameworks": ("frameworks", "check"),
    "fuzz": ("fuzz",),  # the scheduler-tier fuzzer's ci profile; its examples per CPU second go in bench.json
    # pytest, not the CLI: the matrix as test items, as `tox -e post-resume` runs it (tox.ini); its engines' sessions
    # kept for the breakdown (harness.bench.pytest_run).
    "post-resume": ("tests/integration/test_post_resume.py", "-n", "auto", "--dist", "loadgroup"),
}
PYTEST_WORKLOADS = ("post-resume",)


class BenchCommand(Command):
    name = "bench"
    help = ("run a workload (repro, sched, frameworks, fuzz, post-resume) and write where its time went, per engine, "
            "phase and scenario, as JSON, a table and a timeline picture (SVG; PNG too with matplotlib); --from "
            "reads an earlier run's reports folder instead")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("workload", nargs="?", default="repro", help=f"one of {', '.join(WORKLOADS)}")
        parser.add_argument("--from", dest="from_reports", type=Path, default=None, metavar="REPORTS",
                            help="read this reports folder (a matrix, frameworks, fuzz or post-resume run) instead of "
                                 "running, or a bench.json to draw its picture again")
        parser.add_argument("--out", type=Path, default=Path("reports/bench"),
                            help="where bench.json and timeline.svg (and .png) go (default reports/bench)")
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
        if args.from_reports is not None and args.from_reports.is_file():  # a bench.json: its picture drawn again
            run = load_bench_json(args.from_reports)
        elif args.from_reports is not None:
            run = _load(args.workload, args.from_reports, None, None, ())
        else:
            reports = args.out / "reports"
            started, load_start = time.time(), os.getloadavg()
            wall, cpu, argv = _run_workload(args.workload, args.extra, reports)
            run = _load(args.workload, reports, wall, started, argv)
            run = replace(run, cpu=cpu, machine={**run.machine, **_machine(load_start)})
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(run.to_json(), indent=1) + "\n")
        pictures = [args.out / "timeline.svg"]
        write_svg(run, pictures[0])
        if draw(run, args.out / "timeline.png"):
            pictures.append(args.out / "timeline.png")
        _table(run)
        print(f"bench: {', '.join(str(p) for p in [args.out / 'bench.json', *pictures])}")
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
    if workload in PYTEST_WORKLOADS:
        return load_pytest(reports, wall, started, argv or (workload,))
    return load_run(reports, workload, wall)


def _machine(load_start: tuple[float, float, float]) -> dict[str, object]:
    """Where the run ran: the host, its CPUs and the load average (1, 5, 15 min) before and after the run."""
    return {"host": platform.node(), "cpus": os.cpu_count(), "load_start": [round(v, 2) for v in load_start],
            "load_end": [round(v, 2) for v in os.getloadavg()]}


def _workload_argv(workload: str, extra: list[str], reports: Path) -> list[str]:
    """The command line of ``workload``: the CLI's command, or pytest on the checkout's test file (run from the
    checkout's root, where pyproject.toml loads the plugin)."""
    if workload not in PYTEST_WORKLOADS:
        return [sys.executable, "-m", "harness.frontends.cli", *WORKLOADS[workload], "--reports", str(reports),
                *extra]
    if not Path(WORKLOADS[workload][0]).is_file():
        raise BadInput(f"the {workload} workload runs the checkout's {WORKLOADS[workload][0]}: run vllm-repro bench "
                       f"{workload} from the checkout's root")
    return [sys.executable, "-m", "pytest", *WORKLOADS[workload], "--repro-reports", str(reports),
            "--repro-keep-engines", *extra]


def _no_reports_option(workload: str, extra: list[str], reports: Path) -> None:
    """Bench gives the workload its reports folder (``OUT/reports``, where it reads them back): a workload argument
    naming another would run the whole workload and then find nothing to read (seen: 218 s, then exit 2)."""
    option = "--repro-reports" if workload in PYTEST_WORKLOADS else "--reports"
    if any(a == option or a.startswith(f"{option}=") for a in extra):
        raise BadInput(f"bench writes the {workload} workload's reports to {reports} (--out X: X/reports): "
                       f"leave {option} out of the workload's arguments")


def _run_workload(workload: str, extra: list[str], reports: Path
                  ) -> tuple[float, CpuSample | None, tuple[str, ...]]:
    """The workload's command in a process of its own (as a user runs it): its wall time, its processes' CPU
    seconds sampled per engine (harness.bench.cpu), its command line."""
    if reports.exists() and any(reports.iterdir()):
        raise BadInput(f"{reports} is not empty: give another --out, or remove it")
    _no_reports_option(workload, extra, reports)
    argv = _workload_argv(workload, extra, reports)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv)
    sampler = CpuSampler(reports, proc.pid).start()
    rc = proc.wait()
    cpu = sampler.stop()
    # 1: a run with ERROR cells (pytest: failed items) still has a breakdown; 2: bad input, nothing ran
    if rc not in (0, 1):
        raise BadInput(f"the {workload} workload exited {rc}: {' '.join(argv[3:])}")
    return round(time.monotonic() - t0, 3), cpu, tuple(argv[3:])


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
    _scenario_table(run)
    if run.cpu is not None:
        print(f"CPU seconds of the workload's processes (sampled): {run.cpu.cpu_s:.0f}; machine: {run.machine}")
    for v in run.workload_facts.get("fuzz", ()):
        print(f"fuzz {v['version']}: {v['examples']} examples in {v['cpu_s']} CPU s: {v['examples_per_cpu_s']} per CPU "
              f"second; reach of scheduler.py {v['reach_scheduler_py']} % ({v['reach_of_reachable']} % of what a "
              "CPU run can reach)")


def _scenario_table(run: BenchRun) -> None:
    """Per scenario: its cells, their engine-seconds and its engines; per engine profile: what its engines cost."""
    scenarios, profiles = scenario_totals(run.engines), profile_totals(run.engines)
    if not scenarios:
        return
    table = Table(title="per scenario (engines are started per engine profile; bench.json names the scenarios each "
                        "shares its engines with)")
    for col in ("scenario", "cells", "engine-s in its cells", "profile", "engines", "shared with"):
        table.add_column(col)
    for name, row in scenarios.items():
        table.add_row(name, str(row["cells"]), f"{row['scenario_s']:.1f}", row["profile"], str(len(row["engines"])),
                      str(len(row["shared_with"])) if row["shared_with"] else "none: engines of its own")
    Console().print(table)
    table = Table(title="per engine profile (engine-s: first span to last, every engine of it)")
    for col in ("profile", "engines", "engine-s", "of which start-up", "scenarios"):
        table.add_column(col)
    for name, row in profiles.items():
        table.add_row(name, str(row["engines"]), f"{row['engine_s']:.1f}", f"{row['startup_s']:.1f}",
                      f"{row['scenario_s']:.1f}")
    Console().print(table)
