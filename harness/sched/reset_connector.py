"""The ``reset-connector`` and ``reset-connector-keep`` scheduler-tier cells' oracle beyond the streams
(repro/sched/reset_connector.py plays them).

The streams are judged as every scenario's are (every kept stream its solo reference exactly; the precondition —
the release's ``reset_prefix_cache`` takes ``reset_connector``, the recording null connector attached, a drained
reset with requests running — through ``harness.run.scenario_results.with_precondition``).  One rule more: the
KV connector's ``reset_cache()`` must be called exactly once per reset that passed ``reset_connector=True`` and
never for one that passed False (vLLM's ``reset_connector_cache``).  A mismatch is DIVERGED (the connector's cache
diverged from what the call asked: kept when a reset was asked, so a later load may read KV the caller meant to
drop; dropped when it was not), with the counts in the reason; it overrides an OK or an unmet precondition, as a
wrong stream does.  Where the release has no ``reset_connector`` nothing asked for a connector reset, so
nothing is expected (the unmet precondition makes the cell UNSUPPORTED with the release's signature).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from harness.core.events import ScenarioEvent
from harness.core.oracle import Outcome
from harness.verdicts.results import CellResult


def expected_resets(ops_log: Sequence[Mapping[str, Any]]) -> int:
    """How many ``reset_cache()`` calls the script's resets asked for: those that passed ``reset_connector=True``
    (not skipped for a release without the parameter)."""
    return sum(1 for e in ops_log if e["op"]["op"] == "reset" and e["op"].get("connector")
               and not e.get("skipped_connector"))


def connector_fault(ev: ScenarioEvent) -> str | None:
    """Why the connector's recorded ``reset_cache()`` calls disagree with what the resets asked, or None."""
    if ev.status != "ran":
        return None
    conn = ev.raw.get("connector")
    calls = conn.get("reset_cache_calls") if isinstance(conn, Mapping) else None
    if calls is None:  # no recording connector: the precondition says so; nothing to count
        return None
    want, got = expected_resets(ev.raw.get("ops_log") or ()), len(calls)
    if got == want:
        return None
    asked = "reset_connector=True" if want else "reset_connector=False"
    return (f"the KV connector's reset_cache() was called {got} time(s); the reset(s) with {asked} ask for "
            f"{want}")


def with_connector_check(res: CellResult, ev: ScenarioEvent) -> CellResult:
    """``res`` (the streams' verdict and precondition) with the connector rule applied: a mismatch is DIVERGED
    unless the streams' own finding is worse; a match is named in the summary."""
    why = connector_fault(ev)
    if why is None:
        conn = ev.raw.get("connector") or {}
        calls = conn.get("reset_cache_calls") if isinstance(conn, Mapping) else None
        if calls is None or res.outcome is Outcome.UNSUPPORTED:
            return res
        return replace(res, summary=f"{res.summary}; reset_cache() called {len(calls)}x")
    if res.outcome.is_finding and res.outcome.rank >= Outcome.DIVERGED.rank:
        return replace(res, summary=f"{res.summary}; {why}")
    return replace(res, outcome=Outcome.DIVERGED, summary=f"DIVERGED: {why}", reason=why,
                   label=Outcome.DIVERGED.value)
