"""The pure half of the scheduler tier: scripts (setup, requests, operations) and the token oracle.

Nothing here imports vLLM, torch or numpy, so the harness (and its unit tests)
may import it to build, validate and replay scripts.

A :class:`Script` is what one scenario of ``python -m repro.sched`` plays: how
to build the scheduler (:class:`Setup`), which requests exist
(:class:`RequestSpec`) and the operations in order (:class:`Op`).  Named
scenarios (:data:`SCENARIOS`) are functions from JSON parameters to a
Script; the ``ops`` scenario takes the operation list itself, so a fuzzer
can replay any sequence it drew.

The scripted executor answers the frame that samples output position ``p``
of a request with :func:`token_at` — the bigram-cycle walk from the prompt's
last token, the same stream the deterministic checkpoint produces — fixed
when the frame is *scheduled*.  Every stream is therefore known in advance
and any lost, repeated or shifted token is visible to the oracle.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

# The ``python -m repro.sched`` spec's version: 2 since a spec may carry ``fuzz`` (repro.core.wire.FuzzSpec).
SCHEMA_VERSION = 2

SCHEDULERS = ("async", "sync")
PAUSE_MODES = ("keep",)
# set_pause_state's modes an op may ask for: keep = PAUSED_ALL (nothing scheduled), new = PAUSED_NEW (no new
# request scheduled; the running ones, and those holding KV blocks, go on: vllm.v1.core.sched.interface.PauseState)
PAUSE_STATES = ("keep", "new")
POLICIES = ("fcfs", "priority")

# How many reference tokens beyond max_tokens each record carries: a stream that
# lost k tokens is the reference shifted by k, so the oracle needs the tail.
REFERENCE_SLACK = 16

# Operation kinds and what each does (executor.py implements them).
OP_KINDS: dict[str, str] = {
    "add": "submit request `rid` to the scheduler (Scheduler.add_request)",
    "step": "`n` engine-core iterations: schedule a frame while fewer than D are in flight, else process the "
            "oldest in-flight frame (EngineCore.step_with_batch_queue; D=1 is EngineCore.step)",
    "step_until": "step until every unfinished request has delivered at least `tokens` tokens",
    "fill": "schedule frames until D are in flight (or nothing can be scheduled)",
    "pop": "process the oldest in-flight frame (update_from_output)",
    "drain": "process every in-flight frame without scheduling, as a keep-mode pause does",
    "reset": "reset_prefix_cache(reset_running_requests=True); with `in_flight` set, first fill, then pop "
             "until that many frames remain in flight; with `connector`, reset_connector=True as well (what "
             "EngineCore's pause with clear_cache passes from 0.2x on; the KV connector's cache is reset too)",
    "pause": "set_pause_state(PAUSED_ALL) (keep mode), or PAUSED_NEW with `mode` \"new\"; `optional` skips it "
             "where the scheduler has no pause state",
    "resume": "set_pause_state(UNPAUSED); `optional` as for pause",
    "abort": "finish_requests(rid, FINISHED_ABORTED), with whatever frames are in flight",
    "feed": "add_request of the next chunk of session `rid` (the same id, resumable): a streaming-input "
            "session's next turn",
    "close": "add_request of session `rid`'s final sentinel (not resumable): the input stream ended",
    "abort_many": "finish_requests([rids...], FINISHED_ABORTED): EngineCore's batched abort of every id its "
                  "aborts queue holds (finished ones too: a client may abort a request that just finished)",
    "abort_all": "finish_requests(None, FINISHED_ABORTED): what EngineCore's pause in \"abort\" mode and its "
                 "shutdown do",
    "run": "step until every request has finished and no frame is in flight",
}


class ScriptError(ValueError):
    """A script or its parameters are malformed (bad input, not a finding about vLLM)."""


@dataclass(frozen=True)
class Setup:
    """How the scheduler is built and driven."""

    scheduler: str = "async"  # "async" (AsyncScheduler) or "sync" (Scheduler)
    depth: int = 2  # D: output frames kept in flight (EngineCore's batch queue size)
    num_blocks: int = 256  # KV-cache blocks of the one FullAttentionSpec group
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    max_model_len: int = 256
    enable_prefix_caching: bool = True
    # k draft tokens per decode step (scripted speculative decoding): placeholders for the AsyncScheduler, the
    # worker's draft ids (update_draft_token_ids after each step, as EngineCore.post_step) for the sync one
    spec_tokens: int = 0
    spec_accepted: int = 0  # how many of the k drafts each step accepts
    max_steps: int = 5000  # bound on iterations of one step_until / run (a hang is a finding, not a wait)
    policy: str = "fcfs"  # the scheduling policy: fcfs, or priority (RequestSpec.priority; preempts by it)
    long_prefill_token_threshold: int = 0  # >0: prefill chunks of a long prompt are cut to this many tokens
    log_stats: bool = False  # the scheduler's own stats (make_stats, prefix-cache and spec-decoding stats)
    # A consumer KV connector that moves nothing (repro/sched/null_connector.py): with D >= 2 it turns on
    # vLLM's deferred block frees (PR #45357), the precondition of vllm#49674.
    kv_consumer: bool = False
    # The consumer connector is repro/sched/failing_connector.py (promised loads of f* requests fail) with
    # kv_load_failure_policy="recompute" (vllm#45138, repro/sched/kv_failure.py); needs kv_consumer.
    kv_load_failure: bool = False

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ScriptError(f"scheduler={self.scheduler!r}; valid: {list(SCHEDULERS)}")
        if not 1 <= self.depth <= 3:
            raise ScriptError(f"depth={self.depth}: frames in flight must be 1, 2 or 3")
        if self.scheduler == "sync" and self.depth != 1:
            # The synchronous Scheduler processes each frame before scheduling the next
            # (more than one in flight is pipeline parallelism, which this tier does not model).
            raise ScriptError(f"depth={self.depth}: the sync Scheduler runs with one frame in flight")
        if self.scheduler == "async" and self.depth < 2:
            # EngineCore's batch queue holds max_concurrent_batches frames, 2 whenever async scheduling is
            # on; with 1, 0.21's scheduler hangs in states no engine reaches (measured), a false finding.
            raise ScriptError(f"depth={self.depth}: the AsyncScheduler runs with 2 or 3 frames in flight")
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                     "max_steps"):
            if getattr(self, name) < 1:
                raise ScriptError(f"{name}={getattr(self, name)}: must be at least 1")
        if self.kv_load_failure and (not self.kv_consumer or self.spec_tokens):
            raise ScriptError("kv_load_failure needs kv_consumer and no spec_tokens (the worker follows the "
                              "scheduler's num_computed_tokens)")
        if self.policy not in POLICIES or self.long_prefill_token_threshold < 0:
            raise ScriptError(f"policy={self.policy!r} (valid: {list(POLICIES)}), long_prefill_token_threshold="
                              f"{self.long_prefill_token_threshold} (>= 0)")
        if self.spec_tokens < 0 or not 0 <= self.spec_accepted <= self.spec_tokens:
            raise ScriptError(f"spec_tokens={self.spec_tokens}, spec_accepted={self.spec_accepted}: "
                              "need 0 <= spec_accepted <= spec_tokens")

    @property
    def is_async(self) -> bool:
        return self.scheduler == "async"


@dataclass(frozen=True)
class RequestSpec:
    rid: str
    prompt: tuple[int, ...]
    max_tokens: int
    priority: int = 0  # with Setup.policy "priority": lower runs first, the highest is preempted first
    # A streaming-input session (AsyncLLM.generate with an input stream): added resumable, then each ``feed`` op
    # adds the next of ``chunks`` ((prompt, max_tokens) of a later turn) and ``close`` the final sentinel.
    session: bool = False
    chunks: tuple[tuple[tuple[int, ...], int], ...] = ()

    def __post_init__(self) -> None:
        if not self.rid:
            raise ScriptError("a request needs a non-empty rid")
        if not self.prompt or any(not p for p, _ in self.chunks):
            raise ScriptError(f"request {self.rid}: empty prompt")
        if self.max_tokens < 1 or any(m < 1 for _, m in self.chunks):
            raise ScriptError(f"request {self.rid}: max_tokens={self.max_tokens} must be at least 1")
        if self.chunks and not self.session:
            raise ScriptError(f"request {self.rid}: only a session has later chunks")

    @property
    def turns(self) -> tuple[tuple[tuple[int, ...], int], ...]:
        """Every turn's (prompt, max_tokens): the first, then the chunks."""
        return ((self.prompt, self.max_tokens), *self.chunks)

    def to_dict(self) -> dict[str, Any]:
        return {"rid": self.rid, "prompt": list(self.prompt), "max_tokens": self.max_tokens,
                **({"priority": self.priority} if self.priority else {}),
                **({"session": True} if self.session else {}),
                **({"chunks": [[list(p), m] for p, m in self.chunks]} if self.chunks else {})}


