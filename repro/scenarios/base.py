"""A pause schedule and the async driver that plays it against one AsyncLLM.

A scenario module turns its JSON parameters into a :class:`Plan`: which
requests exist, when each is submitted (at start, during pause *k*, after
resume *k*, or after in-flight operation *k*), a list of in-flight operations
(a prefix-cache reset or an abort of some requests, done while the engine keeps
generating) and a list of pauses (mode, clear_cache, the token count that
triggers it).  :func:`run_plan` plays it and returns one record per request;
judging the records is the harness's job (``harness/core/oracle.py``).

Synchronisation is by events only: a pause or an in-flight operation is
triggered when every running request it concerns has received its trigger
count, and a keep-mode resume waits until every request has received all tokens
the engine reports it generated before the pause (asked of the engine core, not
guessed with a sleep).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from repro.models import BigramCycleSpec, expected_continuation

PAUSE_MODES = ("keep", "wait", "abort")
# The engine's max_model_len (repro.engine): prompt + max_tokens + REFERENCE_MARGIN must fit.
MAX_MODEL_LEN = 256
# A reference run's stand-in for a pause: nothing pauses, the requests submitted during or after the pause
# join at its trigger, so the reference is batched as the paused run is.
STAGGER = "stagger"


class ScenarioUnsupported(Exception):
    """The vLLM under test cannot run this scenario (e.g. no keep-mode pause)."""


class ScenarioFailed(Exception):
    """The scenario could not be completed (an engine or request error)."""


class ScenarioTimeout(ScenarioFailed):
    """The engine did not reach an expected state within the scenario timeout."""


# Run while the engine is paused, after the client holds every pre-pause token
# and before resume (e.g. a weight update); returns facts for the event log.
PauseAction = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class PauseSpec:
    mode: str
    clear_cache: bool
    after_tokens: int  # pause once every running request has this many tokens
    action: PauseAction | None = field(default=None, compare=False)
    # What pauses and resumes the engine, when not pause_generation(mode, clear_cache) / resume_generation()
    # (the sleep scenario: sleep(level, mode) / wake_up()); each returns facts for the event log.
    enter: PauseAction | None = field(default=None, compare=False)
    leave: PauseAction | None = field(default=None, compare=False)


INFLIGHT_OPS = ("reset", "abort")


@dataclass(frozen=True)
class InflightSpec:
    """An operation on the engine while it keeps generating (no pause).

    ``reset``: ``reset_prefix_cache(reset_running_requests=True)``, vLLM's own
    mid-generation reset (tests/v1/core/test_reset_prefix_cache_e2e.py): every
    running request is preempted and must resume with exactly the tokens it
    would have produced.  ``abort``: ``AsyncLLM.abort`` of the ``targets``
    (request ids of the plan) at once; the other requests keep generating.
    """

    op: str
    after_tokens: int  # once every running request it concerns has this many tokens
    targets: tuple[str, ...] = ()  # abort: the requests aborted

    def __post_init__(self) -> None:
        if self.op not in INFLIGHT_OPS:
            raise ValueError(f"unknown in-flight operation {self.op!r}; valid: {', '.join(INFLIGHT_OPS)}")
        if (self.op == "abort") != bool(self.targets):
            raise ValueError("an abort names the requests it aborts; a reset names none")


@dataclass(frozen=True)
class RequestSpec:
    rid: str
    prompt: list[int]
    max_tokens: int
    # "start", or ("during", k) / ("after", k): submitted while pause k is in
    # effect, or right after resume k; ("after_op", k): right after in-flight operation k;
    # ("tokens", n): once every request submitted at start has n tokens (or ended), before any
    # in-flight operation or pause.
    submit: tuple[str, int] | str = "start"


@dataclass
class Plan:
    requests: list[RequestSpec]
    pauses: list[PauseSpec]
    # Played in order before the pauses (no scenario mixes the two yet).
    inflight: list[InflightSpec] = field(default_factory=list)


@dataclass(frozen=True)
class EngineContext:
    """What a scenario that changes the engine (weight sync) knows about it beyond the AsyncLLM."""

    model_spec: BigramCycleSpec | Any  # the checkpoint the engine started with (A); None for a user's model
    model_dir: Path
    perm: list[int] | None  # bigram-cycle: the cycle its greedy stream walks; None for other models
    model_cache: Path
    work_dir: Path  # where side logs (e.g. the weight trainer's) go
    tensor_parallel_size: int
    # A new AsyncLLM with this engine's arguments but another checkpoint
    # (the caller shuts it down).
    start_engine: Callable[[Path], Any]
    model_kind: str = "bigram-cycle"  # repro.wire.MODEL_KINDS
    vocab_size: int = 0  # token ids prompts may use; 0: len(perm)

    @property
    def vocab(self) -> int:
        return self.vocab_size or len(self.perm or ())


def make_prompts(n: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Distinct token-id prompts (ids 2.. to stay clear of BOS/EOS)."""
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    prompts: list[list[int]] = []
    while len(prompts) < n:
        p = tuple(rng.randrange(2, vocab_size) for _ in range(length))
        if p not in seen:
            seen.add(p)
            prompts.append(list(p))
    return prompts


