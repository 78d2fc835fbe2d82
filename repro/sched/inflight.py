"""``inflight_add_abort``: requests added and aborted while a step is in flight (issue 33 item 4).

vLLM 0.34.0's ``EngineCoreProc._wait_for_output`` (vllm/v1/engine/core.py:1928-1955) handles ADD and ABORT
inputs while it waits for a step's output (``_INPUTS_HANDLED_DURING_STEP``, core.py:1317-1322; mp and Ray v2
executors, whose futures poll).  Under the async batch queue (two batches) ``step_with_batch_queue`` has
scheduled N+1 and pops N before that wait (core.py:820-833), so an abort (``abort_requests`` ->
``finish_requests(ids, FINISHED_ABORTED)``, core.py:610-616) and, new in 0.34.0, an add now land between
``schedule(N+1)`` and ``update_from_output(N)``.  0.33.0 ran adds only between ``update_from_output`` and the
next ``schedule``; its aborts already reached that point through ``_process_aborts_queue`` (33: core.py:778-792).
With async off ``step`` waits the same way (core.py:730): between ``schedule(N)`` and ``update_from_output(N)``.

The script, with ``depth`` frames in flight at each point (the scheduler tier's batch queue):

* point A (frames N, N+1 in flight): abort running ``r0``; add ``n0`` and ``n1``; add ``x0`` and abort it at
  once (never scheduled); abort running ``r1`` and add ``r1b``, a new id with ``r1``'s prompt (a client's retry);
* ``update_from_output(N)``, ``schedule(N+2)``: point B (N+1, N+2 in flight; ``n1``'s first frame is one of them):
  abort ``n1`` before it delivered a token; add ``n2``;
* run to completion.  ``r2`` and ``r3`` are untouched.

The oracle (harness.sched.inflight): aborted streams a prefix of their reference with no token after their abort,
every other stream its solo reference exactly, no CRASH or STALL, and the scheduler empty at the end
(:func:`end_state`: no request held, every KV block free).  The precondition (:func:`precondition`): every add
and abort after the first ``fill`` ran with ``depth`` frames in flight, each aborted running request was in one
of them, ``x0`` was never scheduled.

Pure (no vLLM import): the harness may import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from repro.sched.script import Op, RequestSpec, Script, ScriptError, _known, _requests, _setup_from

NAME = "inflight_add_abort"
# Ops that add or abort requests: the ones the precondition proves ran with frames in flight.
_TOUCH = ("add", "abort", "abort_many")


def inflight_add_abort(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """The module's script: 4 running requests (``n_requests``) with ``abort_after`` tokens (default 3), then
    the adds and aborts of points A and B with ``depth`` frames in flight (default 2; the sync Scheduler: 1)."""
    _known(params, {"abort_after"})
    setup = _setup_from(params, scheduler="async", depth=2)
    # 20-token prompts fill a 16-token block, which r1 caches and frees with frames in flight; r1b's prompt is the
    # same (whether it hits is the scheduler's business: the records cannot tell, and its stream must not either).
    base = _requests(params, vocab_size, seed, n=4, prompt_len=20, max_tokens=12)
    if len(base) < 4:
        raise ScriptError(f"n_requests={len(base)}: the script aborts r0 and r1 and keeps r2 and r3")
    fresh = _requests({**params, "n_requests": len(base) + 4}, vocab_size, seed, n=0, prompt_len=20,
                      max_tokens=12)[len(base):]
    added = tuple(RequestSpec(name, r.prompt, r.max_tokens) for name, r in zip(("n0", "n1", "n2", "x0"), fresh,
                                                                             strict=True))
    retry = RequestSpec("r1b", base[1].prompt, base[1].max_tokens)
    point_a = (Op("abort_many", rids=("r0",)), Op("add", rid="n0"), Op("add", rid="n1"), Op("add", rid="x0"),
               Op("abort_many", rids=("x0",)), Op("abort_many", rids=("r1",)), Op("add", rid="r1b"))
    point_b = (Op("abort_many", rids=("n1",)), Op("add", rid="n2"))
    ops = (*(Op("add", rid=r.rid) for r in base), Op("step_until", tokens=int(params.get("abort_after", 3))),
           Op("fill"), *point_a, Op("pop"), Op("fill"), *point_b, Op("run"))
    return Script(setup, (*base, *added, retry), ops)


def _frames_of(record: Mapping[str, Any]) -> set[int]:
    return {int(f["frame"]) for f in record.get("frames") or ()}


def precondition(log: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]], depth: int
                 ) -> dict[str, Any]:
    """The scenario event's ``precondition``: did every add and abort after the first ``fill`` run with ``depth``
    frames in flight, each aborted request that had been scheduled sit in one of them, and ``x0`` never run?"""
    by_rid = {str(r["rid"]): r for r in records}
    first_fill = next((i for i, e in enumerate(log) if e["op"]["op"] == "fill"), len(log))
    touched = [e for e in log[first_fill + 1:] if e["op"]["op"] in _TOUCH]
    problems = [f"{_op_text(e)} ran with {e.get('in_flight_before')} frame(s) in flight, not {depth}"
                for e in touched if e.get("in_flight_before") != depth]
    aborted = [(e, rid) for e in touched if e["op"]["op"] != "add" for rid in _named(e)]
    in_flight = [rid for e, rid in aborted
                 if _frames_of(by_rid.get(rid, {})) & set(e.get("frames_in_flight") or ())]
    never = [rid for _, rid in aborted if rid in by_rid and not _frames_of(by_rid[rid])]
    problems += [f"{rid} was aborted but neither in a frame in flight nor never scheduled"
                 for _, rid in aborted if rid not in in_flight and rid not in never]
    if "x0" not in never:
        problems.append("x0 was scheduled before its abort")
    adds = sum(e["op"]["op"] == "add" for e in touched)
    evidence = {"depth": depth, "adds_in_flight": adds, "aborts_in_flight": len(aborted),
                "aborted_in_a_frame_in_flight": in_flight, "aborted_never_scheduled": never}
    what = (f"{adds} add(s) and {len(aborted)} abort(s) with {depth} frame(s) in flight "
            f"({', '.join(in_flight)} aborted inside one, {', '.join(never)} never scheduled)")
    met = not problems and bool(adds) and bool(in_flight)
    why_not = "precondition not met: " + ("; ".join(problems) or "no add or no in-flight abort happened")
    return {"met": met, "what": what if met else why_not, "evidence": evidence}


def _named(entry: Mapping[str, Any]) -> list[str]:
    op = entry["op"]
    return [str(r) for r in op.get("rids") or ([op["rid"]] if op.get("rid") else [])]


def _op_text(entry: Mapping[str, Any]) -> str:
    return f"{entry['op']['op']} {','.join(_named(entry))}"


def end_state(sched: Any) -> dict[str, Any]:
    """What vLLM's scheduler still holds once every stream has finished and no frame is in flight: the ids in
    its ``requests`` table and its queues (``_free_blocks`` deletes a finished request, scheduler.py:3204-3207),
    and its block pool's free blocks against the pool (the null block never frees: block_pool.py:164).  Read
    with getattr: a fake scheduler, or a release without a block pool, gives None there."""
    pool = getattr(getattr(sched, "kv_cache_manager", None), "block_pool", None)
    free = getattr(pool, "get_num_free_blocks", None)
    total = getattr(pool, "num_gpu_blocks", None)
    return {"requests": sorted(str(r) for r in dict(getattr(sched, "requests", None) or {})),
            "waiting": len(list(getattr(sched, "waiting", None) or ())),
            "running": len(list(getattr(sched, "running", None) or ())),
            "free_blocks": int(free()) if callable(free) else None,
            "usable_blocks": int(total) - 1 if isinstance(total, int) else None}


def scenario_facts(log: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]], depth: int,
                   sched: Any) -> dict[str, Any]:
    """The fields this scenario adds to its ``scenario`` event: ``precondition`` and ``end_state``."""
    return {"precondition": precondition(log, records, depth), "end_state": end_state(sched)}