@dataclass(frozen=True)
class Op:
    op: str
    rid: str | None = None  # add, abort
    n: int = 1  # step
    tokens: int = 0  # step_until
    in_flight: int | None = None  # reset
    optional: bool = False  # pause, resume
    mode: str | None = None  # pause: PAUSE_STATES (None: keep)
    rids: tuple[str, ...] | None = None  # abort_many
    connector: bool = False  # reset: reset_connector=True too

    def __post_init__(self) -> None:
        if self.op not in OP_KINDS:
            raise ScriptError(f"unknown op {self.op!r}; valid: {sorted(OP_KINDS)}")
        if self.op in ("add", "abort", "feed", "close") and not self.rid:
            raise ScriptError(f"op {self.op} needs a rid")
        if (self.op == "abort_many") != bool(self.rids) or (self.connector and self.op != "reset"):
            raise ScriptError(f"op {self.op}: rids={self.rids!r}, connector={self.connector}: only abort_many has "
                              "(and needs) rids, only reset has connector")
        if self.mode is not None and (self.op != "pause" or self.mode not in PAUSE_STATES):
            raise ScriptError(f"op {self.op}: mode={self.mode!r}; only pause has a mode, one of {list(PAUSE_STATES)}")
        if self.n < 1 or self.tokens < 0 or (self.in_flight is not None and self.in_flight < 0):
            raise ScriptError(f"op {self.op}: n >= 1, tokens >= 0 and in_flight >= 0 required")

    def to_dict(self) -> dict[str, Any]:
        """The op's JSON form: only the fields that differ from their defaults."""
        out = {"op": self.op, **{k: getattr(self, k) for k, d in _OP_DEFAULTS.items() if getattr(self, k) != d}}
        if self.rids is not None:
            out["rids"] = list(self.rids)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Op:
        unknown = set(data) - {"op", "rid", "n", "tokens", "in_flight", "optional", "mode", "rids", "connector"}
        if unknown or "op" not in data:
            raise ScriptError(f"bad op {dict(data)}: needs 'op'; unknown keys {sorted(unknown)}")
        doc = dict(data)
        if doc.get("rids") is not None:
            doc["rids"] = tuple(str(r) for r in doc["rids"])
        return cls(**doc)

    @property
    def named(self) -> tuple[str, ...]:
        """The requests this op names."""
        return (self.rid,) if self.rid is not None else (self.rids or ())


