"""Known findings of the scheduler fuzzer: which known-bug row a failing example is, pure (no vLLM, no Hypothesis).

The fuzzer stops at its first failure, so before issue 38 it left out of its draws every state whose bug
was already known (a reset while a streaming-input session waits, a reset with a consumer KV connector and
a frame in flight, a short session chunk after accepted drafts): otherwise it would find them again and
again and look no further.  Now it draws them, and a failing example is first matched here against the
known-bug table's scheduler-tier rows that cover the release under test (the harness passes them:
:class:`repro.core.wire.FuzzKnown`, from ``harness/verdicts/known_bugs.toml``).  A match is reported as KNOWN with
the row's bug id and the example is dropped (``hypothesis.reject``), so the run goes on looking; anything
else is a new finding, shrunk and replayed as before.

A match needs all of: the row covers this release and scheduler (the harness's window, not ours), the
failure is of a kind the row's bug produces here (:attr:`Signature.kinds`, with the text it must carry), the
script holds the row's trigger, and the **control** — the same script with the trigger taken out — does not
fail alike (a replay the caller injects).  So a failure is never filed under a row it does not need: a
session-reset CRASH whose script still crashes with every reset at an open session removed is new.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from repro.sched.script import Op, Script

# What a failure is (repro.sched.opmodel.failure_kind): "crash at <vllm site>", "stall", "stream", "finish".
_STREAMISH = ("stream", "finish", "stall")
_PLACEHOLDERS = "num_output_placeholders"  # vLLM's assert request.num_output_placeholders >= 0
_RESET_FAILED = "Failed to reset KV cache"  # Scheduler.reset_prefix_cache's RuntimeError


@dataclass(frozen=True)
class Signature:
    """How one scheduler-tier scenario of the known-bug table shows in a fuzzer example."""

    scenario: str  # the known-bug table's scheduler-tier scenario (harness.sched.tier.SHAPES)
    kinds: tuple[str, ...]  # failure kinds it produces: "crash" (with ``needle``), "stream", "finish", "stall"
    needle: str  # text a crash's failure carries ("" for any)
    trigger: Callable[[Script], bool]
    control: Callable[[Script], Script]  # the script without the trigger
    why: str

    def fits(self, script: Script, kind: str, failure: str) -> bool:
        """Whether a failure of ``kind`` with text ``failure`` on ``script`` looks like this row's bug."""
        if kind.startswith("crash"):
            if "crash" not in self.kinds or self.needle not in failure:
                return False
        elif kind not in self.kinds:
            return False
        return self.trigger(script)


@dataclass(frozen=True)
class Match:
    """A failure filed under a known-bug row."""

    bug: str  # the row's id (``vllm#42043``, ``reset with a waiting session``, ...)
    scenario: str
    expect: str  # the row's expected outcome on its own scenario (informative)


# --------------------------------------------------------------------------- triggers and controls


def _resets_where(script: Script, pick: Callable[[Op, set[str]], bool]) -> list[int]:
    """Indices of the reset ops for which ``pick(op, open sessions)`` holds (sessions added, not yet closed)."""
    sessions = {r.rid for r in script.requests if r.session}
    open_: set[str] = set()
    found: list[int] = []
    for i, op in enumerate(script.ops):
        if op.op == "add" and op.rid in sessions:
            open_.add(op.rid or "")
        elif op.op == "close":
            open_.discard(op.rid or "")
        elif op.op == "reset" and pick(op, open_):
            found.append(i)
    return found


def _without(script: Script, drop: Iterable[int]) -> Script:
    gone = set(drop)
    return replace(script, ops=tuple(op for i, op in enumerate(script.ops) if i not in gone))


def _at_open_session(op: Op, open_: set[str]) -> bool:
    return bool(open_)


def _drained_reset(script: Script) -> Callable[[Op, set[str]], bool]:
    # A reset asked with 0 frames in flight, or "whatever is in flight" with D=2 (one frame at most, which the
    # one-frame flag of 0.12-0.21 handles: the reset-inflight control is OK on every release).
    return lambda op, _: op.in_flight == 0 or (op.in_flight is None and script.setup.depth == 2)


