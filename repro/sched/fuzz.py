"""Fuzz vLLM's real scheduler with a Hypothesis ``RuleBasedStateMachine`` (the answer to a spec's ``fuzz``).

Runs inside the vLLM environment, in the one ``python -m repro.sched``
process of a version: vLLM is imported once and every example builds a fresh
``Scheduler`` / ``AsyncScheduler`` from it (a few milliseconds), so examples
cost the scheduler's own work, not start-ups.  Hypothesis comes from the
harness's own environment, staged beside ``repro`` (``harness.run.runner.stage_repro``):
nothing is installed into the cached vLLM environment.

One example: an ``initialize`` rule draws the setup (depth D — 1 is the sync
Scheduler, 2 and 3 the AsyncScheduler with D frames in flight —, KV-cache
blocks, from 3 (heavy preemption under memory pressure) to plenty, draft tokens,
max_num_seqs); then rules add requests (short prompts from a small alphabet, so
prefix-cache hits happen; max_tokens small, so requests finish by length),
step the engine core, drain, reset the prefix cache with 0..D-1 frames in flight
(``reset_running_requests=True``), pause and resume (keep mode; where the
release has ``set_pause_state``) and abort running requests.  The invariant
after every rule: every delivered stream is the tokens of its positions
(``opmodel.stream_fault``); at teardown the scheduler runs to completion and
every request that was not aborted must have finished with all its tokens
(``opmodel.finish_fault``); vLLM raising is a failure too.

The falsifying example Hypothesis shrank is kept as its op script
(``opmodel.FuzzState.script``) and replayed once more as an ``ops`` scenario,
the path ``vllm-repro plan`` takes, so the harness judges both the same way.
The rules and checks are :mod:`repro.sched.opmodel` (pure, unit-tested).
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import hypothesis
from hypothesis import HealthCheck, Verbosity, reject, seed, settings
from hypothesis import strategies as st
from hypothesis.control import current_build_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from repro.crash import vllm_crash_site
from repro.sched.adapter import Unsupported
from repro.sched.executor import Executor
from repro.sched.opmodel import (
    BUDGETS,
    LONG_PROMPT,
    MAX_PROMPT,
    MIN_BLOCKS,
    PROMPT_ALPHABET,
    FuzzState,
    Knobs,
    drawn_setup,
    failure_kind,
    finish_fault,
    minimise,
    prompt_tokens,
    setup_for,
    stream_fault,
)
from repro.sched.reach import CHECKPOINTS, Reach
from repro.sched.scenario import run_scenario
from repro.sched.script import PAUSE_STATES, POLICIES, Op, Script, Setup
from repro.wire import FUZZ_DEPTHS, FUZZ_MAX_SPEC_TOKENS, FuzzSpec

MAX_TOKENS = 16
FIRST_REQUESTS = 4  # requests the initialize rule adds, at most
MAX_NUM_SEQS = (16, 4, 2)  # 2: requests wait for a slot, not only for blocks


@dataclass
class Failure:
    script: Script
    failure: str  # the exception Hypothesis saw: "AssertionError: r0: position 3: ..."
    final: bool  # recorded during Hypothesis' final replay of the shrunk example
    kind: str  # opmodel.failure_kind: what a smaller script must hit to fail alike


@dataclass
class FuzzStats:
    """What the run did, gathered by every example: how many, what they covered, and the last failure."""

    examples: int = 0
    examples_to_failure: int | None = None
    ops: Counter[str] = field(default_factory=Counter)
    setups: Counter[str] = field(default_factory=Counter)
    inflight_resets: int = 0
    kv_pressure_examples: int = 0  # vLLM preempted more often than the resets did: memory pressure
    finished_by_length: int = 0
    requests: Counter[int] = field(default_factory=Counter)  # requests per example that ran to completion
    failure: Failure | None = None

    def failed(self, state: FuzzState, exc: BaseException) -> None:
        if self.examples_to_failure is None:
            self.examples_to_failure = self.examples
        final = _is_final(current_build_context)
        if self.failure is None or final or not self.failure.final:
            self.failure = Failure(state.script(), describe(exc), final, kind_of(exc))

    def coverage(self) -> dict[str, Any]:
        return {"ops": dict(sorted(self.ops.items())), "setups": dict(sorted(self.setups.items())),
                "inflight_resets": self.inflight_resets, "kv_pressure_examples": self.kv_pressure_examples,
                "finished_by_length": self.finished_by_length,
                "requests_per_example": {str(k): v for k, v in sorted(self.requests.items())}}


def describe(exc: BaseException) -> str:
    """An exception on one line; one raised in vLLM's code names its frame and source line (a bare assert has no
    message)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    site = vllm_crash_site(exc)
    return text if site is None else f"{text} {site[1]} at {site[0]}".replace(":  ", ": ")


