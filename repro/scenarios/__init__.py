"""Scenarios: one module per pause mode or known bug; each exposes ``build(sid, params, vocab, seed) -> Plan``.

A scenario that must act on the engine during a pause (weight sync swaps its
weights, manual reset resets the prefix cache), or whose reference is not the
engine's plain no-pause run (the engine-profile scenarios: preempt, chunked, sleep,
spec_ngram, spec_ngram_pause, logitsproc, connector_stale, stale_kv_*; see ``repro/scenarios/_profile.py``), also has a
runner in ``RUNNERS``, which ``repro.scenarios.cell_run.run_scenario`` calls instead of the
generic reference-then-plan run.  The harness names them by the catalogue
(``harness.core.scenarios``) with ``-`` spelled ``_``; ``manual-reset-reload``
runs as ``weight_sync`` with ``explicit_reset``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from repro.scenarios import (
    abort,
    abort_some,
    checkpoint,
    chunked,
    connector_stale,
    decode,
    keep,
    kv_loan,
    logitsproc,
    manual_reset,
    paused_admission,
    plan,
    preempt,
    reset_inflight,
    rlhf_weight_sync,
    seeded_prefill,
    sleep,
    spec_draft,
    spec_ngram,
    stale_kv,
    stale_kv_lora,
    wait,
)
from repro.scenarios.vocab import EngineContext, Plan

SCENARIOS: dict[str, Callable[[str, dict[str, Any], int, int], Plan]] = {
    "keep": keep.build,
    "wait": wait.build,
    "abort": abort.build,
    "plan": plan.build,
    "weight_sync": rlhf_weight_sync.build,
    "reset_inflight": reset_inflight.build,
    "manual_reset": manual_reset.build,
    "abort_some": abort_some.build,
    "preempt": preempt.build,
    "chunked": chunked.build,
    "sleep": sleep.build,
    "spec_ngram": spec_ngram.build,
    "spec_ngram_pause": spec_ngram.build_pause,
    "spec_draft": spec_draft.build,
    "seeded_prefill": seeded_prefill.build,
    "unseeded_prefill": seeded_prefill.build,
    "decode": decode.build,
    "logitsproc": logitsproc.build,
    "connector_stale": connector_stale.build,
    "checkpoint": checkpoint.build,
    "kv_loan": rlhf_weight_sync.build,
    "paused_admission": paused_admission.build,
    **{f"stale_kv_{v}": stale_kv.builder(v) for v in stale_kv.VARIANTS},
    **{f"native_update_{v}": stale_kv.builder(v) for v in stale_kv.NATIVE_VARIANTS},
    **{name: stale_kv.builder(variant) for name, (variant, _) in stale_kv.SLEEP_SCENARIOS.items()},
    **dict.fromkeys(stale_kv_lora.VARIANTS, stale_kv_lora.build),
}

RUNNERS: dict[str, Callable[[Any, dict[str, Any], EngineContext, float], Awaitable[dict[str, Any]]]] = {
    "weight_sync": rlhf_weight_sync.run,
    "manual_reset": manual_reset.run,
    "plan": plan.run,
    "preempt": preempt.run,
    "chunked": chunked.run,
    "sleep": sleep.run,
    "spec_ngram": spec_ngram.run,
    "spec_ngram_pause": spec_ngram.run_pause,
    "logitsproc": logitsproc.run,
    "connector_stale": connector_stale.run,
    "checkpoint": checkpoint.run,
    "kv_loan": kv_loan.run,
    "paused_admission": paused_admission.run,
    **{f"stale_kv_{v}": stale_kv.runner(v) for v in stale_kv.VARIANTS},
    **{f"native_update_{v}": stale_kv.runner(v, door="native") for v in stale_kv.NATIVE_VARIANTS},
    **{name: stale_kv.runner(variant, door) for name, (variant, door) in stale_kv.SLEEP_SCENARIOS.items()},
    **{name: stale_kv_lora.runner(name) for name in stale_kv_lora.VARIANTS},
}



def pauses(scenario: str, params: dict[str, Any], vocab_size: int) -> bool:
    """Whether the scenario pauses the engine (a vLLM without pause modes cannot run it).

    Decided by its plan, runners' too (weight sync and manual reset plan their pause; preempt, chunked and
    spec_ngram plan none); a plan that cannot be built counts as pausing, so its error is reported where it
    always was, by the scenario itself.
    """
    if scenario not in SCENARIOS:
        return True
    # The cell's request kind travels in the parameters; repro.scenarios.cell_run takes it out before the plan.
    params = {k: v for k, v in params.items() if k != "request"}
    try:
        return bool(SCENARIOS[scenario]("probe", params, vocab_size, 0).pauses)
    except (ValueError, TypeError, KeyError):
        return True
