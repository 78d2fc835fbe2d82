"""A scenario's report turned into its cell's result: the oracle's verdict, a CRASH, the precondition the
scenario proves, and the refusal of cells whose requested fault injection the engine did not apply.
"""

from __future__ import annotations

from dataclasses import replace

from harness.core.cell import Cell
from harness.core.events import (
    Precondition,
    ScenarioEvent,
)
from harness.core.oracle import Outcome, cell_verdict
from harness.core.records import EngineInfo
from harness.verdicts.results import CellResult, infra_result, judged_result


def injection_problem(info: EngineInfo | None, requested: tuple[str, ...]) -> str | None:
    """Why an engine's cells cannot count when faults were injected on request, or None.

    The engine core must report every requested fault as applied; a version
    whose code the injector does not recognise is not silently run un-injected.
    """
    if not requested:
        return None
    probe = info.probe if info is not None else {}
    # The engine core's probe carries it (the scheduler lives there).
    core = probe.get("core")
    inj = (core if isinstance(core, dict) else {}).get("inject", probe.get("inject"))
    if not isinstance(inj, dict):
        return f"fault injection {','.join(requested)} requested but the engine did not report it applied"
    applied = inj.get("applied") or {}
    missing = [f for f in requested if f not in applied]
    if missing:
        why = inj.get("error") or inj.get("reasons") or "no reason given"
        return f"fault injection {','.join(missing)} could not be applied on this vLLM: {why}"
    return None


def scenario_result(cell: Cell, ev: ScenarioEvent, info: EngineInfo | None) -> CellResult:
    """A ``scenario`` event judged into a cell result (infrastructure outcomes keep their reason)."""
    status = ev.status
    if status == "ran":
        verdict = cell_verdict(ev.records)
        return with_precondition(judged_result(cell, verdict, ev.records, info, ev.duration_s), ev.precondition)
    if status == "unsupported":
        return infra_result(cell, Outcome.UNSUPPORTED, ev.reason or "unsupported", info)
    if status == "timeout":
        return infra_result(cell, Outcome.TIMEOUT, ev.reason or "timeout", info)
    if status == "crash":
        # vLLM's own code raised in the engine core while the scenario drove it (repro.core.crash): a finding.
        return infra_result(cell, Outcome.CRASH, crash_reason(ev), info)
    return infra_result(cell, Outcome.ERROR, ev.reason or f"scenario status {status!r}", info)


def crash_reason(ev: ScenarioEvent) -> str:
    """A crash event's reason, with the vLLM source line it names when the reason does not quote it already."""
    reason, source = ev.reason or "vLLM raised", ev.vllm_source or ""
    return reason if not source or source in reason else f"{reason} ({source})"


def with_precondition(res: CellResult, pre: Precondition | None) -> CellResult:
    """A judged result and its scenario's precondition (engine-profile scenarios: did the event happen?).

    Met: the summary says what happened ("OK 8/8; 12 preemption(s) in 6/8 requests").  Not met: a cell whose
    streams are all right tested nothing and is UNSUPPORTED with the reason (its records kept); a wrong stream
    stays the finding it is, the unmet precondition added to its summary, except under a strict precondition (the
    client door's: a loss the framework's own calls did not provably meet is no finding about the framework).
    """
    if pre is None:
        return res
    what = pre.what
    if pre.met:
        return replace(res, summary=f"{res.summary}; {what}" if what else res.summary)
    if res.outcome is Outcome.OK or pre.strict:
        return replace(res, outcome=Outcome.UNSUPPORTED, summary=what, reason=what, label=Outcome.UNSUPPORTED.value)
    return replace(res, summary=f"{res.summary} ({what})")