# Op's optional fields and their defaults (every executed op is logged as its JSON form).
_OP_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Op) if f.name != "op"}


@dataclass(frozen=True)
class Script:
    setup: Setup
    requests: tuple[RequestSpec, ...]
    ops: tuple[Op, ...]

    def __post_init__(self) -> None:
        rids = [r.rid for r in self.requests]
        if len(set(rids)) != len(rids):
            raise ScriptError(f"duplicate request ids: {rids}")
        added: set[str] = set()
        sessions = {r.rid: r for r in self.requests if r.session}
        fed: dict[str, int] = {}
        for op in self.ops:
            if op.op in ("feed", "close") and op.rid not in sessions:
                raise ScriptError(f"op {op.op} names {op.rid!r}, which is not a streaming-input session")
            if op.op == "feed":
                fed[op.rid or ""] = fed.get(op.rid or "", 0) + 1
                if fed[op.rid or ""] > len(sessions[op.rid or ""].chunks):
                    raise ScriptError(f"session {op.rid}: more feed ops than chunks")
            unknown = [r for r in op.named if r not in rids]
            if unknown:
                raise ScriptError(f"op {op.op} names unknown request {unknown[0]!r}")
            if op.op == "add":
                if op.rid in added:
                    raise ScriptError(f"request {op.rid} added twice")
                added.add(op.rid or "")
        if self.setup.depth == 1 and any(op.in_flight for op in self.ops):
            raise ScriptError("reset with frames in flight needs depth >= 2")

    def to_dict(self) -> dict[str, Any]:
        """The params of the ``ops`` scenario that replays this script exactly."""
        return {
            **asdict(self.setup),
            "requests": [r.to_dict() for r in self.requests],
            "ops": [op.to_dict() for op in self.ops],
        }