@dataclass
class _Stream:
    spec: RequestSpec
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False
    submitted: bool = False
    t_submit: float | None = None
    t_first: float | None = None
    t_finish: float | None = None
    pauses: list[dict[str, Any]] = field(default_factory=list)
    interrupts: list[dict[str, Any]] = field(default_factory=list)  # in-flight operations it ran through


class _Driver:
    def __init__(self, llm: Any, plan: Plan, timeout: float, sampling_params_cls: Any, output_kind: Any):
        self.llm = llm
        self.plan = plan
        self.timeout = timeout
        self.sp_cls = sampling_params_cls
        self.output_kind = output_kind
        self.streams = {r.rid: _Stream(r) for r in plan.requests}
        self.cond = asyncio.Condition()
        self.tasks: list[asyncio.Task[None]] = []
        self.t0 = time.monotonic()
        self.events: list[dict[str, Any]] = []

    def _now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    async def _consume(self, st: _Stream) -> None:
        sp = self.sp_cls(
            temperature=0.0,
            max_tokens=st.spec.max_tokens,
            ignore_eos=True,
            output_kind=self.output_kind,
            detokenize=False,
        )
        st.t_submit = self._now()
        try:
            async for out in self.llm.generate(
                {"prompt_token_ids": st.spec.prompt}, sp, request_id=st.spec.rid
            ):
                comp = out.outputs[0]
                new = list(comp.token_ids)
                if new and st.t_first is None:
                    st.t_first = self._now()
                st.tokens.extend(new)
                if comp.finish_reason is not None:
                    st.finish_reason = str(comp.finish_reason)
                async with self.cond:
                    self.cond.notify_all()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an engine error ends this request, not the run
            st.error = f"{type(exc).__name__}: {exc}"
        finally:
            st.done = True
            st.t_finish = self._now()
            async with self.cond:
                self.cond.notify_all()

    def _submit(self, rids: list[str]) -> None:
        for rid in rids:
            st = self.streams[rid]
            st.submitted = True
            self.tasks.append(asyncio.create_task(self._consume(st), name=f"req-{rid}"))

    async def _wait_until(self, what: str, pred: Any) -> None:
        try:
            async with self.cond:
                await asyncio.wait_for(self.cond.wait_for(pred), self.timeout)
        except TimeoutError as exc:
            raise ScenarioTimeout(f"timed out after {self.timeout}s waiting for {what}") from exc

    def _running(self) -> list[_Stream]:
        return [s for s in self.streams.values() if s.submitted and not s.done]

    def _phase(self, kind: str, k: int) -> list[str]:
        return [r.rid for r in self.plan.requests if r.submit == (kind, k) or r.submit == [kind, k]]

    async def _engine_progress(self) -> dict[str, dict[str, Any]] | None:
        core = getattr(self.llm, "engine_core", None)
        try:
            raw = await core.call_utility_async("repro_request_progress")
        except Exception as exc:
            self.events.append({"t": self._now(), "event": "progress_unavailable", "why": repr(exc)})
            return None
        by_rid: dict[str, dict[str, Any]] = {}
        for internal, info in raw.items():
            for rid in self.streams:
                # AsyncLLM appends "-<8 hex>" to the caller's id (0.2x); older
                # versions keep it as is.
                if internal == rid or internal.startswith(rid + "-"):
                    by_rid[rid] = info
        return by_rid

    async def _stagger(self, k: int, p: PauseSpec) -> None:
        """A :data:`STAGGER` "pause": no pause at all, only the requests of pause ``k`` joining at its trigger."""
        running = self._running()
        await self._wait_until(f"stagger point {k} ({p.after_tokens} tokens in every running request)",
                               lambda: all(s.done or len(s.tokens) >= p.after_tokens for s in running))
        self.events.append({"t": self._now(), "event": "stagger", "k": k})
        self._submit(self._phase("during", k) + self._phase("after", k))

    async def _pause(self, k: int, p: PauseSpec) -> None:
        if p.mode == STAGGER:
            await self._stagger(k, p)
            return
        running = self._running()
        await self._wait_until(
            f"pause {k} trigger ({p.after_tokens} tokens in every running request)",
            lambda: all(s.done or len(s.tokens) >= p.after_tokens for s in running),
        )
        running = self._running()
        before = {s.spec.rid: len(s.tokens) for s in running}
        self.events.append({"t": self._now(), "event": "pause", "k": k, "mode": p.mode,
                            "clear_cache": p.clear_cache, "client_tokens": before})
        try:
            if p.enter is not None:
                info = await asyncio.wait_for(p.enter(), self.timeout)
                self.events.append({"t": self._now(), "event": "pause_enter", "k": k, **info})
            else:
                await asyncio.wait_for(
                    self.llm.pause_generation(mode=p.mode, clear_cache=p.clear_cache), self.timeout
                )
        except TimeoutError as exc:
            # Say what the engine still holds: the evidence for a hang report.
            try:
                held = await asyncio.wait_for(self._engine_progress(), 10)
            except Exception:
                held = None
            state = {rid: (i.get("status"), i.get("num_output_tokens")) for rid, i in (held or {}).items()}
            client = {s.spec.rid: (len(s.tokens), s.finish_reason) for s in self.streams.values() if s.submitted}
            raise ScenarioTimeout(
                f"pause_generation(mode={p.mode!r}) did not return in {self.timeout}s; engine holds "
                f"{state or 'nothing (or could not be asked)'}; client streams {client}"
            ) from exc
        self.events.append({"t": self._now(), "event": "paused", "k": k})
        engine = await self._engine_progress()

        if engine is not None:
            # The engine says which requests it still holds (frozen by keep,
            # or queued and never scheduled under wait/abort): the client must
            # have every token it produced for them, so the first token after
            # resume is exactly stream[pause_index].  The others finished or
            # were aborted: their streams must end.
            held = {s.spec.rid: engine[s.spec.rid]["num_output_tokens"] for s in running if s.spec.rid in engine}
            await self._wait_until(
                f"{p.mode}-pause {k}: client to catch up with the engine",
                lambda: all(
                    (len(s.tokens) >= held[s.spec.rid] or s.done) if s.spec.rid in held else s.done
                    for s in running
                ),
            )
        elif p.mode == "keep":
            raise ScenarioFailed("engine progress probe unavailable; cannot tell the pause index")
        else:
            # wait: in-flight requests drain to completion; abort: they end
            # with finish_reason abort.
            await self._wait_until(
                f"{p.mode}-pause {k}: in-flight requests to end",
                lambda: all(s.done for s in running),
            )
        for s in running:
            s.pauses.append({
                "k": k,
                "mode": p.mode,
                "clear_cache": p.clear_cache,
                "client_tokens": len(s.tokens),
                "engine_tokens": (engine or {}).get(s.spec.rid, {}).get("num_output_tokens"),
                # The scheduler's view after the pause: PREEMPTED means the
                # request was running and was force-preempted by the cache reset.
                "engine_status": (engine or {}).get(s.spec.rid, {}).get("status"),
                "engine_preemptions": (engine or {}).get(s.spec.rid, {}).get("num_preemptions"),
                # Still frozen inside the engine at resume time (keep mode).
                "frozen": not s.done,
            })
        if p.action is not None:
            await self._act(k, p.action)
        self._submit(self._phase("during", k))
        self.events.append({"t": self._now(), "event": "resume", "k": k})
        if p.leave is not None:
            info = await asyncio.wait_for(p.leave(), self.timeout)
            self.events.append({"t": self._now(), "event": "pause_leave", "k": k, **info})
        else:
            await asyncio.wait_for(self.llm.resume_generation(), self.timeout)
        self._submit(self._phase("after", k))

    async def _waves(self) -> None:
        """Submit the ("tokens", n) requests, smallest n first, each once every start request has n tokens."""
        first = [s for s in self.streams.values() if s.spec.submit == "start"]
        for n in sorted({int(r.submit[1]) for r in self.plan.requests if _kind(r.submit) == "tokens"}):
            await self._wait_until(f"{n} tokens in every request submitted at start",
                                   lambda n=n: all(s.done or len(s.tokens) >= n for s in first))
            rids = [r.rid for r in self.plan.requests if _kind(r.submit) == "tokens" and int(r.submit[1]) == n]
            self.events.append({"t": self._now(), "event": "submit_wave", "after_tokens": n, "requests": rids})
            self._submit(rids)

    async def _inflight(self, k: int, op: InflightSpec) -> None:
        """In-flight operation ``k``: once every running request has its trigger count, act with no pause."""
        running = self._running()
        await self._wait_until(
            f"{op.op} {k} trigger ({op.after_tokens} tokens in every running request)",
            lambda: all(s.done or len(s.tokens) >= op.after_tokens for s in running),
        )
        running = self._running()
        before = {s.spec.rid: len(s.tokens) for s in running}
        self.events.append({"t": self._now(), "event": op.op, "k": k, "client_tokens": before,
                            "targets": list(op.targets)})
        try:
            info = await asyncio.wait_for(self._do(op), self.timeout)
        except TimeoutError as exc:
            raise ScenarioTimeout(f"{op.op} {k} did not return in {self.timeout}s") from exc
        engine = await self._engine_progress()
        self.events.append({"t": self._now(), "event": f"{op.op}_done", "k": k, **info})
        for s in running:
            seen = (engine or {}).get(s.spec.rid, {})
            s.interrupts.append({
                "k": k,
                "op": op.op,
                # Aborted (abort), or preempted by the reset; False: it kept running through others' abort.
                "target": op.op == "reset" or s.spec.rid in op.targets,
                "client_tokens": before[s.spec.rid],  # when the operation was called
                "client_tokens_after": len(s.tokens),  # when it returned
                # The engine's view right after (it may have rescheduled the request already).
                "engine_tokens": seen.get("num_output_tokens"),
                "engine_status": seen.get("status"),
                "engine_preemptions": seen.get("num_preemptions"),
            })
        if op.op == "abort":
            aborted = [s for s in running if s.spec.rid in op.targets]
            await self._wait_until(f"abort {k}: the aborted streams to end", lambda: all(s.done for s in aborted))
        self._submit(self._phase("after_op", k))

    async def _do(self, op: InflightSpec) -> dict[str, Any]:
        if op.op == "reset":
            ok = await self.llm.reset_prefix_cache(reset_running_requests=True)
            return {"reset_ok": ok}
        await self.llm.abort(list(op.targets))
        return {"aborted": list(op.targets)}

    async def _act(self, k: int, action: PauseAction) -> None:
        t0 = self._now()
        try:
            info = await asyncio.wait_for(action(), self.timeout)
        except BaseException as exc:
            # Leave no paused engine behind: later scenarios of this engine
            # would hang on it.  The action's own error is what gets reported.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.llm.resume_generation(), self.timeout)
            if isinstance(exc, TimeoutError):
                raise ScenarioTimeout(f"the action of pause {k} did not finish in {self.timeout}s") from exc
            raise
        self.events.append({"t": self._now(), "event": "pause_action", "k": k, "started": t0, **info})

    async def run(self) -> list[dict[str, Any]]:
        try:
            self._submit([r.rid for r in self.plan.requests if r.submit == "start"])
            await self._waves()
            for k, op in enumerate(self.plan.inflight):
                await self._inflight(k, op)
            for k, p in enumerate(self.plan.pauses):
                await self._pause(k, p)
            await self._wait_until("all requests to finish", lambda: all(
                s.done for s in self.streams.values() if s.submitted))
        finally:
            for t in self.tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        return [self._record(s) for s in self.streams.values()]

    def _record(self, s: _Stream) -> dict[str, Any]:
        rec = {
            "rid": s.spec.rid,
            "submit": list(s.spec.submit) if isinstance(s.spec.submit, tuple) else s.spec.submit,
            "prompt": s.spec.prompt,
            "max_tokens": s.spec.max_tokens,
            "observed": s.tokens,
            "finish_reason": s.finish_reason,
            "error": s.error,
            "pauses": s.pauses,
            "timings": {"submit": s.t_submit, "first_token": s.t_first, "finish": s.t_finish},
        }
        if self.plan.inflight:
            # Read by the oracle: a request aborted here may end early (a prefix of its reference), and
            # every request listed ran through the operation (the known-bug table's "running at pause").
            rec["interrupts"] = s.interrupts
        return rec


