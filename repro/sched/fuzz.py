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
release has ``set_pause_state``) and abort running requests, one at a time, in
batches (EngineCore's aborts queue, finished ids among them) or all at once
(``finish_requests(None)``, a pause in "abort" mode).  Setups may carry a
consumer KV connector that moves nothing (its scheduler side, the deferred
block frees of PR #45357), and drafts for the sync Scheduler too (the worker's
draft ids after every step); requests may be streaming-input sessions (fed
chunk by chunk as AsyncLLM adds them, then closed).  The invariant
after every rule: every delivered stream is the tokens of its positions
(``opmodel.stream_fault``); at teardown the scheduler runs to completion and
every request that was not aborted must have finished with all its tokens
(``opmodel.finish_fault``); vLLM raising is a failure too.

The falsifying example Hypothesis shrank is kept as its op script
(``opmodel.FuzzState.script``) and replayed once more as an ``ops`` scenario,
the path ``vllm-repro plan`` takes, so the harness judges both the same way.
The rules and checks are :mod:`repro.sched.opmodel` (pure, unit-tested); what
the examples share, the checks and the replay :mod:`repro.sched.fuzzrun`.
With reach measured, coverage.py traces only inside the rules
(``FuzzRun.traced``), so Hypothesis' own work runs at full speed.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import hypothesis
from hypothesis import HealthCheck, Verbosity, reject, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from repro.core.wire import FUZZ_DEPTHS, FUZZ_MAX_SPEC_TOKENS, FuzzSpec
from repro.sched.adapter import Unsupported
from repro.sched.executor import Executor
from repro.sched.fuzzrun import (
    FuzzRun,
    FuzzStats,
    apply,
    check_finished,
    check_streams,
    count_finish,
    describe,
    drawable,
    drawable_extras,
    falsifying,
    kind_of,
    known_findings,
    release_ops,
    setup_label,
)
from repro.sched.known import Row
from repro.sched.opmodel import (
    BUDGETS,
    LONG_PROMPT,
    MAX_PROMPT,
    MIN_BLOCKS,
    PROMPT_ALPHABET,
    FuzzState,
    Knobs,
    drawn_setup,
    prompt_tokens,
)
from repro.sched.reach import Reach
from repro.sched.script import PAUSE_STATES, POLICIES, Op, Script

MAX_TOKENS = 16
FIRST_REQUESTS = 4  # requests the initialize rule adds, at most
MAX_NUM_SEQS = (16, 4, 2)  # 2: requests wait for a slot, not only for blocks
GROUP_MAX = 4  # children of an n > 1 request (GRPO groups of 4, as the engine tier's sampled kind)


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
                  st.booleans(), st.booleans(), st.booleans())
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
        self.run.traced(lambda: self._build(drawn, knobs, first))

    def _build(self, drawn: tuple[int, int, int, int, int], knobs: Knobs, first: list[tuple[int, int, int, int]]
               ) -> None:
        run = self.run
        knobs = knobs if run.kv_consumer else replace(knobs, kv_consumer=False)
        setup = drawn_setup(run.spec.depths, run.spec.spec_tokens, *drawn, knobs=knobs, sync_spec=run.sync_spec)
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

    def _guarded(self, fn: Callable[[], Any], teardown: bool = False) -> None:
        """Run ``fn``; a failure is recorded with this example's script, then re-raised for Hypothesis.  A known one
        drops the example (``reject``), or in the teardown just ends it: Hypothesis runs the teardown also after it
        has concluded the example (an overrun), when it can no longer be marked invalid."""
        try:
            self.run.traced(fn)
        except BaseException as exc:
            if self.state is not None and not self.failed and isinstance(exc, Exception):
                script = self.state.script()
                match = self.run.known(script, exc)
                if match is not None:
                    # A known-bug row covering this release (repro.sched.known): reported once, this example
                    # dropped, so Hypothesis neither stops nor shrinks here and the run looks further.
                    self.failed = True
                    self.run.stats.known_hit(match, script, describe(exc), kind_of(exc))
                    if teardown:
                        return
                    reject()
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

    def add(self, first: int, prompt_len: int, max_tokens: int, priority: int = 0, session: bool = False) -> None:
        assert self.state is not None and self.ex is not None
        op, req = self.state.add(prompt_tokens(first, prompt_len), max_tokens, priority, session)
        self.ex.declare(req)
        self._guarded(lambda: self._apply(op))

    @precondition(lambda self: self.state is not None and self.state.can_add(2))
    @rule(request=REQUESTS, n=st.integers(2, GROUP_MAX))
    def add_group(self, request: tuple[int, int, int, int], n: int) -> None:
        """An n > 1 request as the scheduler sees it: AsyncLLM fans it out into n children of one prompt (ids
        ``<k>_<parent>``, vllm/v1/engine/parallel_sampling.py ParentRequest.get_child_info), added one after
        the other between two steps.  Their scripted streams are alike (the positions' tokens), so where real
        sampled children diverge these share their full output blocks in the prefix cache."""
        assert self.state is not None and self.ex is not None
        first, prompt_len, max_tokens, priority = request
        self.run.stats.ops["group"] += 1
        for op, req in self.state.add_group(prompt_tokens(first, prompt_len), max_tokens, priority, n):
            self.ex.declare(req)
            self._guarded(lambda op=op: self._apply(op))

    @precondition(lambda self: self.ex is not None and self.state is not None and bool(self._live_groups()))
    @rule(pick=st.integers(0, 7))
    def abort_group(self, pick: int) -> None:
        """AsyncLLM.abort(parent): the output processor expands it to the children still unfinished, one batched
        abort (vllm/v1/engine/output_processor.py abort_requests)."""
        assert self.state is not None
        groups = self._live_groups()
        op = self.state.abort_children(groups[pick % len(groups)])
        if op is not None:
            self._guarded(lambda: self._apply(op))

    def _live_groups(self) -> list[list[str]]:
        assert self.state is not None and self.ex is not None
        ex = self.ex
        return [live for live in ([c for c in kids if ex.streams[c].submitted and not ex.streams[c].done]
                                  for kids in self.state.groups.values()) if live]

    @precondition(lambda self: self.state is not None and self.state.can_add() and self.run.sessions)
    @rule(request=REQUESTS)
    def add_session(self, request: tuple[int, int, int, int]) -> None:
        """A streaming-input session (AsyncLLM.generate with an input stream): its first chunk, resumable."""
        self.add(*request, session=True)

    def _open_sessions(self) -> list[str]:
        assert self.state is not None and self.ex is not None
        return [r for r in self.state.open_sessions() if not self.ex.streams[r].done]

    @precondition(lambda self: self.state is not None and bool(self._open_sessions()))
    @rule(pick=st.integers(0, 7), chunk=REQUESTS)
    def feed(self, pick: int, chunk: tuple[int, int, int, int]) -> None:
        """A session's next input chunk: queued while a turn runs, started at once when the session waits."""
        assert self.state is not None and self.ex is not None
        sessions = self._open_sessions()
        fed = self.state.feed(sessions[pick % len(sessions)], prompt_tokens(chunk[0], chunk[1]), chunk[2])
        if fed is not None:
            op, req = fed
            self.ex.redeclare(req)
            self._guarded(lambda: self._apply(op))

    @precondition(lambda self: self.state is not None and bool(self._open_sessions()))
    @rule(pick=st.integers(0, 7))
    def close(self, pick: int) -> None:
        """A session's input stream ends (its final sentinel)."""
        assert self.state is not None
        sessions = self._open_sessions()
        op = self.state.close(sessions[pick % len(sessions)])
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

    # A reset while a session is open is drawn again (issue 38): one waiting for its next chunk keeps its KV
    # blocks, and reset_prefix_cache(reset_running_requests=True) preempts only the running requests, then raises
    # "Failed to reset KV cache even when all the running requests are preempted" (scheduler.py:2870 at v0.32.0),
    # the known row "reset with a waiting session" (scenario reset-session, >= 0.15.0).  Such an example is
    # reported KNOWN and dropped (repro.sched.known), so the fuzzer still looks past it.
    @precondition(lambda self: self.state is not None and self.run.resets)
    @rule(in_flight=st.sampled_from((None, 0, 1, 2)), connector=st.booleans())
    def reset(self, in_flight: int | None, connector: bool) -> None:
        """A reset; with ``connector`` as EngineCore's pause with clear_cache sends it (reset_connector=True)."""
        assert self.state is not None
        op = replace(self.state.reset(in_flight), connector=connector)
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

    def _submitted(self) -> list[str]:
        assert self.ex is not None
        return [s.rid for s in self.ex.streams.values() if s.submitted]

    @precondition(lambda self: self.ex is not None and len(self._submitted()) > 1)
    @rule(picks=st.lists(st.integers(0, 7), min_size=2, max_size=4))
    def abort_several(self, picks: list[int]) -> None:
        """One batched abort (EngineCore's aborts queue): running, waiting and already finished requests."""
        assert self.state is not None
        op = self.state.abort_many(self._submitted(), picks)
        if op is not None:
            self._guarded(lambda: self._apply(op))

    @precondition(lambda self: self.ex is not None and self.run.abort_all and bool(self._running()))
    @rule()
    def abort_all(self) -> None:
        """finish_requests(None): every request aborted, as EngineCore's pause in "abort" mode does."""
        self._guarded(lambda: self._apply(Op("abort_all")))

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
        self._guarded(self._run_to_completion, teardown=True)

    def _run_to_completion(self) -> None:
        assert self.ex is not None and self.state is not None
        for op in self.state.tear_down():
            self._apply(op)
        check_streams(self.ex)
        check_finished(self.ex)
        count_finish(self.ex, self.run.stats)
        shutdown = getattr(self.ex.sched, "shutdown", None)
        if shutdown is not None:  # as EngineCore does at the end: a scheduler with nothing left must shut down
            shutdown()