# --------------------------------------------------------------------------- the token oracle


def token_at(perm: Sequence[int], prompt: Sequence[int], position: int) -> int:
    """Output token ``position`` (0-based) of a request: ``position + 1`` steps of the cycle from the prompt."""
    if position < 0:
        raise ValueError(f"position={position}: must be >= 0")
    tok = prompt[-1]
    for _ in range(position + 1):
        tok = perm[tok]
    return tok


def reference_stream(perm: Sequence[int], prompt: Sequence[int], n: int) -> list[int]:
    """Output positions 0..n-1 of a request (what a faultless scheduler delivers, in order)."""
    out: list[int] = []
    tok = prompt[-1]
    for _ in range(n):
        tok = perm[tok]
        out.append(tok)
    return out


# --------------------------------------------------------------------------- named scenarios


def _setup_from(params: Mapping[str, Any], **defaults: Any) -> Setup:
    names = set(Setup.__dataclass_fields__)
    values = {**defaults, **{k: v for k, v in params.items() if k in names}}
    if "scheduler" in params and "depth" not in params:
        values["depth"] = 1 if values["scheduler"] == "sync" else defaults.get("depth", 2)
    return Setup(**values)


def _requests(params: Mapping[str, Any], vocab_size: int, seed: int, *, n: int, prompt_len: int,
              max_tokens: int) -> tuple[RequestSpec, ...]:
    n = int(params.get("n_requests", n))
    prompt_len = int(params.get("prompt_len", prompt_len))
    max_tokens = int(params.get("max_tokens", max_tokens))
    if n < 1 or prompt_len < 1:
        raise ScriptError(f"n_requests={n}, prompt_len={prompt_len}: both must be at least 1")
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    out: list[RequestSpec] = []
    while len(out) < n:
        # Ids 2.. stay clear of the checkpoint's BOS/EOS; distinct prompts keep prefix-cache hits honest.
        p = tuple(rng.randrange(2, vocab_size) for _ in range(prompt_len))
        if p not in seen:
            seen.add(p)
            out.append(RequestSpec(f"r{len(out)}", p, max_tokens))
    return tuple(out)


def _known(params: Mapping[str, Any], extra: set[str]) -> None:
    allowed = set(Setup.__dataclass_fields__) | {"n_requests", "prompt_len", "max_tokens"} | extra
    unknown = set(params) - allowed
    if unknown:
        raise ScriptError(f"unknown parameters {sorted(unknown)}; valid: {sorted(allowed)}")


