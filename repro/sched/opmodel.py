"""The scheduler fuzzer's operation model, pure: no vLLM, no Hypothesis (the harness and unit tests import it).

``repro/sched/fuzz.py`` drives vLLM's real scheduler with a Hypothesis
``RuleBasedStateMachine``; what its rules may do in a given state, which
setups and requests are ones a real engine could be in, and the two checks it
makes live here, so they can be tested without vLLM:

* :func:`setup_for`: a drawn (depth, KV-cache blocks, draft tokens) as a :class:`Setup` whose
  ``max_model_len`` fits the KV cache — vLLM refuses to start an engine whose ``max_model_len`` does not
  fit, so a request that can never be scheduled would be a harness artefact, not a finding;
* :class:`FuzzState`: the requests and operations drawn so far, the rule preconditions (add, pause,
  resume, abort, a reset with 0..D-1 frames in flight) and the replayable :class:`Script` of them;
* :func:`stream_fault` (the invariant: every delivered stream is the tokens of its output positions
  0..n-1, :func:`repro.sched.script.token_at`) and :func:`finish_fault` (at teardown: every request that
  was not aborted finished with all its ``max_tokens`` tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from repro.sched.script import Op, RequestSpec, Script, Setup

BLOCK_SIZE = 16
MAX_MODEL_LEN = 256  # the Setup default, and the bigram checkpoint's positions are far more
MIN_BLOCKS = 3  # vLLM's null block, plus two blocks (32 tokens) for requests
PROMPT_ALPHABET = 12  # prompt token ids 2..13
MAX_PROMPT = 24  # tokens: up to two blocks
# A long prompt: longer than the smaller token budgets (BUDGETS), so it is prefilled in chunks over several steps.
LONG_PROMPT = 120
# max_num_batched_tokens: the default, then budgets a long prompt (and several short ones at once) exceed.
BUDGETS = (256, 64, 32, 16)
# Bound on the iterations of the teardown's run to completion: a few requests of at most
# MAX_MODEL_LEN tokens finish in far fewer, even preempted again and again; reaching it is a hang.
FUZZ_MAX_STEPS = 2000


@dataclass(frozen=True)
class Knobs:
    """The scheduler options beyond depth, KV cache and drafts that a setup draws (each shrinks to the default)."""

    budget: int = BUDGETS[0]  # max_num_batched_tokens (at least max_num_seqs, as vLLM requires)
    policy: str = "fcfs"
    long_prefill: int = 0  # long_prefill_token_threshold
    log_stats: bool = False
    no_prefix_caching: bool = False
    # A consumer KV connector that moves nothing (Setup.kv_consumer): the connector's scheduler side runs on every
    # step, and with D >= 2 vLLM defers freeing a finished or preempted request's blocks (PR #45357).
    kv_consumer: bool = False


def setup_for(depth: int, num_blocks: int, spec_tokens: int = 0, spec_accepted: int = 0,
              max_num_seqs: int = 16, knobs: Knobs = Knobs(), sync_spec: bool = True) -> Setup:
    """The Setup a drawn depth (1: the sync Scheduler; 2, 3: the AsyncScheduler), KV-cache size and draft count
    mean.

    vLLM starts an engine only when ``max_model_len`` tokens fit its KV cache, and one block of the pool is its
    null block, so ``max_model_len`` is what ``num_blocks - 1`` blocks hold (at most :data:`MAX_MODEL_LEN`).
    Drafts are scripted for both schedulers (the sync one gets them as the worker's draft ids); ``sync_spec``
    False keeps the sync Scheduler draftless (a release whose sync Scheduler cannot be built with drafts).
    """
    if num_blocks < MIN_BLOCKS:
        raise ValueError(f"num_blocks={num_blocks}: at least {MIN_BLOCKS} (vLLM's null block plus two)")
    is_async = depth > 1
    spec = spec_tokens if is_async or sync_spec else 0
    return Setup(scheduler="async" if is_async else "sync", depth=depth, num_blocks=num_blocks,
                 block_size=BLOCK_SIZE, max_num_seqs=max_num_seqs,
                 max_num_batched_tokens=max(knobs.budget, max_num_seqs),
                 max_model_len=min(MAX_MODEL_LEN, (num_blocks - 1) * BLOCK_SIZE),
                 enable_prefix_caching=not knobs.no_prefix_caching,
                 spec_tokens=spec, spec_accepted=min(spec_accepted, spec), max_steps=FUZZ_MAX_STEPS,
                 policy=knobs.policy, long_prefill_token_threshold=knobs.long_prefill, log_stats=knobs.log_stats,
                 kv_consumer=knobs.kv_consumer)


def prompt_tokens(first: int, length: int) -> tuple[int, ...]:
    """A prompt from two draws: ``length`` tokens counting up from ``first`` through a small alphabet (ids 2..,
    clear of the checkpoint's BOS/EOS).  Prompts with the same ``first`` are prefixes of one another, so the
    prefix cache hits whole blocks; two draws instead of one per token keep Hypothesis' cost per example low."""
    return tuple(2 + (first + i) % PROMPT_ALPHABET for i in range(length))


def drawn_setup(depths: Sequence[int], spec_tokens: Sequence[int], depth_i: int, num_blocks: int, k_i: int,
                accepted: int, max_num_seqs: int, knobs: Knobs = Knobs(), sync_spec: bool = True) -> Setup:
    """The Setup of raw draws, mapped onto a run's choices (indices taken modulo their number, so the rules are
    written once for every run and shrink towards the first choice)."""
    return setup_for(depths[depth_i % len(depths)], num_blocks, spec_tokens[k_i % len(spec_tokens)], accepted,
                     max_num_seqs, knobs, sync_spec)


def fit_request(setup: Setup, rid: str, prompt: Sequence[int], max_tokens: int, priority: int = 0) -> RequestSpec:
    """A drawn request cut to what the engine accepts: prompt plus output within ``max_model_len``
    (a longer one would be refused by vLLM's input processing, or finish capped rather than by length).
    A priority counts only under the priority policy (kept 0 otherwise: the script says what mattered)."""
    kept = tuple(prompt[: max(1, setup.max_model_len - 1)])
    return RequestSpec(rid, kept, max(1, min(max_tokens, setup.max_model_len - len(kept))),
                       priority if setup.policy == "priority" else 0)


@dataclass
class FuzzState:
    """What one example has drawn so far: its setup, requests and operations, and the rule preconditions."""

    setup: Setup
    pause_supported: bool  # the release has set_pause_state (0.17+; 0.16.0 has none)
    max_requests: int
    requests: list[RequestSpec] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    paused: bool = False
    torn_down: bool = False  # the teardown's ops are among ``ops``
    closed: set[str] = field(default_factory=set)  # sessions whose input stream was closed
    groups: dict[str, list[str]] = field(default_factory=dict)  # n > 1 requests: parent id -> child ids

    # ------------------------------------------------------------------ preconditions

    def can_add(self, n: int = 1) -> bool:
        return len(self.requests) + n <= self.max_requests

    def can_pause(self) -> bool:
        return self.pause_supported and not self.paused

    def can_resume(self) -> bool:
        return self.paused

    # ------------------------------------------------------------------ operations

    def add(self, prompt: Sequence[int], max_tokens: int, priority: int = 0, session: bool = False
            ) -> tuple[Op, RequestSpec]:
        req = replace(fit_request(self.setup, f"r{len(self.requests)}", prompt, max_tokens, priority),
                      session=session)
        self.requests.append(req)
        return Op("add", rid=req.rid), req

    def add_group(self, prompt: Sequence[int], max_tokens: int, priority: int, n: int
                  ) -> list[tuple[Op, RequestSpec]]:
        """An n > 1 request's children (as many as still fit ``max_requests``, at least 2 when called with room for
        2): one prompt, ids ``<k>_<parent>`` as vLLM's ParentRequest names them."""
        parent = f"g{len(self.requests)}"
        n = max(0, min(n, self.max_requests - len(self.requests)))
        if n == 0:
            return []
        out = []
        for k in range(n):
            req = fit_request(self.setup, f"{k}_{parent}", prompt, max_tokens, priority)
            self.requests.append(req)
            out.append((Op("add", rid=req.rid), req))
        self.groups[parent] = [req.rid for _, req in out]
        return out

    @staticmethod
    def abort_children(live: Sequence[str]) -> Op | None:
        """AsyncLLM.abort(parent): one batched abort of the children still unfinished (one left: a single abort)."""
        if not live:
            return None
        return Op("abort_many", rids=tuple(live)) if len(live) > 1 else Op("abort", rid=live[0])

    def open_sessions(self) -> list[str]:
        return [r.rid for r in self.requests if r.session and r.rid not in self.closed]

    def feed(self, rid: str, prompt: Sequence[int], max_tokens: int) -> tuple[Op, RequestSpec] | None:
        """Session ``rid``'s next chunk, cut so every turn so far, outputs included, stays within max_model_len
        (vLLM keeps a session's earlier turns as context); None when no room is left."""
        i = next(k for k, r in enumerate(self.requests) if r.rid == rid)
        req = self.requests[i]
        room = self.setup.max_model_len - sum(len(p) + m for p, m in req.turns)
        if room < 2:
            return None
        # A chunk shorter than k after a turn that ended inside a speculative step with accepted drafts fails
        # ``assert num_new_tokens > 0`` in schedule() (sync Scheduler <= 0.32, AsyncScheduler <= 0.30): the known
        # rows "session turn cut inside a spec step" (scenario session-spec).  Drawn again since issue 38 (such
        # chunks were lengthened to k tokens before); a failing example is reported KNOWN (repro.sched.known).
        kept = tuple(prompt[: room - 1])
        self.requests[i] = replace(req, chunks=(*req.chunks, (kept, max(1, min(max_tokens, room - len(kept))))))
        return Op("feed", rid=rid), self.requests[i]

    def close(self, rid: str) -> Op:
        self.closed.add(rid)
        return Op("close", rid=rid)

    def reset(self, in_flight: int | None) -> Op:
        """A reset as an engine core can meet it: between two iterations at most D-1 frames are in flight
        (``EngineCore.step_with_batch_queue`` processes the oldest as soon as D are), so more is clamped to
        D-1; None resets with whatever is in flight."""
        # With a consumer KV connector and frames in flight (D >= 2) vLLM defers the preempted requests' block
        # frees (PR #45357), and reset_prefix_cache(reset_running_requests=True) raises "Failed to reset KV cache"
        # (scheduler.py:2870 at v0.32.0): the known row "reset with deferred frees" (scenario reset-kv, >= 0.24.0).
        # Drawn again since issue 38 (it was forced drained before); reported KNOWN (repro.sched.known).
        if in_flight is None:
            return Op("reset")
        return Op("reset", in_flight=min(in_flight, self.setup.depth - 1))

    @staticmethod
    def abort(running: Sequence[str], pick: int) -> Op | None:
        """Abort one of the running requests (``pick`` modulo their number); None when none runs."""
        return Op("abort", rid=running[pick % len(running)]) if running else None

    @staticmethod
    def abort_many(submitted: Sequence[str], picks: Sequence[int]) -> Op | None:
        """One batched abort of several submitted requests (``picks`` modulo their number, each once, in pick
        order); None unless two or more are picked."""
        rids = tuple(dict.fromkeys(submitted[p % len(submitted)] for p in picks)) if submitted else ()
        return Op("abort_many", rids=rids) if len(rids) > 1 else None

    def record(self, op: Op) -> None:
        self.ops.append(op)
        if op.op == "close" and op.rid is not None:
            self.closed.add(op.rid)
        if op.op in ("pause", "resume"):
            self.paused = op.op == "pause"

    def teardown_ops(self) -> list[Op]:
        """Run to completion: resume first if paused (a paused scheduler schedules nothing), and close every open
        session (one waiting for input is not unfinished work to vLLM)."""
        return [*([Op("resume")] if self.paused else []), *(Op("close", rid=r) for r in self.open_sessions()),
                Op("run")]

    def script(self) -> Script:
        """The replayable script of this example: the ops it applied, then the teardown's unless they ran already
        (where an example fails mid-way, its replay still runs to completion: on a release without the fault every
        request finishes and the replay is OK, not TRUNCATED)."""
        tail = [] if self.torn_down else self.teardown_ops()
        return Script(self.setup, tuple(self.requests), (*self.ops, *tail))

    def tear_down(self) -> list[Op]:
        """The teardown's ops, marked as applied (they become part of ``ops`` as they run)."""
        ops = self.teardown_ops()
        self.torn_down = True
        return ops


# --------------------------------------------------------------------------- the checks


def stream_fault(reference: Sequence[int], observed: Sequence[int], max_tokens: int) -> str | None:
    """Why a delivered stream is not the tokens of its positions 0..n-1 (``reference[p]`` is
    ``token_at(perm, prompt, p)``), or None."""
    if len(observed) > max_tokens:
        return f"{len(observed)} tokens delivered, max_tokens={max_tokens}"
    for p, (got, want) in enumerate(zip(observed, reference, strict=False)):
        if got != want:
            return (f"position {p}: delivered {got}, the token of position {p} is {want} "
                    f"(delivered {list(observed)}, positions 0..{len(observed) - 1} are "
                    f"{list(reference[: len(observed)])})")
    return None


def finish_fault(observed: int, max_tokens: int, finish_reason: str | None, aborted: bool) -> str | None:
    """Why a request is not properly finished after the run to completion, or None (aborted ones are done)."""
    if aborted:
        return None
    if finish_reason is None:
        return f"never finished ({observed} of {max_tokens} tokens delivered)"
    if observed != max_tokens:
        return f"finished ({finish_reason}) with {observed} of {max_tokens} tokens"
    return None


# --------------------------------------------------------------------------- after Hypothesis' shrinking


def failure_kind(message: str, vllm_site: str | None) -> str:
    """What kind of failure an example hit, for telling whether a smaller script fails *alike*: vLLM raising
    (at that frame), a stall, a stream off its positions, or a request not finished."""
    if vllm_site is not None:
        return f"crash at {vllm_site}"
    if "stalled:" in message:
        return "stall"
    if "position" in message or "tokens delivered, max_tokens" in message:
        return "stream"
    if "finished" in message:
        return "finish"
    return message.split(":", 1)[0]


def reductions(script: Script) -> Iterator[Script]:
    """Smaller scripts than ``script``, biggest cuts first: a request with every op naming it, a pause with the
    resume that follows it, any one other op.  The teardown's last ``run`` stays, so each still runs to
    completion."""
    ops = list(script.ops)
    for req in script.requests:
        if len(script.requests) > 1:
            yield Script(script.setup, tuple(r for r in script.requests if r.rid != req.rid),
                         tuple(without(ops, req.rid)))
    for i, op in enumerate(ops):
        if op.op == "pause":  # either mode
            j = next((k for k in range(i + 1, len(ops)) if ops[k].op == "resume"), None)
            if j is not None:
                yield Script(script.setup, script.requests, tuple(o for k, o in enumerate(ops) if k not in (i, j)))
    for i, op in enumerate(ops):
        # Never one add (its request's ops would dangle), resume (a pause left on stalls the run) or close (a
        # session left open never finishes): each would fail for a reason of its own, not alike.
        if op.op not in ("add", "resume", "close") and not (op.op == "run" and i == len(ops) - 1):
            yield Script(script.setup, script.requests, tuple(ops[:i] + ops[i + 1:]))


def without(ops: Sequence[Op], rid: str) -> Iterator[Op]:
    """``ops`` without request ``rid``: the ops naming only it go, a batched abort keeps the others' ids (and
    becomes a single abort when one is left)."""
    for op in ops:
        if rid not in op.named:
            yield op
        elif op.rids is not None and len(op.rids) > 1:
            rest = tuple(r for r in op.rids if r != rid)
            yield Op("abort_many", rids=rest) if len(rest) > 1 else Op("abort", rid=rest[0])


def minimise(script: Script, fails: Callable[[Script], bool], budget: int = 300) -> Script:
    """Greedy delta debugging after Hypothesis: take the first reduction that still ``fails`` until none does (or
    ``budget`` tries are spent).  Hypothesis deletes one rule at a time, so a pause/resume pair, or a request
    whose every op would have to go at once, can survive its shrinking."""
    tries = 0
    while tries < budget:
        for smaller in reductions(script):
            tries += 1
            if fails(smaller):
                script = smaller
                break
            if tries >= budget:
                break
        else:
            break
    return script
