"""The scheduler-tier fuzzer, harness side: one ``python -m repro.sched`` fuzz run per version, judged.

The state machine itself (``repro/sched/fuzz.py``) runs inside each version's
vLLM env, all examples of a version in that one process; Hypothesis is staged
beside ``repro`` from the harness's own environment
(:func:`harness.run.runner.stage_distribution`).  What comes back is one ``fuzz``
event (``repro.core.wire``): how many examples ran, how fast, what they covered,
and the falsifying example Hypothesis shrank — its op script and that script
replayed as an ``ops`` scenario, which is judged here by
:func:`harness.sched.tier.sched_verdict`, the rule ``vllm-repro plan`` applies
to the same script: a falsifying example written as a plan replays to the
same outcome.

Library functions return frozen dataclasses; ``harness/frontends/commands/fuzz.py`` renders them.
"""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.core.cell import EngineKey, at_release
from harness.core.errors import BadInput, EnvBuildError
from harness.core.events import Event, FuzzEvent
from harness.core.oracle import CellVerdict, Outcome
from harness.run.context import RunContext
from harness.run.sched_process import SchedRun, run_sched
from harness.sched import tier as sched_tier
from harness.sched.fuzz_known import KnownFinding, known_document, known_findings, known_rows
from repro.core.wire import FuzzSpec

# Staged beside repro in the vLLM env: Hypothesis and its one dependency (both pure Python).
DISTRIBUTIONS = ("hypothesis", "sortedcontainers")
# With reach measured (``FuzzSpec.reach``), coverage.py too: its C tracer where the env's Python is the harness's,
# else coverage.py falls back to its pure-Python tracer (slower; the summary names the core it ran with).
REACH_DISTRIBUTIONS = ("coverage",)
TIERS = ("scheduler",)


@dataclass(frozen=True)
class FuzzProfile:
    """Hypothesis' budget: examples (max_examples) and rules per example (stateful_step_count)."""

    examples: int
    steps: int


PROFILES: dict[str, FuzzProfile] = {
    # ci: finds vllm#42043 on 0.21.0 within a few dozen examples; the rest is shrinking.
    "ci": FuzzProfile(examples=200, steps=25),
    "nightly": FuzzProfile(examples=2000, steps=50),
}


@dataclass(frozen=True)
class Falsifying:
    """The example Hypothesis shrank: the op script (replayable), what the state machine saw, and the replay."""

    script: dict[str, Any]  # the ``ops`` scenario's params (Script.to_dict())
    failure: str  # what failed in the state machine: an invariant, the teardown, or vLLM raising
    ops: int
    shrunk: bool  # recorded in Hypothesis' final replay of the shrunk example
    verdict: CellVerdict  # the script replayed as an ``ops`` scenario, judged as ``plan`` judges it
    hypothesis_ops: int | None = None  # ops of Hypothesis' shrunk example, before repro.sched.opmodel.minimise

    def ops_text(self) -> str:
        """The ops on one line: ``add r0; reset (2 in flight); run``."""
        return "; ".join(op_text(o) for o in self.script.get("ops", []))


def op_text(op: Mapping[str, Any]) -> str:
    """One op as text: ``add r0``, ``step 3``, ``reset (2 in flight)``, ``run``."""
    kind = op["op"]
    if kind in ("add", "abort", "feed", "close"):
        return f"{kind} {op['rid']}"
    if kind == "abort_many":
        return f"abort {','.join(op['rids'])}"
    if kind == "step":
        return f"step {op.get('n', 1)}"
    if kind == "reset":
        flight = f"{op['in_flight']} in flight" if "in_flight" in op else ""
        conn = "connector" if op.get("connector") else ""
        return "reset" + (f" ({', '.join(x for x in (flight, conn) if x)})" if flight or conn else "")
    return str(kind)