def drained_reset(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """vllm#42043 (fixed by PR #42117 in 0.22.0): a keep-mode pause drains every in-flight frame, then
    ``reset_prefix_cache(reset_running_requests=True)`` preempts the running requests, then generation
    resumes.  0.21's AsyncScheduler marks each preempted request to discard "the latest async token" —
    but nothing is in flight any more, so the first real post-reset token is dropped: LOSS(1).
    """
    _known(params, {"reset_after", "reset"})
    setup = _setup_from(params, scheduler="async", depth=2)
    reqs = _requests(params, vocab_size, seed, n=4, prompt_len=8, max_tokens=12)
    after = int(params.get("reset_after", 4))
    # reset=False: the same keep-mode pause without clearing the cache (clear_cache=False), a control.
    reset = [Op("reset")] if params.get("reset", True) else []
    ops = [Op("add", rid=r.rid) for r in reqs] + [
        Op("step_until", tokens=after), Op("pause", optional=True), Op("drain"), *reset,
        Op("resume", optional=True), Op("run"),
    ]
    return Script(setup, reqs, tuple(ops))


def inflight_reset(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """The other half of PR #42117: a reset while ``in_flight`` frames are still in flight.  Default D=3,
    ``in_flight`` = D-1 = 2: what an engine core with a batch queue of D holds between two iterations
    (where a utility call such as the reset runs).  0.21's one-frame discard flag drops only the first
    stale frame, so the next stale frame's token is delivered before the request's recomputed one.
    With D=2 (one frame in flight, the case that flag was written for) it is the control.
    """
    _known(params, {"reset_after", "in_flight"})
    setup = _setup_from(params, scheduler="async", depth=3)
    reqs = _requests(params, vocab_size, seed, n=4, prompt_len=8, max_tokens=12)
    after = int(params.get("reset_after", 4))
    in_flight = int(params.get("in_flight", setup.depth - 1))
    if in_flight > setup.depth:
        raise ScriptError(f"in_flight={in_flight} exceeds depth={setup.depth}")
    ops = [Op("add", rid=r.rid) for r in reqs] + [
        Op("step_until", tokens=after), Op("reset", in_flight=in_flight), Op("run"),
    ]
    return Script(setup, reqs, tuple(ops))


def preempt_pressure(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """Negative control (PR #38624, closed unmerged, claimed a duplicate here): too few KV-cache blocks for
    every running request, so the scheduler preempts under memory pressure with frames in flight; the stale
    output of a preempted request must be delivered exactly once — neither lost nor duplicated — on every release.
    """
    _known(params, set())
    # 4 requests of 8 + 40 tokens need 3 blocks of 16 each at the end; 7 blocks force preemption.
    setup = _setup_from(params, scheduler="async", depth=2, num_blocks=7)
    reqs = _requests(params, vocab_size, seed, n=4, prompt_len=8, max_tokens=40)
    return Script(setup, reqs, tuple([Op("add", rid=r.rid) for r in reqs] + [Op("run")]))


def spec_decode(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """Control for the speculative-decoding scenarios: k scripted drafts per decode step (default 2), a
    scripted number accepted (default 1), D=2, no reset.  Every release must deliver every stream intact;
    if not, the scripted worker (not vLLM) is suspect."""
    _known(params, set())
    setup = _setup_from(params, scheduler="async", depth=2, spec_tokens=2, spec_accepted=1)
    reqs = _requests(params, vocab_size, seed, n=3, prompt_len=8, max_tokens=16)
    return Script(setup, reqs, tuple([Op("add", rid=r.rid) for r in reqs] + [Op("run")]))


def spec_reset(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """A reset with running requests under speculative decoding (k drafts, some rejected), with
    ``in_flight`` frames in flight (default D-1 = 1; 0 = drained first).  The family of PR #46066 (the
    rejection correction of a stale frame drives ``num_output_placeholders`` below zero; fixed in 0.25.0) and
    of PR #42117's counter (0.22-0.26 count the frames to discard in *tokens*, 1 + k per frame, and drain one
    frame per count; ended by PR #48245 in 0.27.0).  ``resets``
    (default 1) resets back to back, each with ``in_flight`` frames in flight."""
    _known(params, {"reset_after", "in_flight", "resets"})
    setup = _setup_from(params, scheduler="async", depth=2, spec_tokens=2, spec_accepted=1)
    reqs = _requests(params, vocab_size, seed, n=3, prompt_len=8, max_tokens=16)
    after = int(params.get("reset_after", 4))
    in_flight = int(params.get("in_flight", setup.depth - 1))
    resets = int(params.get("resets", 1))  # back to back, each with in_flight frames (a fuzzer's find)
    if in_flight > setup.depth or resets < 1:
        raise ScriptError(f"in_flight={in_flight} exceeds depth={setup.depth}, or resets={resets} < 1")
    reset = [Op("drain"), Op("reset")] if in_flight == 0 else [Op("reset", in_flight=in_flight)]
    ops = [Op("add", rid=r.rid) for r in reqs] + [Op("step_until", tokens=after), *reset * resets, Op("run")]
    return Script(setup, reqs, tuple(ops))


def abort_inflight(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """Abort one request while frames are in flight; the others must finish untouched and the aborted
    one must have delivered a prefix of its stream."""
    _known(params, {"abort_after"})
    setup = _setup_from(params, scheduler="async", depth=2)
    reqs = _requests(params, vocab_size, seed, n=3, prompt_len=8, max_tokens=12)
    after = int(params.get("abort_after", 3))
    ops = [Op("add", rid=r.rid) for r in reqs] + [
        Op("step_until", tokens=after), Op("fill"), Op("abort", rid=reqs[0].rid), Op("run"),
    ]
    return Script(setup, reqs, tuple(ops))


def explicit_ops(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """An explicit script: setup fields, ``requests`` [{rid, prompt, max_tokens}] and ``ops`` [{op, ...}]."""
    _known(params, {"requests", "ops"})
    setup = _setup_from(params)
    try:
        reqs = tuple(RequestSpec(str(r["rid"]), tuple(int(t) for t in r["prompt"]), int(r["max_tokens"]),
                                 int(r.get("priority", 0)), bool(r.get("session", False)),
                                 tuple((tuple(int(t) for t in c[0]), int(c[1])) for c in r.get("chunks", ())))
                     for r in params["requests"])
        ops = tuple(Op.from_dict(o) for o in params["ops"])
    except (KeyError, TypeError, IndexError) as exc:
        raise ScriptError(f"ops scenario needs requests [{{rid, prompt, max_tokens}}] and ops [...]: {exc!r}") \
            from exc
    for r in reqs:
        if any(not 0 <= t < vocab_size for p, _ in r.turns for t in p):
            raise ScriptError(f"request {r.rid}: prompt token outside the vocabulary (0..{vocab_size - 1})")
    return Script(setup, reqs, ops)


ScenarioFn = Callable[[Mapping[str, Any], int, int], Script]

SCENARIOS: dict[str, ScenarioFn] = {
    "drained_reset": drained_reset,
    "inflight_reset": inflight_reset,
    "preempt_pressure": preempt_pressure,
    "abort_inflight": abort_inflight,
    "spec_decode": spec_decode,
    "spec_reset": spec_reset,
    "ops": explicit_ops,
}


def build_script(scenario: str, params: Mapping[str, Any], vocab_size: int, seed: int = 0) -> Script:
    """The Script of a named scenario; ScriptError on an unknown name or bad parameters."""
    if scenario not in SCENARIOS:
        raise ScriptError(f"unknown scenario {scenario!r}; valid: {sorted(SCENARIOS)}")
    try:
        return SCENARIOS[scenario](params, vocab_size, seed)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ScriptError):
            raise
        raise ScriptError(f"scenario {scenario}: bad parameters {dict(params)}: {exc}") from exc


def with_setup(script: Script, **changes: Any) -> Script:
    """The same script under another setup (e.g. the sync Scheduler as a control)."""
    return replace(script, setup=replace(script.setup, **changes))