def kind_of(exc: BaseException) -> str:
    site = vllm_crash_site(exc)
    return failure_kind(str(exc), None if site is None else site[0])


def _is_final(context: Callable[[], Any]) -> bool:
    try:
        return bool(context().is_final)
    except Exception:  # no build context: not inside a Hypothesis example
        return False


def setup_label(setup: Setup) -> str:
    return f"D={setup.depth}" + (f",k={setup.spec_tokens}" if setup.spec_tokens else "")


@dataclass
class FuzzRun:
    """What every example of one run shares: the release's adapter, the checkpoint, the settings and the stats."""

    adapter: Any
    model_dir: Path
    perm: list[int]
    spec: FuzzSpec
    stats: FuzzStats
    reach: Any = None  # repro.sched.reach.Reach while measuring

    def started_example(self) -> None:
        """Count an example; after 32, 64, 128, ... record the reach so far."""
        done = self.stats.examples
        if self.reach is not None and done in CHECKPOINTS:
            self.reach.checkpoint(done)
        self.stats.examples += 1


# Setups are drawn raw and mapped onto the run's choices (opmodel.drawn_setup), so the rules are written once:
# (depth index, KV-cache blocks, draft-count index, drafts accepted, max_num_seqs).  Blocks: plenty, a few, or
# 3..5 (requests are preempted under memory pressure); Hypothesis shrinks towards the first branch, so a
# falsifying example has memory pressure only where the failure needs it.
BLOCKS = st.one_of(st.just(64), st.integers(6, 12), st.integers(MIN_BLOCKS, 5))
SETUPS = st.tuples(st.integers(0, len(FUZZ_DEPTHS) - 1), BLOCKS, st.integers(0, FUZZ_MAX_SPEC_TOKENS),
                   st.integers(0, FUZZ_MAX_SPEC_TOKENS), st.sampled_from(MAX_NUM_SEQS))
# The scheduler options (opmodel.Knobs): token budget (small ones prefill long prompts in chunks), policy,
# long_prefill_token_threshold, the scheduler's stats, prefix caching off.  Each shrinks to vLLM's default.
KNOBS = st.builds(Knobs, st.sampled_from(BUDGETS), st.sampled_from(POLICIES), st.sampled_from((0, 8, 24)),
                  st.booleans(), st.booleans())
# (first prompt token, prompt length, max_tokens, priority): see opmodel.prompt_tokens.  Long prompts exceed the
# smaller token budgets: prefilled in chunks, several at once, aborted or preempted mid-prefill.
LENGTHS = st.one_of(st.integers(1, MAX_PROMPT), st.integers(MAX_PROMPT + 1, LONG_PROMPT))
REQUESTS = st.tuples(st.integers(0, PROMPT_ALPHABET - 1), LENGTHS, st.integers(1, MAX_TOKENS), st.integers(0, 2))