@dataclass(frozen=True)
class FuzzResult:
    """One version fuzzed: ``status`` ran (with or without a falsifying example), unsupported, error,
    build-failed or timeout, with the run's numbers."""

    version: str
    status: str
    seed: int
    examples: int = 0
    examples_to_failure: int | None = None
    wall_s: float = 0.0
    cpu_s: float | None = None
    falsifying: Falsifying | None = None
    reason: str | None = None
    coverage: dict[str, Any] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # setups this release cannot build, and why
    log: Path | None = None
    hypothesis_version: str | None = None
    reach: dict[str, Any] = field(default_factory=dict)  # repro.sched.reach: coverage of vLLM's scheduler files
    known: tuple[KnownFinding, ...] = ()  # known-bug rows met (each once), the examples dropped, the run went on

    @property
    def examples_per_s(self) -> float | None:
        return round(self.examples / self.wall_s, 1) if self.wall_s > 0 and self.examples else None

    @property
    def examples_per_cpu_s(self) -> float | None:
        return round(self.examples / self.cpu_s, 1) if self.cpu_s and self.examples else None

    @property
    def found(self) -> bool:
        return self.falsifying is not None

    @property
    def outcome(self) -> Outcome:
        """OK when the run found nothing, the falsifying example's outcome, else the infrastructure outcome."""
        if self.status == "ran":
            return self.falsifying.verdict.outcome if self.falsifying is not None else Outcome.OK
        return {"unsupported": Outcome.UNSUPPORTED, "build-failed": Outcome.BUILD_FAILED,
                "timeout": Outcome.TIMEOUT}.get(self.status, Outcome.ERROR)

    @property
    def failed(self) -> bool:
        """The version could not be fuzzed (not a finding: exit 1 like a matrix ERROR)."""
        return self.status in ("error", "build-failed", "timeout")


def fuzz_spec(profile: str, examples: int | None, seed: int | None, depths: Sequence[int],
              spec_tokens: Sequence[int], steps: int | None = None, reach: bool = False) -> FuzzSpec:
    """The run's FuzzSpec from the command's options; BadInput names the bad one.  No seed: a random one (reported,
    so the run can be repeated with ``--seed``)."""
    if profile not in PROFILES:
        raise BadInput(f"unknown profile {profile!r}; valid choices: {', '.join(PROFILES)}")
    for name, value in (("examples", examples), ("steps", steps)):
        if value is not None and value < 1:
            raise BadInput(f"--{name} must be at least 1, got {value}")
    p = PROFILES[profile]
    try:
        return FuzzSpec(examples or p.examples, steps or p.steps, random.randrange(2**32) if seed is None else seed,
                        tuple(depths), tuple(spec_tokens), reach=reach)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc


def fuzz_versions(versions: Sequence[str], spec: FuzzSpec, ctx: RunContext, timeout: float,
                  on_event: Callable[[str, Event], None] | None = None) -> Iterator[FuzzResult]:
    """Fuzz each version in turn, lazily (each result as soon as its run ends)."""
    for v in versions:
        yield fuzz_version(v, spec, ctx, timeout, on_event)


def fuzz_version(version: str, spec: FuzzSpec, ctx: RunContext, timeout: float,
                 on_event: Callable[[str, Event], None] | None = None) -> FuzzResult:
    """Fuzz vLLM's scheduler of ``version``: one process, every example in it."""
    try:
        env = ctx.env(version)
    except EnvBuildError as exc:
        return FuzzResult(version, "build-failed", spec.seed, reason=str(exc))
    engine = at_release(EngineKey(version, "mp", True, tier="scheduler"))
    spec = replace(spec, known=known_rows(version))  # a failure fitting one is KNOWN, and the run goes on
    doc = sched_tier.sched_spec(engine, [], str(ctx.cfg.model_cache.resolve()), ctx.cfg.model_params, fuzz=spec)
    dists = DISTRIBUTIONS + (reach_distributions() if spec.reach else ())
    run = run_sched(env, engine, ctx.cfg, f"fuzz-{version}", doc, timeout, dists,
                    None if on_event is None else lambda ev: on_event(version, ev))
    return fuzz_result(version, spec, run)


