"""The scheduler tier, harness side: which cells it expresses, the spec ``python -m repro.sched`` runs, and how
its scenario events become cell results.

A cell of ``tier=scheduler`` drives vLLM's real ``Scheduler`` (async off) or ``AsyncScheduler`` (async on,
two frames in flight as EngineCore's batch queue keeps them) in-process with scripted model outputs
(``repro/sched``).  The keep-mode pause is its drained reset: every in-flight frame processed, then
``reset_prefix_cache(reset_running_requests=True)`` when ``clear_cache`` is true (vllm#42043's shape),
then generation resumes.  Other modes, scenarios and engine axes are not expressed yet: UNSUPPORTED
(``harness.matrix.unsupported_reason``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.core.cell import Cell, EngineKey
from harness.oracle import CellVerdict, Outcome, cell_verdict
from harness.results import CellResult, infra_result
from repro.sched.script import SCHEMA_VERSION
from repro.wire import FuzzSpec

MODULE = "repro.sched"


def sched_scenario(cell: Cell, scenario_id: str, seed: int) -> dict[str, Any]:
    """The ``repro.sched`` scenario of a keep-mode cell: a drained reset (``clear_cache``) or a plain pause."""
    async_on = cell.async_on
    params = {"scheduler": "async" if async_on else "sync", "depth": 2 if async_on else 1,
              "reset": cell.clear_cache}
    return {"id": scenario_id, "scenario": "drained_reset", "params": params, "seed": seed}


def sched_spec(engine: EngineKey, scenarios: list[dict[str, Any]], model_cache: str,
               model_params: dict[str, Any], fuzz: FuzzSpec | None = None) -> dict[str, Any]:
    """The spec of one scheduler-tier process: every scenario of the cells of ``engine`` (or of a ``plan``), and
    with ``fuzz`` a fuzz run after them (its many small events flushed, not fsynced)."""
    spec = {"schema_version": SCHEMA_VERSION, "version_label": engine.version, "model_cache": model_cache,
            "model": {"kind": "bigram-cycle", "params": dict(model_params)}, "scenarios": scenarios}
    if fuzz is not None:
        spec.update(fuzz=fuzz.to_json(), fsync=False)
    return spec


def sched_info(ev: dict[str, Any]) -> dict[str, Any]:
    """The facts of a ``sched`` event kept in every cell result (the release's scheduler API as detected)."""
    keep = ("vllm_version", "torch_version", "python", "platform", "scheduler_classes", "discard_mechanism",
            "reset_prefix_cache_params", "pause_state", "import_s", "load_s", "unsupported_reason")
    return {"tier": "scheduler", **{k: ev.get(k) for k in keep if k in ev}}


def sched_result(cell: Cell, ev: dict[str, Any], info: dict[str, Any] | None,
                 judge: Callable[[Cell, dict[str, Any], dict[str, Any]], CellResult]) -> CellResult:
    """A scheduler-tier ``scenario`` event as a cell result: ``judge`` (the engine tier's rules) for streams,
    unsupported and error.  A crash in vLLM's own code is CRASH; a stall (vLLM never finished a request) is
    TIMEOUT (:func:`sched_verdict`); a cell whose scheduler class is not the one its async axis names is
    UNSUPPORTED, never judged."""
    cls = str(ev.get("scheduler_class") or "")
    info = {**(info or {}), "effective": {"async_scheduling": cls.endswith(".AsyncScheduler"),
                                          "executor_class": cls.rsplit(".", 1)[-1] or None}}
    if ev.get("status") == "ran" and cls.endswith(".AsyncScheduler") != cell.async_on:
        return infra_result(cell, Outcome.UNSUPPORTED, f"asked for async {'on' if cell.async_on else 'off'} but "
                                                       f"vLLM built {cls or 'no scheduler'}", info)
    if ev.get("status") == "crash" or (ev.get("status") == "ran" and ev.get("stalled")):
        v = sched_verdict(ev)
        return infra_result(cell, v.outcome, v.reason or v.summary, info)
    return judge(cell, ev, info)


def sched_verdict(ev: dict[str, Any]) -> CellVerdict:
    """One scheduler-tier ``scenario`` event judged on its own (``plan`` and ``fuzz`` judge a script this way;
    the matrix through :func:`sched_result`): CRASH when vLLM's code raised, TIMEOUT when vLLM never finished a
    request (``stalled``; the streams' own verdict kept in the summary), else the oracle's verdict of the streams;
    UNSUPPORTED and ERROR with the scenario's reason."""
    status = ev.get("status")
    if status == "crash":
        reason = f"{ev['reason']} ({ev.get('vllm_source') or 'vLLM raised'})"
        return CellVerdict(Outcome.CRASH, f"CRASH: {reason}", reason=reason)
    if status != "ran":
        outcome = Outcome.UNSUPPORTED if status == "unsupported" else Outcome.ERROR
        reason = str(ev.get("reason") or f"scenario status {status!r}")
        return CellVerdict(outcome, reason, reason=reason)
    streams = cell_verdict(ev["records"])
    if not ev.get("stalled"):
        return streams
    reason = f"vLLM's scheduler never finished a request: {ev['stalled']}"
    summary = f"TIMEOUT: {reason}" + (
        "" if streams.outcome in (Outcome.OK, Outcome.TRUNCATED) else f"; streams: {streams.summary}")
    return CellVerdict(Outcome.TIMEOUT, summary, streams.counts, streams.requests, reason)