class SchedulerMachine(RuleBasedStateMachine):
    """One example: a fresh scheduler of the run's release, driven by the rules; see the module docstring."""

    run: ClassVar[FuzzRun]  # set on the subclass run_fuzz makes for each run

    def __init__(self) -> None:
        super().__init__()
        self.run.started_example()
        self.state: FuzzState | None = None
        self.ex: Executor | None = None
        self.failed = False

    @initialize(drawn=SETUPS, knobs=KNOBS, first=st.lists(REQUESTS, min_size=1, max_size=FIRST_REQUESTS))
    def build(self, drawn: tuple[int, int, int, int, int], knobs: Knobs, first: list[tuple[int, int, int, int]]
              ) -> None:
        run = self.run
        setup = drawn_setup(run.spec.depths, run.spec.spec_tokens, *drawn, knobs=knobs)
        try:
            sched = run.adapter.scheduler(run.model_dir, setup)
        except Unsupported:
            reject()  # this release cannot build this setup (dropped and reported before the run)
        self.state = FuzzState(setup, run.adapter.pause_states() is not None, run.spec.max_requests)
        self.ex = Executor(Script(setup, (), ()), sched, run.adapter, run.perm,
                           run.adapter.block_hasher(setup.block_size))
        run.stats.setups[setup_label(setup)] += 1
        # Every example schedules something, most several requests at once (Hypothesis' swarm testing disables
        # ``add_request`` in many examples, and KV-cache pressure needs requests running side by side).
        for request in first:
            self.add(*request)

    def _apply(self, op: Op) -> dict[str, Any]:
        assert self.state is not None and self.ex is not None
        self.state.record(op)
        self.run.stats.ops[op.op] += 1
        entry = apply(self.ex, op)
        if entry.get("in_flight_at_reset"):
            self.run.stats.inflight_resets += 1
        return entry

    def _guarded(self, fn: Callable[[], Any]) -> None:
        """Run ``fn``; a failure is recorded with this example's script, then re-raised for Hypothesis."""
        try:
            fn()
        except BaseException as exc:
            if self.state is not None and not self.failed:
                self.run.stats.failed(self.state, exc)
            self.failed = True
            raise

    def _running(self) -> list[str]:
        assert self.ex is not None
        return [s.rid for s in self.ex.streams.values() if s.submitted and not s.done]

    @precondition(lambda self: self.state is not None and self.state.can_add())
    @rule(request=REQUESTS)
    def add_request(self, request: tuple[int, int, int, int]) -> None:
        self.add(*request)

    @precondition(lambda self: self.state is not None and self.state.can_add())
    @rule(burst=st.lists(REQUESTS, min_size=2, max_size=5))
    def add_burst(self, burst: list[tuple[int, int, int, int]]) -> None:
        """Several requests between two steps (a client's batch): they compete for one step's token budget."""
        for request in burst:
            if self.state is not None and self.state.can_add():
                self.add(*request)

    def add(self, first: int, prompt_len: int, max_tokens: int, priority: int = 0) -> None:
        assert self.state is not None and self.ex is not None
        op, req = self.state.add(prompt_tokens(first, prompt_len), max_tokens, priority)
        self.ex.declare(req)
        self._guarded(lambda: self._apply(op))

    @rule(n=st.integers(1, 8))
    def step(self, n: int) -> None:
        self._guarded(lambda: self._apply(Op("step", n=n)))

    @rule()
    def drain(self) -> None:
        self._guarded(lambda: self._apply(Op("drain")))

    # No rule fills the batch queue: between two EngineCore iterations (where adds, aborts, pauses and resets
    # run) at most D-1 frames are in flight (FuzzState.reset); D in flight would be a state no engine reaches.
    @rule()
    def pop(self) -> None:
        """Process the oldest frame without scheduling (as when nothing more could be scheduled)."""
        self._guarded(lambda: self._apply(Op("pop")))

    @rule(in_flight=st.sampled_from((None, 0, 1, 2)))
    def reset(self, in_flight: int | None) -> None:
        assert self.state is not None
        op = self.state.reset(in_flight)
        self._guarded(lambda: self._apply(op))

    @precondition(lambda self: self.state is not None and self.state.can_pause())
    @rule(mode=st.sampled_from(PAUSE_STATES))
    def pause(self, mode: str) -> None:
        self._guarded(lambda: self._apply(Op("pause", mode=None if mode == "keep" else mode)))

    @precondition(lambda self: self.state is not None and self.state.can_resume())
    @rule()
    def resume(self) -> None:
        self._guarded(lambda: self._apply(Op("resume")))

    @precondition(lambda self: self.ex is not None and bool(self._running()))
    @rule(pick=st.integers(0, 7))
    def abort(self, pick: int) -> None:
        assert self.state is not None
        op = self.state.abort(self._running(), pick)
        if op is not None:
            self._guarded(lambda: self._apply(op))

    def _prefilling(self) -> list[str]:
        """Running requests vLLM has computed part of the prompt of: a chunked prefill under way."""
        assert self.ex is not None
        return [rid for rid in self._running()
                if 0 < getattr(self.ex.streams[rid].request, "num_computed_tokens", 0)
                < getattr(self.ex.streams[rid].request, "num_prompt_tokens", 0)]

    @precondition(lambda self: self.ex is not None and bool(self._prefilling()))
    @rule(pick=st.integers(0, 7))
    def abort_mid_prefill(self, pick: int) -> None:
        """Abort a request between two chunks of its prompt (frames of the chunk may be in flight)."""
        assert self.state is not None
        op = self.state.abort(self._prefilling(), pick)
        if op is not None:
            self._guarded(lambda: self._apply(op))

    @invariant()
    def streams_follow_positions(self) -> None:
        if self.ex is not None and not self.failed:
            self._guarded(self._check_streams)

    def _check_streams(self) -> None:
        assert self.ex is not None
        check_streams(self.ex)

    def teardown(self) -> None:
        if self.ex is None or self.state is None or self.failed:
            return
        self._guarded(self._run_to_completion)

    def _run_to_completion(self) -> None:
        assert self.ex is not None and self.state is not None
        for op in self.state.tear_down():
            self._apply(op)
        check_streams(self.ex)
        check_finished(self.ex)
        _count_finish(self.ex, self.run.stats)
        shutdown = getattr(self.ex.sched, "shutdown", None)
        if shutdown is not None:  # as EngineCore does at the end: a scheduler with nothing left must shut down
            shutdown()


