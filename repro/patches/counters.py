"""Scheduler counters the engine-profile scenarios need as evidence that their event really happened.

A scenario that provokes something (KV-pressure preemption, speculative drafts, chunked prefill beside
decodes) must show it did, or its cell claims nothing (``repro.scenarios`` report a failed precondition
then, never OK).  vLLM keeps none of it where a client can read it: a finished request leaves
``Scheduler.requests`` with its ``num_preemptions``, and spec-decode acceptance reaches stat loggers only with
``log_stats`` on (the engines run with ``disable_log_stats=True``).  So the engine core counts, by wrapping
three scheduler methods when ``vllm.v1.core.sched.scheduler`` is imported (only the engine-core process does):

* ``Scheduler._preempt_request(request, ...)``: one preemption of ``request`` (KV pressure, or the
  force-preemption of ``reset_prefix_cache(reset_running_requests=True)``);
* ``Scheduler.make_spec_decoding_stats(..., num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
  request_id)``: called once per request and step that verified drafts, whatever ``log_stats`` says
  (vLLM 0.17-0.32); drafted = ``num_draft_tokens`` less the invalid ones, as vLLM's own stats count;
* ``Scheduler.schedule()``: after it, a scheduled request whose ``num_computed_tokens`` is still short of
  its prompt got a prefill *chunk*; a step holding such a chunk and a request past its prompt is *mixed*.

``EngineCore.repro_counters()`` (a utility: ``call_utility_async("repro_counters")``) returns them, per
vLLM request id, cumulative over the engine's life; scenarios take differences.  A hook whose method is
missing is listed in ``problems``, and its counter stays absent rather than zero.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any

SCHED_MODULE = "vllm.v1.core.sched.scheduler"
CORE_MODULE = "vllm.v1.engine.core"

COUNTS: dict[str, Counter[str]] = {}
STEPS: Counter[str] = Counter()
PROBLEMS: list[str] = []

AfterImport = Callable[[str, Callable[[Any], None]], None]


def install(after_import: AfterImport) -> None:
    """Wrap the scheduler when it is imported; add the ``repro_counters`` utility to EngineCore."""
    after_import(SCHED_MODULE, _patch_scheduler)
    after_import(CORE_MODULE, _patch_core)


def snapshot() -> dict[str, Any]:
    """Every counter: per-request counts, step counts, and the hooks that could not be installed."""
    return {"requests": {name: dict(c) for name, c in COUNTS.items()}, "steps": dict(STEPS),
            "problems": list(PROBLEMS)}


def _patch_core(module: Any) -> None:
    core = getattr(module, "EngineCore", None)
    if core is None:
        PROBLEMS.append("vllm.v1.engine.core has no EngineCore")
        return
    core.repro_counters = lambda self: snapshot()


def _patch_scheduler(module: Any) -> None:
    cls = getattr(module, "Scheduler", None)
    if cls is None:
        PROBLEMS.append("vllm.v1.core.sched.scheduler has no Scheduler")
        return
    for name, make in (("_preempt_request", _count_preemptions), ("make_spec_decoding_stats", _count_drafts),
                       ("schedule", _count_chunks)):
        orig = cls.__dict__.get(name)
        if orig is None:
            PROBLEMS.append(f"Scheduler.{name} not found: its counter is unavailable on this vLLM")
            continue
        if getattr(orig, "__repro_counted__", False):
            continue
        wrapped = functools.wraps(orig)(make(orig))
        wrapped.__repro_counted__ = True  # type: ignore[attr-defined]
        setattr(cls, name, wrapped)


def _count(name: str, rid: str, n: int = 1) -> None:
    COUNTS.setdefault(name, Counter())[rid] += n


def _count_preemptions(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _preempt_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _count("preemptions", str(request.request_id))
        return orig(self, request, *args, **kwargs)
    COUNTS.setdefault("preemptions", Counter())
    return _preempt_request


def _count_drafts(orig: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(orig)

    def make_spec_decoding_stats(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            a = sig.bind(self, *args, **kwargs).arguments
            rid = str(a.get("request_id"))
            drafted = int(a.get("num_draft_tokens") or 0) - int((a.get("num_invalid_spec_tokens") or {}).get(rid, 0))
            if drafted > 0:
                _count("drafted", rid, drafted)
                _count("accepted", rid, int(a.get("num_accepted_tokens") or 0))
        except (TypeError, ValueError, AttributeError) as exc:  # a signature we do not know: say so once
            if not any(p.startswith("make_spec_decoding_stats") for p in PROBLEMS):
                PROBLEMS.append(f"make_spec_decoding_stats: cannot read its arguments: {exc!r}")
        return orig(self, *args, **kwargs)
    COUNTS.setdefault("drafted", Counter())
    COUNTS.setdefault("accepted", Counter())
    return make_spec_decoding_stats


def _count_chunks(orig: Callable[..., Any]) -> Callable[..., Any]:
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        try:
            _note_step(self, out)
        except Exception as exc:  # never break vLLM's step over a counter
            if not any(p.startswith("schedule") for p in PROBLEMS):
                PROBLEMS.append(f"schedule: cannot read the step: {exc!r}")
        return out
    COUNTS.setdefault("prefill_chunks", Counter())
    return schedule


def _note_step(sched: Any, out: Any) -> None:
    scheduled = getattr(out, "num_scheduled_tokens", None) or {}
    chunks = decodes = 0
    for rid, n in scheduled.items():
        req = sched.requests.get(rid)
        if req is None or not n:
            continue
        # schedule() has already advanced num_computed_tokens by this step's tokens.
        if req.num_computed_tokens < req.num_prompt_tokens:
            chunks += 1
            _count("prefill_chunks", str(rid))
        elif req.num_computed_tokens - n >= req.num_prompt_tokens:
            decodes += 1
    STEPS["steps"] += 1
    STEPS["steps_with_chunk"] += chunks > 0
    STEPS["mixed_steps"] += chunks > 0 and decodes > 0