def _kind(submit: tuple[str, int] | str | list[Any]) -> str:
    return submit if isinstance(submit, str) else str(submit[0])


def _vllm_api() -> tuple[Any, Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams, RequestOutputKind.DELTA


def check_pause_api(llm: Any) -> None:
    """Raise ScenarioUnsupported when this vLLM (an AsyncLLM or its class) lacks pause modes."""
    fn = getattr(llm, "pause_generation", None)
    if fn is None:
        raise ScenarioUnsupported("AsyncLLM has no pause_generation()")
    params = inspect.signature(fn).parameters
    if "mode" not in params:
        raise ScenarioUnsupported(
            "AsyncLLM.pause_generation() has no mode= argument (keep/wait/abort pause "
            "modes arrived later)"
        )
    if "clear_cache" not in params:
        raise ScenarioUnsupported("AsyncLLM.pause_generation() has no clear_cache= argument")


def check_reset_api(llm: Any) -> None:
    """Raise ScenarioUnsupported when this vLLM cannot reset the prefix cache with requests running."""
    fn = getattr(llm, "reset_prefix_cache", None)
    if fn is None:
        raise ScenarioUnsupported("AsyncLLM has no reset_prefix_cache()")
    params = inspect.signature(fn).parameters
    if "reset_running_requests" not in params:
        raise ScenarioUnsupported(
            f"AsyncLLM.reset_prefix_cache({', '.join(n for n in params if n != 'self')}) takes no "
            "reset_running_requests=: this vLLM cannot preempt running requests to reset the cache"
        )


def reset_action(llm: Any) -> PauseAction:
    """A pause action: ``reset_prefix_cache(reset_running_requests=True)``, as RL frameworks call it by hand.

    Returns the engine's view of every request right before (frames in flight: num_output_placeholders)
    and right after (status, tokens, the discard it was marked for) for the event log: the evidence of
    what the reset did to the frozen requests.
    """
    async def progress() -> dict[str, Any]:
        try:
            return dict(await llm.engine_core.call_utility_async("repro_request_progress"))
        except Exception as exc:
            return {"unavailable": repr(exc)}

    async def act() -> dict[str, Any]:
        before = await progress()
        ok = await llm.reset_prefix_cache(reset_running_requests=True)
        return {"explicit_reset": True, "reset_ok": ok, "before_reset": before, "after_reset": await progress()}

    return act


def check_plan_api(llm: Any, plan: Plan) -> None:
    """Raise ScenarioUnsupported when this vLLM lacks an API ``plan`` uses (pause modes, a running-request reset)."""
    if plan.pauses:
        check_pause_api(llm)
    if any(op.op == "reset" for op in plan.inflight):
        check_reset_api(llm)


async def run_plan(llm: Any, plan: Plan, timeout: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Play ``plan``; return (request records, event log)."""
    check_plan_api(llm, plan)
    sp_cls, kind = _vllm_api()
    driver = _Driver(llm, plan, timeout, sp_cls, kind)
    records = await driver.run()
    return records, driver.events


# The reference runs this many tokens past max_tokens, so the tail of a
# stream that lost tokens can still be checked against it.
REFERENCE_MARGIN = 8


async def run_unpaused(llm: Any, requests: list[RequestSpec], timeout: float, what: str) -> list[list[int]]:
    """Greedy streams of ``requests``, all submitted at once and never paused, in the order given."""
    sp_cls, kind = _vllm_api()
    driver = _Driver(llm, Plan(requests=list(requests), pauses=[]), timeout, sp_cls, kind)
    records = await driver.run()
    for rec in records:
        if rec["error"]:
            raise ScenarioFailed(f"{what} request {rec['rid']} failed: {rec['error']}")
    return [rec["observed"] for rec in records]


async def run_reference(llm: Any, plan: Plan, timeout: float, tag: str,
                        staggered: bool = False) -> dict[str, list[int]]:
    """Greedy streams of every request in ``plan`` on the same engine, with no pause.

    All submitted at once; ``staggered``: the requests the plan submits during or after a pause join when
    the others reach its trigger, as they are batched in the paused run.
    """
    name = "ref2" if staggered else "ref"
    reqs = [RequestSpec(f"{tag}-{name}-{r.rid}", r.prompt, r.max_tokens + REFERENCE_MARGIN,
                        r.submit if staggered and _kind(r.submit) in ("during", "after") else "start")
            for r in plan.requests]
    if not staggered:
        streams = await run_unpaused(llm, reqs, timeout, "reference")
        return {r.rid: s for r, s in zip(plan.requests, streams, strict=True)}
    pauses = [PauseSpec(STAGGER, False, p.after_tokens) for p in plan.pauses]
    sp_cls, kind = _vllm_api()
    records = await _Driver(llm, Plan(reqs, pauses), timeout, sp_cls, kind).run()
    for rec in records:
        if rec["error"]:
            raise ScenarioFailed(f"staggered reference request {rec['rid']} failed: {rec['error']}")
    return {r.rid: rec["observed"] for r, rec in zip(plan.requests, records, strict=True)}


async def run_with_reference(llm: Any, plan: Plan, perm: list[int] | None, sid: str,
                             timeout: float) -> dict[str, Any]:
    """The engine's no-pause reference of every request, then ``plan``: the ``scenario`` event's data.

    Each record carries its ``reference`` and, for the bigram-cycle model (``perm``), whether that follows
    the model's cycle (if it does not, the model, not the scheduler, is at fault).  A model whose stream is
    not known in advance is judged against the engine's own no-pause run, which must not depend on how
    requests are batched: a second reference, batched as the paused run is (the later requests joining once
    the first ones reach the pause), shows when it does (harness.core.oracle).
    """
    check_plan_api(llm, plan)  # before paying for the reference
    t0 = time.monotonic()
    refs = await run_reference(llm, plan, timeout, sid)
    repeat = None if perm is not None else await run_reference(llm, plan, timeout, sid, staggered=True)
    records, events = await run_plan(llm, plan, timeout)
    for rec in records:
        rec["reference"] = refs[rec["rid"]]
        if repeat is not None:
            rec["reference_repeat"] = repeat[rec["rid"]]
        if perm is not None:
            rec["reference_matches_model"] = rec["reference"] == expected_continuation(
                perm, rec["prompt"][-1], len(rec["reference"]))
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3)}


_P = TypeVar("_P")


def params_from_dict(cls: type[_P], data: dict[str, Any], what: str) -> _P:
    """A scenario's parameter dataclass from its spec entry; an unknown key is an error, never ignored."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; valid: {sorted(known)}")
    return cls(**data)