def apply(ex: Executor, op: Op) -> dict[str, Any]:
    """One op; the executor's bound (vLLM never finished a request) as the failure it is."""
    try:
        return ex.apply(op)
    except StopIteration:
        raise AssertionError(f"stalled: {ex.stalled}") from None


def check_streams(ex: Executor) -> None:
    """The invariant: every delivered stream is the tokens of its positions."""
    for s in ex.streams.values():
        fault = stream_fault(s.reference, s.observed, s.max_tokens) if s.submitted else None
        assert fault is None, f"{s.rid}: {fault}"


def check_finished(ex: Executor) -> None:
    """After the run to completion: every request not aborted finished with all its tokens."""
    for s in ex.streams.values():
        fault = finish_fault(len(s.observed), s.max_tokens, s.finish_reason, s.aborted) if s.submitted else None
        assert fault is None, f"{s.rid}: {fault}"


def _count_finish(ex: Executor, stats: FuzzStats) -> None:
    by_resets = sum(e.get("running_at_reset", 0) for e in ex.log)
    recs = [s for s in ex.streams.values() if s.submitted]
    stats.finished_by_length += sum(1 for s in recs if not s.aborted)
    stats.requests[len(recs)] += 1
    if sum(getattr(s.request, "num_preemptions", 0) or 0 for s in recs) > by_resets:
        stats.kv_pressure_examples += 1


def drawable(adapter: Any, model_dir: Path, spec: FuzzSpec) -> tuple[FuzzSpec, dict[str, str]]:
    """``spec`` without the setups this release cannot build (each tried once), and why each was dropped."""
    dropped: dict[str, str] = {}

    def builds(depth: int, k: int) -> bool:
        try:
            adapter.scheduler(model_dir, setup_for(depth, 8, k, 0))
        except Unsupported as exc:
            dropped[f"depth={depth}" + (f", spec_tokens={k}" if k else "")] = str(exc)
            return False
        return True

    depths = tuple(d for d in spec.depths if builds(d, 0))
    ks = tuple(k for k in spec.spec_tokens if k == 0 or all(builds(d, k) for d in depths if d > 1))
    if not depths or not ks:
        return spec, dropped
    return replace(spec, depths=depths, spec_tokens=ks), dropped


