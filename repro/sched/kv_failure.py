"""``kv_load_recompute``: a synchronous KV load that fails under ``kv_load_failure_policy="recompute"``
(vllm#45138, open, fix PRs #45146 open and #45430 closed; vllm#49250 part 2, open PR #49252).

The report (#45138, on v0.21.0): a request whose prompt is all an external hit completes its prefill in one step,
so ``AsyncScheduler._update_after_schedule`` adds an output placeholder; the worker then reports the loaded
blocks invalid, ``_update_requests_with_invalid_blocks`` truncates ``num_computed_tokens`` to the first invalid
block and leaves ``num_output_placeholders`` as it was (vllm/v1/core/sched/scheduler.py:3735-3852 at 0.34.0, no
line touches it).  The retry is then scheduled with ``num_tokens_with_spec + num_output_placeholders -
num_computed_tokens`` tokens: past the prompt (#49250 part 2: "appends garbage past the prompt"), or the
async stop check skips it for good (#45138: stranded in the running queue).

The script: requests ``f0`` (the failing connector, ``repro/sched/failing_connector.py``, promises its full
prompt blocks; the frame that schedules it reports them invalid) and ``r0`` (no external hit), both 40-token
prompts, ``max_tokens`` 6 (``max_tokens``), added together, then run to completion.  The setup: the failing
consumer connector with ``kv_load_failure_policy="recompute"`` (``kv_load_failure``).  The sync Scheduler is
the control (no placeholders).  Judged by the stream oracle (``f0`` must be its solo stream: the recompute
samples the same tokens) and STALL (never finished); the precondition (:func:`scenario_facts`) proves the load
was promised and reported failed.

Pure (no vLLM import): the harness may import it; :func:`fail_loads` reads vLLM's objects by attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repro.sched.script import Op, RequestSpec, Script, _known, _requests, _setup_from

NAME = "kv_load_recompute"


def kv_load_recompute(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """The module's script (defaults: ``f0`` and ``r0``, 40-token prompts, 6 tokens each)."""
    _known(params, set())
    setup = _setup_from(params, scheduler="async", depth=2, kv_consumer=True, kv_load_failure=True)
    base = _requests(params, vocab_size, seed, n=2, prompt_len=40, max_tokens=6)
    reqs = (RequestSpec("f0", base[0].prompt, base[0].max_tokens), *(
        RequestSpec(f"r{i}", r.prompt, r.max_tokens) for i, r in enumerate(base[1:])))
    return Script(setup, reqs, (*(Op("add", rid=r.rid) for r in reqs), Op("run")))


def fail_loads(sched: Any, req_ids: list[str], output: Any, frame: int) -> None:
    """The worker's side of the failing connector: the frame that first schedules a request whose load the
    connector promised reports the promised blocks in ``kv_connector_output.invalid_block_ids``."""
    conn = getattr(sched, "connector", None)
    promised = getattr(conn, "promised", None)
    kv_out = getattr(output, "kv_connector_output", None)
    if not promised or kv_out is None:
        return
    bs = int(conn.block_size)
    for rid in [r for r in req_ids if r in promised]:
        (blocks, *_) = sched.kv_cache_manager.get_block_ids(rid)
        bad = [int(b) for b in blocks[:promised.pop(rid) // bs]]
        kv_out.invalid_block_ids = set(kv_out.invalid_block_ids or ()) | set(bad)
        conn.failed.append({"rid": rid, "frame": frame, "blocks": bad})


def scenario_facts(sched: Any) -> dict[str, Any]:
    """The ``precondition``: the connector promised a load and a frame reported it failed (else nothing was
    recomputed, and the run tested nothing)."""
    conn = getattr(sched, "connector", None)
    failed = list(getattr(conn, "failed", None) or ())
    met = bool(failed) and bool(getattr(sched, "recompute_kv_load_failures", False))
    what = (f"the load of {', '.join(str(f['rid']) for f in failed)} ({sum(len(f['blocks']) for f in failed)} "
            f"block(s)) reported failed in frame(s) {[f['frame'] for f in failed]}, policy recompute")
    why = "precondition not met: " + ("no load was promised and failed" if not failed else
                                      "the scheduler does not recompute failed loads")
    return {"precondition": {"met": met, "what": what if met else why, "evidence": {"failed": failed}}}