def reach_distributions() -> tuple[str, ...]:
    """coverage.py to stage, where the harness's env has it; without it the run goes on and its ``reach`` says why
    it was not measured (the engine side cannot import it)."""
    return REACH_DISTRIBUTIONS if importlib.util.find_spec("coverage") is not None else ()


def fuzz_result(version: str, spec: FuzzSpec, run: SchedRun) -> FuzzResult:
    """The ``fuzz`` event of ``run`` as a FuzzResult (timeout or error when the process never sent one)."""
    ev = run.first(FuzzEvent)
    if ev is None:
        return FuzzResult(version, "timeout" if run.timed_out else "error", spec.seed, reason=run.problem,
                          log=run.log, wall_s=run.wall_s)
    return FuzzResult(
        version, ev.status, spec.seed if ev.seed is None else ev.seed, ev.examples, ev.examples_to_failure,
        ev.wall_s, ev.cpu_s, falsifying(ev), ev.reason, dict(ev.coverage), dict(ev.dropped), run.log,
        ev.hypothesis_version, dict(ev.reach), known_findings(ev.raw.get("known")))


def falsifying(ev: FuzzEvent) -> Falsifying | None:
    """A ``fuzz`` event's falsifying example (None: nothing found), its replay judged by the scheduler tier's one
    rule."""
    doc, replay = ev.falsifying, ev.replay
    if doc is None or replay is None:
        return None
    hyp = doc.get("hypothesis_ops")
    return Falsifying(dict(doc["script"]), str(doc.get("failure", "")), int(doc.get("ops", 0)),
                      bool(doc.get("shrunk")), sched_tier.sched_verdict(replay),
                      hyp if isinstance(hyp, int) else None)


def plan_document(r: FuzzResult) -> dict[str, Any]:
    """The falsifying example as a ``vllm-repro plan`` file: the script, and where it was found (informative)."""
    if r.falsifying is None:
        raise ValueError(f"{r.version}: no falsifying example")
    f = r.falsifying
    return {"tier": "scheduler", "script": f.script,
            "found": {"version": r.version, "seed": r.seed, "outcome": f.verdict.label, "summary": f.verdict.summary,
                      "failure": f.failure, "hypothesis": r.hypothesis_version}}


def write_plan(r: FuzzResult, reports: Path) -> Path:
    """Write the falsifying example of ``r`` as ``reports/falsifying-<version>.json``."""
    reports.mkdir(parents=True, exist_ok=True)
    path = reports / f"falsifying-{r.version}.json"
    path.write_text(json.dumps(plan_document(r), indent=2) + "\n")
    return path


def summary_document(results: Sequence[FuzzResult], spec: FuzzSpec, profile: str) -> dict[str, Any]:
    """Every version's result (``reports/fuzz.json``)."""
    return {"schema": "vllm-repro/fuzz", "schema_version": 1, "tier": "scheduler", "profile": profile,
            "settings": spec.to_json(), "versions": [_result_doc(r) for r in results]}


def _result_doc(r: FuzzResult) -> dict[str, Any]:
    doc = {"version": r.version, "status": r.status, "outcome": r.outcome.value, "seed": r.seed,
           "examples": r.examples, "examples_to_failure": r.examples_to_failure, "wall_s": r.wall_s,
           "cpu_s": r.cpu_s, "examples_per_s": r.examples_per_s, "examples_per_cpu_s": r.examples_per_cpu_s,
           "reason": r.reason, "coverage": r.coverage, "reach": r.reach or None, "dropped": r.dropped,
           "log": None if r.log is None else str(r.log), "falsifying": None,
           "known": [known_document(k, r.version) for k in r.known]}
    if r.falsifying is not None:
        doc["falsifying"] = {**plan_document(r), "ops": r.falsifying.ops, "shrunk": r.falsifying.shrunk}
    return doc
