"""``vllm-repro fuzz``: Hypothesis' state machine over vLLM's real scheduler, one run per version."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.core.errors import BadInput, bad_choice
from harness.frontends.commands.command import Command
from harness.frontends.commands.face import interruptible, stderr_console
from harness.frontends.commands.invocation import Context, check_reports, run_context
from harness.frontends.commands.options import add_index_options, add_version_options, add_wheels_option
from harness.plan.matrix import PLATFORMS
from harness.run.sched_fuzz import (
    PROFILES,
    TIERS,
    FuzzResult,
    fuzz_spec,
    fuzz_versions,
    op_text,
    plan_document,
    summary_document,
    write_plan,
)
from harness.run.spec import RunConfig
from repro.core.wire import FUZZ_DEPTHS
from repro.sched.reach import HEADLINE as REACH_HEADLINE  # pure: coverage.py is imported only to measure

DESCRIPTION = (
    "Fuzz vLLM's real Scheduler/AsyncScheduler in-process (the scheduler tier) with a Hypothesis state machine: "
    "requests added (n > 1 ones as their children), steps with D = 1..3 frames in flight, drains, prefix-cache "
    "resets with frames in flight, keep-mode pauses, aborts, and KV-cache pressure, checking after every rule that "
    "each delivered stream is the tokens of its positions and at the end that every request finished. A failure "
    "that is a known bug of the release (its known-bug table row) is reported once as KNOWN and the run goes on; "
    "a new falsifying example is shrunk, printed "
    "as JSON and written to the reports folder; `vllm-repro plan FILE` replays it. Exit 0 when every version was "
    "fuzzed (a finding is not a failure unless --strict), 1 when one could not be, 2 on bad input."
)


def parse_ints(what: str, text: str, default: Sequence[int]) -> tuple[int, ...]:
    """A comma-separated list of integers (``default`` when empty); BadInput names the bad item."""
    if not text:
        return tuple(default)
    try:
        return tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError as exc:
        raise BadInput(f"--{what}: {text!r} is not a comma-separated list of integers") from exc


class FuzzCommand(Command):
    name = "fuzz"
    help = "fuzz vLLM's scheduler with a Hypothesis state machine (scheduler tier)"
    description = DESCRIPTION

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_version_options(parser)
        parser.add_argument("--tier", default="scheduler", help="what to fuzz: scheduler (the only tier so far)")
        parser.add_argument("--profile", default="ci",
                            help="; ".join(f"{k}: {p.examples} examples x {p.steps} rules" for k, p in
                                           PROFILES.items()) + " (default ci)")
        parser.add_argument("--examples", type=int, help="examples per version (default: the profile's)")
        parser.add_argument("--steps", type=int, help="rules per example (default: the profile's)")
        parser.add_argument("--seed", type=int, help="Hypothesis seed (default: random, printed; the same seed "
                                                     "and options repeat a run)")
        parser.add_argument("--depth", default="", help="frames in flight the setups may have: 1 (sync Scheduler), "
                                                        "2, 3 (AsyncScheduler); default 1,2,3")
        parser.add_argument("--spec-tokens", default="", help="scripted draft tokens per step the async setups may "
                                                              "have, e.g. 0,2 (default 0: no speculative decoding)")
        parser.add_argument("--no-reach", dest="reach", action="store_false",
                            help="do not measure reach (coverage.py over vLLM's scheduler files, on by default; "
                                 "it slows the examples down)")
        parser.add_argument("--strict", action="store_true", help="exit 1 when a falsifying example is found")
        parser.add_argument("--timeout", type=float, default=1800.0,
                            help="seconds one version's run may take, shrinking included (default 1800)")
        parser.add_argument("--platform", help=f"{' or '.join(PLATFORMS)} (default: detected); the scheduler tier "
                                               "runs on vLLM's CPU platform either way")
        parser.add_argument("--reports", type=Path, default=Path("reports/fuzz"),
                            help="output folder: fuzz.json, falsifying-VERSION.json, logs (default reports/fuzz)")
        add_wheels_option(parser)
        add_index_options(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        if args.tier not in TIERS:
            raise bad_choice("tier", args.tier, TIERS)
        spec = fuzz_spec(args.profile, args.examples, args.seed, parse_ints("depth", args.depth, FUZZ_DEPTHS),
                         parse_ints("spec-tokens", args.spec_tokens, (0,)), args.steps, args.reach)
        if args.timeout <= 0:
            raise BadInput(f"--timeout must be positive, got {args.timeout}")
        check_reports(args.reports)
        cfg = RunConfig(platform=ctx.platform, work_dir=args.reports, model_cache=ctx.cache / "models",
                        engine_timeout=args.timeout)
        versions = ctx.versions
        console = stderr_console()
        console.print(f"[bold]fuzz[/] scheduler tier, {', '.join(versions)}: profile {args.profile}, "
                      f"{spec.examples} examples x {spec.steps} rules, seed {spec.seed}, depths "
                      f"{','.join(map(str, spec.depths))}, spec tokens {','.join(map(str, spec.spec_tokens))}")
        results: list[FuzzResult] = []
        with interruptible(console, f"partial results are in {args.reports}"):
            for r in fuzz_versions(versions, spec, run_context(ctx, cfg), args.timeout):
                results.append(r)
                show(r, write_plan(r, args.reports) if r.found else None, replay_options(args))
        args.reports.mkdir(parents=True, exist_ok=True)  # no engine may have run (every env build failed)
        (args.reports / "fuzz.json").write_text(json.dumps(summary_document(results, spec, args.profile),
                                                           indent=2) + "\n")
        console.print(f"summary: {args.reports / 'fuzz.json'}")
        return exit_code(results, args.strict)


def exit_code(results: Sequence[FuzzResult], strict: bool) -> int:
    """0 when every version was fuzzed; 1 when one could not be, or (``strict``) when one has a finding."""
    return 1 if any(r.failed or (strict and r.found) for r in results) else 0


def replay_options(args: argparse.Namespace) -> str:
    """The options a replay needs to run on the same build: ``--wheels`` and ``--platform`` as given."""
    return "".join(f" --{k} {getattr(args, k)}" for k in ("wheels", "platform") if getattr(args, k, None))


def show(r: FuzzResult, plan: Path | None, options: str = "") -> None:
    """One version's result on stdout; a falsifying example with its replay command and its plan as JSON."""
    print(f"{r.version}: {headline(r)}")
    if r.status == "ran":
        print(f"  {speed(r)}")
        print(f"  covered: {coverage_line(r.coverage)}")
        for line in reach_lines(r.reach):
            print(f"  {line}")
    for what, why in r.dropped.items():
        print(f"  not drawn: {what}: {why}")
    for k in r.known:
        ops = "; ".join(op_text(o) for o in k.script.get("ops", []))
        print(f"  KNOWN {k.bug} (scenario {k.scenario}, {k.expect} there): {k.examples} example(s), first at "
              f"example {k.first_example}, dropped and the run went on; minimised to {k.ops} ops: {ops}")
        print(f"    state machine: {k.failure}")
    if r.log is not None and (r.failed or r.found):
        print(f"  log: {r.log}")
    if r.falsifying is None or plan is None:
        return
    f = r.falsifying
    by = f" (Hypothesis: {f.hypothesis_ops})" if f.hypothesis_ops not in (None, f.ops) else ""
    print(f"  shrunk to {f.ops} ops{by}: {f.ops_text()}" + ("" if f.shrunk else " (not Hypothesis' final replay)"))
    print(f"  state machine: {f.failure}")
    print(f"  replay: vllm-repro plan {plan} --versions {r.version}{options}")
    print(json.dumps(plan_document(r), indent=2))