def run_fuzz(adapter: Any, model_dir: Path, perm: list[int], spec: FuzzSpec, reach: Any = None) -> dict[str, Any]:
    """The ``fuzz`` event's fields: run the state machine, then replay its falsifying example (if any).
    ``reach``: a :class:`repro.sched.reach.Reach` measuring since before vLLM's import (or why none could be)."""
    t_probe = time.monotonic()
    usable, dropped = drawable(adapter, model_dir, spec)
    if usable is spec and dropped:
        return {"status": "unsupported", "reason": "; ".join(f"{k}: {v}" for k, v in dropped.items()),
                "dropped": dropped}
    kv_consumer, sync_spec, sessions = drawable_extras(adapter, model_dir, usable, dropped)
    resets, abort_all = release_ops(adapter, dropped)
    stats = FuzzStats()
    measuring = reach if isinstance(reach, Reach) else None
    rows = tuple(Row(k.scenario, k.async_on, k.bug, k.expect) for k in spec.known)
    run = FuzzRun(adapter, model_dir, perm, usable, stats, measuring, kv_consumer=kv_consumer, sync_spec=sync_spec,
                  sessions=sessions, resets=resets, abort_all=abort_all, rows=rows)
    if measuring is not None:  # the import and drawable() above were traced; from here on only run.traced()
        measuring.pause()
    machine = type("SchedulerMachine", (SchedulerMachine,), {"run": run})
    # vLLM, torch and transformers leave millions of long-lived objects: every full collection would walk them
    # (Hypothesis' first example alone runs gc.collect, 0.6 s here).  Frozen, as vLLM's EngineCore freezes its
    # start-up heap (gc.freeze), collections see only what the examples allocate.
    gc.freeze()
    t0, c0 = time.monotonic(), time.process_time()
    raised = _run_machine(machine, usable)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    # Wall seconds of each part of the run, in order, for ``vllm-repro bench fuzz`` (harness/bench/fuzz.py).
    phases = {"setups": round(t0 - t_probe, 3), "examples": round(wall, 3)}
    if measuring is not None:  # the snapshots are the measurement's cost, not the examples' (the tracing is)
        wall, cpu = wall - measuring.cost_wall_s, cpu - measuring.cost_cpu_s
    # The examples' reach, before the falsifying example's minimising and replay run more of vLLM.
    t_reach = time.monotonic()
    reach_doc = measuring.result(stats.examples) if measuring is not None else (
        {"error": reach} if isinstance(reach, str) else None)
    if measuring is not None:
        phases["reach report"] = round(time.monotonic() - t_reach, 3)
    out: dict[str, Any] = {
        "status": "ran", "examples": stats.examples, "examples_to_failure": stats.examples_to_failure,
        "wall_s": round(wall, 3), "examples_per_s": round(stats.examples / wall, 1) if wall > 0 else None,
        # CPU seconds of this process: examples per CPU second do not depend on what else the machine runs.
        "cpu_s": round(cpu, 3),
        "seed": spec.seed, "settings": usable.to_json(), "hypothesis_version": hypothesis.__version__,
        "coverage": stats.coverage(), "dropped": dropped, "falsifying": None, "phases": phases,
        **({"reach": reach_doc} if reach_doc is not None else {}),
    }
    if raised is not None and stats.failure is None:
        # Hypothesis itself refused (a health check, a flaky example): no finding, and not a clean run either.
        return {**out, "status": "error", "reason": f"Hypothesis stopped: {raised}", "traceback": raised.tb}
    if stats.known:
        t1 = time.monotonic()
        out["known"] = known_findings(run)
        phases["known minimise"] = round(time.monotonic() - t1, 3)
    if stats.failure is not None:
        t1 = time.monotonic()
        out["falsifying"] = falsifying(run, stats.failure)
        phases["minimise+replay"] = round(time.monotonic() - t1, 3)
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