def _deep_reset(script: Script) -> Callable[[Op, set[str]], bool]:
    return lambda op, _: script.setup.depth == 3 and (op.in_flight is None or op.in_flight >= 2)


def _any_reset(script: Script) -> Callable[[Op, set[str]], bool]:
    return lambda op, _: True


def _resets(which: Callable[[Script], Callable[[Op, set[str]], bool]], need: int = 1,
            when: Callable[[Script], bool] = lambda s: True) -> tuple[Callable[[Script], bool],
                                                                      Callable[[Script], Script]]:
    """A trigger "at least ``need`` resets of ``which`` kind (and ``when``)" and its control: those resets gone."""
    def trigger(s: Script) -> bool:
        return when(s) and len(_resets_where(s, which(s))) >= need

    def control(s: Script) -> Script:
        return _without(s, _resets_where(s, which(s)))
    return trigger, control


def _session_trigger(s: Script) -> Callable[[Op, set[str]], bool]:
    return _at_open_session


def _plain_sessions(s: Script) -> Script:
    """The script with every session an ordinary request (its first turn only, no feed or close).  The trigger is a
    session *waiting for its next chunk* at the reset, which the ops alone do not tell from a session mid-turn; so
    the control keeps the resets and takes the sessions away: a failure that stays (e.g. the deferred frees of a
    consumer KV connector with a frame in flight, measured so on 0.34.0) is not this row's."""
    reqs = tuple(replace(r, session=False, chunks=()) for r in s.requests)
    return Script(s.setup, reqs, tuple(op for op in s.ops if op.op not in ("feed", "close")))


def _has_session_reset(s: Script) -> bool:
    return bool(_resets_where(s, _at_open_session))


def _kv_in_flight_reset(s: Script) -> bool:
    return s.setup.kv_consumer and s.setup.is_async and any(op.op == "reset" and op.in_flight != 0 for op in s.ops)


def _no_connector(s: Script) -> Script:
    """Without the consumer KV connector nothing defers a block free (PR #45357): the control of reset-kv."""
    return replace(s, setup=replace(s.setup, kv_consumer=False, kv_load_failure=False))


def _is_async(s: Script) -> bool:
    return s.setup.is_async


def _async_spec(s: Script) -> bool:
    return s.setup.is_async and s.setup.spec_tokens > 0


def _session_spec(s: Script) -> bool:
    return s.setup.spec_accepted > 0 and any(r.chunks for r in s.requests)


def _no_accepted(s: Script) -> Script:
    return replace(s, setup=replace(s.setup, spec_accepted=0))


def _no_drafts(s: Script) -> Script:
    """The same script without speculative decoding: the control of the rows whose bug is the drafts' (a failure that
    stays without them is not theirs; measured: a session's STALL after a reset with a frame in flight on 0.21.0,
    with and without drafts, was filed under the spec-reset row while the resets were the control)."""
    return replace(s, setup=replace(s.setup, spec_tokens=0, spec_accepted=0))


def _deep_spec(s: Script) -> bool:
    return s.setup.is_async and s.setup.depth == 3 and s.setup.spec_tokens > 0


def _deep_prefix_preempt(s: Script) -> bool:
    """AsyncScheduler with three frames in flight, no drafts, prefix caching (fuzz_found.preempt_resume): a request
    preempted with output in flight and resumed from the prefix cache before that output is back."""
    return (s.setup.is_async and s.setup.depth == 3 and s.setup.spec_tokens == 0 and s.setup.enable_prefix_caching
            and not any(r.session for r in s.requests))


def _plenty_of_blocks(s: Script) -> Script:
    # The same max_model_len (so every request fits alike), a KV cache no request set can run out of.
    return replace(s, setup=replace(s.setup, num_blocks=max(s.setup.num_blocks, 64)))


def _turn_limits_differ(s: Script) -> bool:
    """A session fed a later chunk whose max_tokens is not its first turn's (fuzz_found.session_max_tokens)."""
    fed = {op.rid for op in s.ops if op.op == "feed"}
    return any(r.rid in fed and any(m != r.max_tokens for _, m in r.chunks) for r in s.requests if r.session)


def _same_turn_limits(s: Script) -> Script:
    """Every later turn asks for its first turn's max_tokens: the control of session-max-tokens."""
    return replace(s, requests=tuple(replace(r, chunks=tuple((p, r.max_tokens) for p, _ in r.chunks))
                                     for r in s.requests))