def headline(r: FuzzResult) -> str:
    if r.falsifying is not None:
        known = f" (and {len(r.known)} known, below)" if r.known else ""
        return f"FALSIFIED (new) after {r.examples_to_failure} examples: {r.falsifying.verdict.summary}{known}"
    if r.status == "ran":
        known = f" ({len(r.known)} known, below)" if r.known else ""
        return f"nothing new found in {r.examples} examples{known}"
    return f"{r.outcome.value}: {r.reason}"


def speed(r: FuzzResult) -> str:
    cpu = f", {r.examples_per_cpu_s} per CPU second" if r.examples_per_cpu_s else ""
    return (f"{r.examples} examples (shrinking included) in {r.wall_s:.1f} s: {r.examples_per_s} examples/s{cpu}; "
            f"seed {r.seed}")


def coverage_line(cov: dict[str, Any]) -> str:
    ops = cov.get("ops") or {}
    setups = cov.get("setups") or {}
    return (", ".join(f"{k} {v}" for k, v in ops.items())
            + f"; setups {', '.join(f'{k}: {v}' for k, v in setups.items())}"
            + f"; resets with frames in flight {cov.get('inflight_resets', 0)}"
            + f"; examples with KV-cache preemptions {cov.get('kv_pressure_examples', 0)}")



def reach_lines(reach: dict[str, Any]) -> list[str]:
    """The measured reach (statements and branches run, per file) and how it grew with examples."""
    if not reach:
        return []
    if "error" in reach:
        return [f"reach: not measured ({reach['error']})"]
    files = reach.get("files") or {}
    named = [f"{name} {files[name]['percent']} %" for name in REACH_HEADLINE if name in files]
    lines = [f"reach ({reach.get('tool')}, {reach.get('core')}; statements+branches): " + ", ".join(named)]
    for name, doc in (reach.get("reachable") or {}).items():
        lines.append(f"reach of what a CPU run can reach: {name} {doc.get('percent')} % (left out: "
                     f"{len(doc.get('unreachable') or {})} functions of encoder inputs, KV transfers, Mamba, "
                     "structured output; fuzz.json names them and why)")
    growth = reach.get("growth") or []
    if growth:
        lines.append("reach by examples (" + "/".join(n.rsplit("/", 1)[-1] for n in REACH_HEADLINE) + "): " +
                     "; ".join(f"{g['examples']}: " + "/".join(str(g.get(n, "-")) for n in REACH_HEADLINE)
                               for g in growth))
    return lines
