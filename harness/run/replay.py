"""``vllm-repro plan``: replay one explicit pause schedule on engine sessions, or one op script on vLLM's
scheduler, and judge every request.

Returns data; the CLI renders it.  An engine-tier plan (``{"requests": [...], "pauses": [...]}``) runs on
each engine config as one :class:`harness.run.session.EngineSession` (the one engine driver, interactive),
started, given the plan as a ``plan`` scenario, and stopped.  A scheduler-tier plan
(``{"tier": "scheduler", "script": {...}}``, e.g. what ``vllm-repro fuzz`` writes for a falsifying example)
runs its script as an ``ops`` scenario of ``python -m repro.sched`` in each version's env, judged by
:func:`harness.sched.tier.sched_verdict` exactly as the fuzzer judged it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.cell import EngineKey, at_release
from harness.core.events import ScenarioEvent
from harness.core.oracle import CellVerdict, Outcome, cell_verdict, fit_losses, preempted_at_keep_clear
from harness.core.recorded_streams import StreamRecord
from harness.run.context import RunContext
from harness.run.sched_process import run_sched
from harness.run.session import EngineDied, EngineSession
from harness.sched import tier as sched_tier
from repro.core.wire import ScenarioSpec


@dataclass(frozen=True)
class RequestReplay:
    """One request of a replayed plan, as the oracle sees it."""

    rid: str
    label: str  # the oracle's verdict label
    pauses: tuple[tuple[str | None, int | None], ...]  # (mode, client tokens at the pause)
    finish_reason: str | None
    preempted_at: tuple[int, ...]  # where vLLM #42043 would drop a token (keep + clear_cache pauses)
    explained_by_losses: bool  # stream == reference minus #42043-style losses at those points


@dataclass(frozen=True)
class PlanReplay:
    """The plan on one engine config: judged, or why it did not run."""

    engine: EngineKey
    died: EngineDied | None = None  # the engine session failed (start-up, crash, timeout)
    status: str = "ran"  # the scenario's status when the engine lived
    reason: str | None = None  # why a scenario that did not run did not
    verdict: CellVerdict | None = None
    requests: tuple[RequestReplay, ...] = ()

    @property
    def ran(self) -> bool:
        return self.died is None and self.status == "ran"


def replay_plan(plan: dict[str, Any], versions: Sequence[str], asyncs: Sequence[bool], executor: str,
                ctx: RunContext) -> Iterator[PlanReplay]:
    """Run ``plan`` once on every (version, async) engine config of ``executor``, in that order.

    Lazily: each replay is yielded as soon as its engine is done, so a caller can show it at once.
    """
    for v in versions:
        env = ctx.env(v)
        for a in asyncs:
            yield _replay_on(EngineSession(env, at_release(EngineKey(v, executor, a)), ctx.cfg), plan)


def _replay_on(session: EngineSession, plan: dict[str, Any]) -> PlanReplay:
    try:
        session.start()
        ev = session.run(ScenarioSpec("plan", "plan", plan, 0))
    except EngineDied as exc:
        return PlanReplay(session.engine, died=exc)
    finally:
        session.close()
    if ev.status != "ran":
        return PlanReplay(session.engine, status=ev.status, reason=ev.reason)
    verdict = cell_verdict(ev.records)
    return PlanReplay(session.engine, verdict=verdict, requests=tuple(
        _request(rv.rid, rv.verdict.label, rec) for rv, rec in zip(verdict.requests, ev.records, strict=True)))


def replay_sched_plan(script: dict[str, Any], versions: Sequence[str], ctx: RunContext) -> Iterator[PlanReplay]:
    """Run the op ``script`` (the ``ops`` scenario's params) on vLLM's scheduler of every version, in that order."""
    for v in versions:
        env = ctx.env(v)
        engine = at_release(EngineKey(v, "mp", script.get("scheduler", "async") == "async", tier="scheduler"))
        spec = sched_tier.sched_spec(engine, [{"id": "plan", "scenario": "ops", "params": script, "seed": 0}],
                                     str(ctx.cfg.model_cache.resolve()), ctx.cfg.model_params)
        run = run_sched(env, engine, ctx.cfg, f"plan-{engine.id}", spec, ctx.cfg.engine_timeout)
        ev = run.first(ScenarioEvent)
        if ev is None:
            outcome = Outcome.TIMEOUT if run.timed_out else Outcome.ERROR
            yield PlanReplay(engine, died=EngineDied(outcome, run.problem))
            continue
        status = ev.status
        if status not in ("ran", "crash"):
            yield PlanReplay(engine, status=status, reason=ev.reason)
            continue
        verdict = sched_tier.sched_verdict(ev)
        records = ev.records
        # A crash has no per-request verdict of its own: each stream is judged as far as it got.
        judged = verdict.requests or (cell_verdict(records).requests if records else ())
        by_rid = {rv.rid: rv.verdict.label for rv in judged}
        yield PlanReplay(engine, status=status, reason=ev.reason, verdict=verdict, requests=tuple(
            _request(rec.rid, by_rid.get(rec.rid, "-"), rec) for rec in records))


def _request(rid: str, label: str, rec: StreamRecord) -> RequestReplay:
    points = preempted_at_keep_clear(rec.pauses)
    fit = fit_losses(rec.reference, rec.observed, rec.max_tokens, points)
    return RequestReplay(rid, label, tuple((p.mode, p.client_tokens) for p in rec.pauses),
                         rec.finish_reason, tuple(points), fit is not None)
