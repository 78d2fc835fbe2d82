"""One scheduler-tier scenario played on vLLM's scheduler: the fields of its ``scenario`` event.

Status ``ran`` (with the request records and the op log), ``unsupported`` (this vLLM cannot build the setup
or a request), ``crash`` (vLLM's own scheduler code raised while driven: a finding) or ``error`` (ours).
Used by the runner for every scenario of a spec and by the fuzzer to replay a falsifying example.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from repro.core.crash import raised_in_vllm
from repro.sched.adapter import Unsupported, vllm_crash_site
from repro.sched.admission import NAME as ADMISSION
from repro.sched.admission import precondition as admission_precondition
from repro.sched.executor import Executor, OpUnsupported
from repro.sched.inflight import NAME as INFLIGHT
from repro.sched.inflight import scenario_facts
from repro.sched.kv_failure import NAME as KV_FAILURE
from repro.sched.kv_failure import scenario_facts as kv_failure_facts
from repro.sched.reset_connector import NAME as RESET_CONNECTOR
from repro.sched.reset_connector import missing_parameter
from repro.sched.reset_connector import scenario_facts as connector_facts
from repro.sched.script import ScriptError
from repro.sched.spec_gap import NAME as SPEC_GAP
from repro.sched.spec_gap import record_spec
from repro.sched.spec_gap import scenario_facts as spec_gap_facts
from repro.sched.upstream import build_any_script


def run_scenario(adapter: Any, sc: dict[str, Any], model_dir: Path, perm: list[int]) -> dict[str, Any]:
    """One scenario's event fields: status ran / unsupported / crash / error, with records where it ran."""
    t0 = time.monotonic()
    try:
        script = build_any_script(sc["scenario"], sc.get("params") or {}, len(perm), int(sc.get("seed", 0)))
    except ScriptError as exc:
        return {"status": "error", "reason": f"bad scenario: {exc}"}
    base = {"scenario": sc["scenario"], "setup": script.to_dict(), "scheduler": script.setup.scheduler,
            "depth": script.setup.depth}
    try:
        sched = adapter.scheduler(model_dir, script.setup)
        hasher = adapter.block_hasher(script.setup.block_size) if script.setup.enable_prefix_caching else None
        ex = Executor(script, sched, adapter, perm, hasher)
    except Unsupported as exc:
        return {**base, "status": "unsupported", "reason": str(exc)}
    base["scheduler_class"] = f"{type(sched).__module__}.{type(sched).__qualname__}"
    spec_cfg = getattr(getattr(sched, "vllm_config", None), "speculative_config", None)
    if spec_cfg is not None:  # the drafter kind vLLM accepted with async scheduling (adapter._spec_config)
        base["spec_method"] = str(getattr(spec_cfg, "method", None))
    if sc["scenario"] == RESET_CONNECTOR and (why := missing_parameter(sched)):  # nothing to exercise
        return {**base, "status": "unsupported", "reason": why}
    spec_log = record_spec(sched) if sc["scenario"] == SPEC_GAP else None
    setup_s = round(time.monotonic() - t0, 3)
    try:
        ex.play()
    except (OpUnsupported, Unsupported) as exc:  # e.g. a Request this adapter cannot build, met at "add"
        return {**base, "status": "unsupported", "reason": str(exc)}
    except Exception as exc:
        site = vllm_crash_site(exc)
        result = {**base, "records": ex.records(), "ops_log": ex.log,
                  "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        if site is not None and _raised_in_vllm(exc):
            # vLLM's own scheduler code raised while driven: a finding about vLLM (CRASH), not ERROR.
            # A bare assert has no message, so the reason quotes vLLM's source line.
            return {**result, "status": "crash", "vllm_frame": site[0], "vllm_source": site[1],
                    "exception_type": type(exc).__name__, "message": str(exc),
                    "reason": f"{type(exc).__name__}: {str(exc) or site[1]} at {site[0]}"}
        return {**result, "status": "error"}
    if sc["scenario"] == INFLIGHT:  # its precondition and what the scheduler holds at the end
        base.update(scenario_facts(ex.log, ex.records(), script.setup.depth, sched))
    if sc["scenario"] == ADMISSION:  # every add before the first step; budget and cache hold a full step
        base["precondition"] = admission_precondition(ex.log, ex.records(), base["setup"])
    if spec_log is not None:  # each step's drafts: stale -1s after a scheduling gap (vllm#37159)
        base.update(spec_gap_facts(spec_log))
    if sc["scenario"] == KV_FAILURE:  # the promised load was reported failed, with the recompute policy
        base.update(kv_failure_facts(sched))
    if sc["scenario"] == RESET_CONNECTOR:  # the connector's recorded reset_cache() calls and the precondition
        base.update(connector_facts(ex.log, sched))
    return {**base, "status": "ran", "records": ex.records(), "ops_log": ex.log, "stalled": ex.stalled,
            "stall_state": ex.stall_state,
            "iterations": ex.iterations, "frames": ex.frames_made, "empty_frames": ex.empty_frames,
            "setup_s": setup_s,
            "duration_s": round(time.monotonic() - t0, 3)}


def _raised_in_vllm(exc: BaseException) -> bool:
    """The exception left vLLM's code last, rather than our own code after vLLM returned (repro.core.crash)."""
    return raised_in_vllm(exc, ours=(str(Path(__file__).resolve().parent),))