def run_fuzz(adapter: Any, model_dir: Path, perm: list[int], spec: FuzzSpec, reach: Any = None) -> dict[str, Any]:
    """The ``fuzz`` event's fields: run the state machine, then replay its falsifying example (if any).
    ``reach``: a :class:`repro.sched.reach.Reach` measuring since before vLLM's import (or why none could be)."""
    usable, dropped = drawable(adapter, model_dir, spec)
    if usable is spec and dropped:
        return {"status": "unsupported", "reason": "; ".join(f"{k}: {v}" for k, v in dropped.items()),
                "dropped": dropped}
    stats = FuzzStats()
    measuring = reach if isinstance(reach, Reach) else None
    run = FuzzRun(adapter, model_dir, perm, usable, stats, measuring)
    machine = type("SchedulerMachine", (SchedulerMachine,), {"run": run})
    t0, c0 = time.monotonic(), time.process_time()
    raised = _run_machine(machine, usable)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    if measuring is not None:  # the snapshots are the measurement's cost, not the examples' (the tracing is)
        wall, cpu = wall - measuring.cost_wall_s, cpu - measuring.cost_cpu_s
    # The examples' reach, before the falsifying example's minimising and replay run more of vLLM.
    reach_doc = measuring.result(stats.examples) if measuring is not None else (
        {"error": reach} if isinstance(reach, str) else None)
    out: dict[str, Any] = {
        "status": "ran", "examples": stats.examples, "examples_to_failure": stats.examples_to_failure,
        "wall_s": round(wall, 3), "examples_per_s": round(stats.examples / wall, 1) if wall > 0 else None,
        # CPU seconds of this process: examples per CPU second do not depend on what else the machine runs.
        "cpu_s": round(cpu, 3),
        "seed": spec.seed, "settings": usable.to_json(), "hypothesis_version": hypothesis.__version__,
        "coverage": stats.coverage(), "dropped": dropped, "falsifying": None,
        **({"reach": reach_doc} if reach_doc is not None else {}),
    }
    if raised is not None and stats.failure is None:
        # Hypothesis itself refused (a health check, a flaky example): no finding, and not a clean run either.
        return {**out, "status": "error", "reason": f"Hypothesis stopped: {raised}", "traceback": raised.tb}
    if stats.failure is not None:
        out["falsifying"] = _falsifying(run, stats.failure)
    return out


@dataclass
class Raised:
    message: str
    tb: str

    def __str__(self) -> str:
        return self.message


def _run_machine(machine: type, spec: FuzzSpec) -> Raised | None:
    """Hypothesis over ``machine``: None when no example failed, else what it raised (after shrinking)."""
    # No database (each run stands alone; the seed replays it), no deadline (a loaded 2-core machine makes
    # timings noise), every health check off (a slow or rejected example is not a finding), one bug per run
    # (the first one Hypothesis shrinks is the one reported and replayed).
    cfg = settings(max_examples=spec.examples, stateful_step_count=spec.steps, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False,
                   verbosity=Verbosity.normal)
    try:
        run_state_machine_as_test(seed(spec.seed)(machine), settings=cfg)
    except Exception as exc:
        return Raised(f"{type(exc).__name__}: {exc}", traceback.format_exc())
    return None


def _falsifying(run: FuzzRun, failure: Failure) -> dict[str, Any]:
    """The shrunk example, minimised further (:func:`opmodel.minimise`): its op script, Hypothesis' failure, and the
    script replayed as an ``ops`` scenario."""
    script = minimise(failure.script, lambda smaller: fails_alike(run, smaller, failure.kind))
    params = script.to_dict()
    replay = run_scenario(run.adapter, {"id": "falsifying", "scenario": "ops", "params": params}, run.model_dir,
                          run.perm)
    return {"script": params, "failure": failure.failure, "ops": len(script.ops), "shrunk": failure.final,
            "hypothesis_ops": len(failure.script.ops), "replay": replay}


def fails_alike(run: FuzzRun, script: Script, kind: str) -> bool:
    """Whether ``script``, played on a fresh scheduler with the machine's checks, fails with a failure of ``kind``."""
    try:
        sched = run.adapter.scheduler(run.model_dir, script.setup)
        ex = Executor(script, sched, run.adapter, run.perm, run.adapter.block_hasher(script.setup.block_size))
        for op in script.ops:
            apply(ex, op)
            check_streams(ex)
        check_finished(ex)
    except Unsupported:
        return False
    except Exception as exc:
        return kind_of(exc) == kind
    return False