def _chunk_reset(s: Script) -> bool:
    """AsyncScheduler, a reset with frames in flight, and prefills that may be cut into chunks (a threshold, or a
    prompt longer than the step budget): a prefill chunk may be the frame in flight (fuzz_found.reset_chunk)."""
    longest = max((len(r.prompt) for r in s.requests), default=0)
    chunked = s.setup.long_prefill_token_threshold > 0 or longest > s.setup.max_num_batched_tokens
    return s.setup.is_async and chunked and any(op.op == "reset" and op.in_flight != 0 for op in s.ops)


def _whole_prefills(s: Script) -> Script:
    """No prefill cut into chunks: no threshold and a step budget every request's whole context fits at once."""
    budget = max(s.setup.max_num_batched_tokens, s.setup.max_model_len * max(1, len(s.requests)))
    return replace(s, setup=replace(s.setup, long_prefill_token_threshold=0, max_num_batched_tokens=budget))


def _sessions_fed(s: Script) -> bool:
    """Two or more sessions given a later chunk (each keeps its KV blocks between turns)."""
    return len({op.rid for op in s.ops if op.op == "feed"}) >= 2


def _room_for_all(s: Script) -> Script:
    """A KV cache every request holds at its longest at once (the control of session-kv-stall)."""
    per = -(-s.setup.max_model_len // s.setup.block_size)
    return replace(s, setup=replace(s.setup, num_blocks=max(s.setup.num_blocks, per * len(s.requests) + 1)))


def _deep_session(s: Script) -> bool:
    """AsyncScheduler with three frames in flight and a session (fuzz_found.session_overrun)."""
    return s.setup.is_async and s.setup.depth == 3 and any(r.session for r in s.requests)


def _depth_two(s: Script) -> Script:
    """One frame fewer in flight (the AsyncScheduler's skip counts one): the control of session-overrun."""
    return replace(s, setup=replace(s.setup, depth=2))


def _longest_context(s: Script) -> int:
    """An upper bound on the longest context a fed session can reach: its prompt and chunks, and every turn but the
    last running to the largest max_tokens of its turns less the one sampled token a next chunk drops
    (``_update_request_as_session``).  The largest, not each turn's own: vllm#37842 runs every turn to the first's."""
    fed = {op.rid for op in s.ops if op.op == "feed"}
    longest = 0
    for r in s.requests:
        if r.session and r.rid in fed:
            most = max(m for _, m in r.turns)
            longest = max(longest, sum(len(p) for p, _ in r.turns) + len(r.chunks) * (most - 1))
    return longest


def _session_at_limit(s: Script) -> bool:
    """A fed session whose turns may bring its context to max_model_len (fuzz_found.session_max_model_len)."""
    return _longest_context(s) >= s.setup.max_model_len


def _room_past_limit(s: Script) -> Script:
    """max_model_len (and a KV cache) past every session's longest context and last turn: the control of
    session-max-model-len.  The turns are left as they are (raising every turn to the first's, vllm#37842's control,
    grows the session further)."""
    most = max((m for r in s.requests for _, m in r.turns), default=1)
    limit = max(s.setup.max_model_len, _longest_context(s) + most + 1)
    per = -(-limit // s.setup.block_size)
    blocks = max(s.setup.num_blocks, per * len(s.requests) + 1)
    return replace(s, setup=replace(s.setup, max_model_len=limit, num_blocks=blocks))


def _signatures() -> tuple[Signature, ...]:
    session = (_has_session_reset, _plain_sessions)
    kv = (_kv_in_flight_reset, _no_connector)
    twice = (_resets(_any_reset, need=2, when=_async_spec)[0], _no_drafts)
    drained = _resets(_drained_reset, when=_is_async)
    spec = (_resets(_any_reset, when=_async_spec)[0], _no_drafts)
    deep = _resets(_deep_reset, when=_is_async)
    return (
        Signature("reset-session", ("crash",), _RESET_FAILED, *session,
                  "reset_prefix_cache(reset_running_requests=True) while a session waits for its next chunk"),
        Signature("reset-kv", ("crash",), _RESET_FAILED, *kv,
                  "the same reset with a consumer KV connector and a frame in flight (deferred frees)"),
        Signature("session-spec", ("crash",), "num_new_tokens", _session_spec, _no_accepted,
                  "a session turn cut inside a speculative step that accepted drafts, then a short chunk"),
        Signature("spec-reset-twice", ("crash",), _PLACEHOLDERS, *twice,
                  "two resets with speculative frames in flight"),
        Signature("pause", _STREAMISH, "", *drained,
                  "a drained reset with the requests running (vllm#42043's one-frame flag)"),
        Signature("reset-chunk", _STREAMISH, "", _chunk_reset, _whole_prefills,
                  "a reset while a prefill chunk is in flight (the one-frame flag outlives it)"),
        Signature("session-max-tokens", ("stream", "finish"), "", _turn_limits_differ, _same_turn_limits,
                  "a session's later turn with another max_tokens than its first"),
        Signature("session-kv-stall", ("stall", "finish"), "", _sessions_fed, _room_for_all,
                  "sessions holding KV blocks between turns, their next chunks too big to fit together"),
        Signature("session-max-model-len", ("stall",), "", _session_at_limit, _room_past_limit,
                  "a session whose next chunk brings its context to max_model_len (0 tokens a step from then on)"),
        Signature("session-overrun", ("stream",), "", _deep_session, _depth_two,
                  "a session's turn with three frames in flight (a frame scheduled past max_tokens)"),
        Signature("spec-reset", ("crash", *_STREAMISH), _PLACEHOLDERS, *spec,
                  "a reset with a speculative frame in flight"),
        Signature("preempt-deep", ("crash",), _PLACEHOLDERS, _deep_spec, _plenty_of_blocks,
                  "KV-pressure preemption with two speculative frames in flight"),
        Signature("preempt-resume", ("stream",), "", _deep_prefix_preempt, _plenty_of_blocks,
                  "KV-pressure preemption with two frames in flight, resumed from the prefix cache before they drain"),
        Signature("reset-deep", ("crash", *_STREAMISH), _PLACEHOLDERS, *deep,
                  "a reset with two frames in flight (the one-frame flag discards only the first)"),
    )


SIGNATURES: tuple[Signature, ...] = _signatures()
SCENARIOS: tuple[str, ...] = tuple(dict.fromkeys(s.scenario for s in SIGNATURES))


# --------------------------------------------------------------------------- classification


@dataclass(frozen=True)
class Row:
    """A known-bug row that covers the release under test (``repro.core.wire.FuzzKnown`` without the wire)."""

    scenario: str
    async_on: bool
    bug: str
    expect: str


def classify(script: Script, kind: str, failure: str, rows: Sequence[Row],
             fails_alike: Callable[[Script], bool]) -> Match | None:
    """The known-bug row a failure of ``kind`` (``failure``: its one-line text) on ``script`` is, or None (new).

    ``rows``: the rows covering this release; ``fails_alike(control)``: whether the control script fails with a
    failure of the same kind (a replay on the same release).  The first signature (in :data:`SIGNATURES` order)
    whose row covers the release and scheduler, which fits the failure, and whose control does not fail alike
    names the row; where several fit and each control still fails, the script with all their controls applied is
    tried, and if it does not fail alike the first of them names the row (two known bugs in one example)."""
    covering = {(r.scenario, r.async_on): r for r in rows}
    fitting = [(sig, row) for sig in SIGNATURES
               if (row := covering.get((sig.scenario, script.setup.is_async))) is not None
               and sig.fits(script, kind, failure)]
    for sig, row in fitting:
        if not fails_alike(sig.control(script)):
            return Match(row.bug, row.scenario, row.expect)
    if len(fitting) > 1:
        # Two known bugs at once (measured on 0.21.0, seed 1: a session whose second turn asks for fewer tokens, with
        # three frames in flight, is both vllm#37842 and the D=3 overrun): each control leaves the other's trigger, so
        # each still fails; with every fitting control applied it does not, and it is filed under the first row.
        both = script
        for sig, _ in fitting:
            both = sig.control(both)
        if not fails_alike(both):
            row = fitting[0][1]
            return Match(row.bug, row.scenario, row.expect)
    return None
