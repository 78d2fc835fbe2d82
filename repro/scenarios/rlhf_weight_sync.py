"""RLHF weight sync: the flow of upstream's ``examples/rl/rlhf_async_new_apis.py``.

Generate with weights A, pause in keep mode once every running request has
``pause_after`` tokens, swap the engine's weights to B, resume, and check every
token.  A and B are bigram-cycle checkpoints of the same shape whose cycles
differ at every token (``repro.models.deterministic.swap_partner``), so the stream a request
must produce is known exactly: A's cycle up to the pause, then B's cycle from
the last pre-pause token (``repro.models.deterministic.swapped_continuation``).  The first
post-resume token must be ``perm_B[last pre-pause token]``; vLLM #42043 (keep
+ clear_cache + async scheduling, fixed by PR #42117 in 0.22.0) drops it.

Weight transfer (``weight_transfer`` parameter): ``reload`` in place or ``nccl`` from a trainer process
(``repro.scenarios.weight_transfer``).

The computed reference is cross-checked against vLLM, as upstream does: after
the run, while the engine still holds B, prompt + pre-pause tokens go in as new
requests and must continue exactly like the reference (and, with
``fresh_engine_check``, the same on a fresh engine loaded with B).  A
disagreement is an ERROR carrying both sequences, never a verdict.  Weights A
are restored (and checked) afterwards: later scenarios of the engine assume A.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.models.deterministic import (
    build_checkpoint,
    expected_continuation,
    load_perm,
    swap_partner,
    swapped_continuation,
)
from repro.scenarios._common import SinglePauseParams, single_pause_plan
from repro.scenarios.runs import check_pause_api, check_reset_api, reset_action, run_plan, run_reference, run_unpaused
from repro.scenarios.vocab import (
    REFERENCE_MARGIN,
    EngineContext,
    PauseAction,
    PauseSpec,
    Plan,
    RequestSpec,
    ScenarioFailed,
    ScenarioUnsupported,
    params_from_dict,
)
from repro.scenarios.weight_transfer import NcclTransfer, nccl_unsupported, reload_transfer

TRANSFERS = ("reload", "nccl")
MODES = ("keep",)
# Tokens generated after restoring A to check the engine really holds A again.
RESTORE_CHECK_TOKENS = 4


@dataclass(frozen=True)
class WeightSyncParams:
    mode: str = "keep"
    clear_cache: bool = True
    weight_transfer: str = "reload"
    # Also cross-check on a fresh engine loaded with B (an engine start: ~30 s
    # on a small CPU; meant for GPUs, where the same-engine check always runs too).
    fresh_engine_check: bool = False
    # The manual-reset-reload variant: pause with clear_cache=False, swap, then the client's own
    # reset_prefix_cache(reset_running_requests=True), as RL frameworks write it (repro.scenarios.manual_reset).
    explicit_reset: bool = False
    num_requests: int = 8
    extra_requests: int = 2
    prompt_len: int = 6
    max_tokens: int = 48
    pause_after: int = 8

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"weight_sync mode {self.mode!r}: the RLHF flow pauses in {'/'.join(MODES)} mode only")
        if self.weight_transfer not in TRANSFERS:
            raise ValueError(f"unknown weight_transfer {self.weight_transfer!r}; valid: {', '.join(TRANSFERS)}")
        if self.explicit_reset and self.clear_cache:
            raise ValueError("explicit_reset pauses with clear_cache=False: the reset is the client's explicit call")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WeightSyncParams:
        return params_from_dict(cls, data, "weight_sync parameters")

    def pause_params(self) -> SinglePauseParams:
        return SinglePauseParams(
            clear_cache=self.clear_cache, num_requests=self.num_requests, extra_requests=self.extra_requests,
            prompt_len=self.prompt_len, max_tokens=self.max_tokens, pause_after=self.pause_after,
        )


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """The requests and the pause; the swap is attached by :func:`run`."""
    p = WeightSyncParams.from_dict(params)
    # Requests submitted during the pause start after resume, i.e. under B.
    return single_pause_plan(sid, p.mode, p.pause_params(), vocab_size, seed, "during")


# --------------------------------------------------------------------------- reference


def swap_index(record: dict[str, Any]) -> int:
    """How many of the record's tokens were generated with weights A.

    A request running at the pause holds exactly its pre-pause tokens when the
    weights change (keep mode freezes it and the client has caught up with the
    engine before the swap); one submitted during or after the pause starts
    under B; one that ended before the pause ran under A throughout.
    """
    pauses = record.get("pauses") or []
    if pauses:
        return int(pauses[0]["client_tokens"])
    submit = record.get("submit")
    if submit in ("start", None):
        return int(record["max_tokens"]) + REFERENCE_MARGIN
    return 0


def computed_reference(record: dict[str, Any], perm_a: list[int], perm_b: list[int]) -> list[int]:
    """The stream ``record`` must show: A's cycle for its pre-swap tokens, B's after (plus a margin)."""
    n = int(record["max_tokens"]) + REFERENCE_MARGIN
    return swapped_continuation(perm_a, perm_b, record["prompt"][-1], swap_index(record), n)


def cross_check_request(rid: str, record: dict[str, Any], reference: list[int]) -> tuple[RequestSpec, list[int]] | None:
    """Prompt + pre-swap tokens as a new request, and what an engine holding B must answer.

    Built from the *computed* reference (not the observed stream), so a
    scheduler fault before the pause stays a verdict of the oracle and the
    check tests the reference itself.  None when nothing was generated under B.
    """
    n_a = swap_index(record)
    if n_a >= len(reference):
        return None
    return RequestSpec(rid, list(record["prompt"]) + reference[:n_a], len(reference) - n_a), reference[n_a:]


def disagreements(checked: list[tuple[str, list[int], list[int]]]) -> list[str]:
    """One line per (rid, computed, engine) triple whose engine stream differs from the computed one."""
    out = []
    for rid, expected, got in checked:
        if got != expected:
            diff = [i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b]
            at = diff[0] if diff else min(len(expected), len(got))
            out.append(f"{rid}: computed {expected} but the engine holding B gave {got} (first difference at {at})")
    return out


async def _transfer_for(params: WeightSyncParams, llm: Any, ctx: EngineContext, timeout: float) -> Any:
    """The transfer path asked for, or ScenarioUnsupported with the reason it cannot run here."""
    if params.weight_transfer == "reload":
        return await reload_transfer(llm)
    reason = nccl_unsupported(llm, ctx.tensor_parallel_size)
    if reason:
        raise ScenarioUnsupported(reason)
    return NcclTransfer(llm, ctx.tensor_parallel_size, timeout, ctx.work_dir)


# --------------------------------------------------------------------------- the scenario


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float,
              watch: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Play the weight-sync scenario ``sc`` on ``llm`` (holding A); return the scenario event's data.

    ``watch`` wraps the transfer (the same ``open``/``load``/``close``) to record what each load did inside the
    workers (``repro.scenarios.kv_loan``: whether the update borrowed the KV cache's memory)."""
    t0 = time.monotonic()
    params = WeightSyncParams.from_dict(sc.get("params", {}))
    if ctx.perm is None:
        raise ScenarioUnsupported(
            f"the weight-sync scenario computes every post-swap token from two bigram-cycle checkpoints A and B; "
            f"with the {ctx.model_kind} model there is no checkpoint B whose stream is known (run it with "
            "--model bigram-cycle, the default)")
    sid = sc["id"]
    plan = build(sid, sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    check_pause_api(llm)
    if params.explicit_reset:
        check_reset_api(llm)
    transfer = await _transfer_for(params, llm, ctx, timeout)
    if watch is not None:
        transfer = watch(transfer)

    spec_b = swap_partner(ctx.model_spec)
    dir_b = build_checkpoint(spec_b, ctx.model_cache)
    # The engine's own no-pause streams under A: it must hold A when we start.
    engine_a = await run_reference(llm, plan, timeout, sid)
    summary: dict[str, Any] = {
        "transfer": transfer.name,
        "checkpoint_a": {"key": ctx.model_spec.key(), "seed": ctx.model_spec.seed, "path": str(ctx.model_dir)},
        "checkpoint_b": {"key": spec_b.key(), "seed": spec_b.seed, "path": str(dir_b)},
    }
    swapped = await _swapped_run(llm, transfer, ctx, sid, plan, params, dir_b, timeout, summary)
    fresh_check: list[tuple[str, list[int], list[int]]] | None = None
    if params.fresh_engine_check:
        fresh_check = await _fresh_engine_check(ctx, dir_b, swapped.checks, timeout)

    bad = disagreements(swapped.engine_check) + [f"fresh engine: {d}" for d in disagreements(fresh_check or [])]
    if bad:
        raise ScenarioFailed(
            f"cross-check against vLLM disagrees with the computed A-then-B reference in {len(bad)} request(s); "
            "the reference (not the scheduler) is in doubt: " + "; ".join(bad)
        )
    _annotate(swapped, engine_a, ctx.perm, fresh_check, summary.get("transfer"))
    summary["cross_check"] = {"same_engine": len(swapped.engine_check),
                              "fresh_engine": None if fresh_check is None else len(fresh_check), "agree": True}
    return {"records": swapped.records, "events": swapped.events, "duration_s": round(time.monotonic() - t0, 3),
            "weight_sync": summary}


@dataclass(frozen=True)
class _Swapped:
    """The paused run with the swap to B, and the same engine's cross-check while it held B."""

    records: list[dict[str, Any]]
    events: list[dict[str, Any]]
    refs: dict[str, list[int]]  # the computed A-then-B reference of each request
    checks: list[tuple[str, tuple[RequestSpec, list[int]]]]  # (rid, (cross-check request, what B must answer))
    engine_check: list[tuple[str, list[int], list[int]]]  # (rid, computed, what this engine answered)


async def _swapped_run(llm: Any, transfer: Any, ctx: EngineContext, sid: str, plan: Plan, params: WeightSyncParams,
                       dir_b: Path, timeout: float, summary: dict[str, Any]) -> _Swapped:
    """Open the transfer, play the plan swapping to B at the pause, cross-check on B; A is restored after."""
    assert ctx.perm is not None  # checked by run()
    perm_a, perm_b = ctx.perm, load_perm(dir_b)
    try:
        summary["open"] = await transfer.open()
    except BaseException:
        await transfer.close()
        raise
    try:
        swap = PauseSpec(plan.pauses[0].mode, plan.pauses[0].clear_cache, plan.pauses[0].after_tokens,
                         action=_swap_action(llm, transfer, dir_b, params.explicit_reset))
        records, events = await run_plan(llm, Plan(plan.requests, [swap]), timeout)
        if not any(e.get("event") == "pause_action" for e in events):
            raise ScenarioFailed("the weights were never swapped (the pause did not happen)")
        refs = {r["rid"]: computed_reference(r, perm_a, perm_b) for r in records}
        # Cross-check on this engine while it still holds B.
        checks = [(r["rid"], c) for r in records if (c := cross_check_request(f"{sid}-xchk-{r['rid']}", r,
                                                                               refs[r["rid"]])) is not None]
        got = await run_unpaused(llm, [c[0] for _, c in checks], timeout, "cross-check")
        engine_check = [(rid, c[1], g) for (rid, c), g in zip(checks, got, strict=True)]
    finally:
        summary["restore"] = await _restore_a(llm, transfer, ctx, plan, timeout)
    return _Swapped(records, events, refs, checks, engine_check)


def _annotate(swapped: _Swapped, engine_a: dict[str, list[int]], perm_a: list[int],
              fresh_check: list[tuple[str, list[int], list[int]]] | None, transfer: str | None) -> None:
    """Give each record its reference, the model check and the swap facts the harness reports."""
    by_engine = {rid for rid, _, _ in swapped.engine_check}
    by_fresh = {rid for rid, _, _ in fresh_check or []}
    for rec in swapped.records:
        rid = rec["rid"]
        ref = swapped.refs[rid]
        n_a = swap_index(rec)
        a_stream = engine_a[rid]
        a_ok = a_stream == expected_continuation(perm_a, rec["prompt"][-1], len(a_stream))
        rec["reference"] = ref
        # The oracle's model check: the engine followed A's cycle without a
        # pause, and B's from the swap point on (checked above, or ERROR).
        rec["reference_matches_model"] = a_ok
        last = ref[n_a - 1] if 0 < n_a <= len(ref) else rec["prompt"][-1]
        rec["weight_sync"] = {
            "transfer": transfer,  # kept per request: the harness stores records, not the summary
            "swap_index": n_a,
            "last_pre_swap_token": last,
            "expected_first_post_swap": ref[n_a] if n_a < len(ref) else None,
            # What weights A give there: a frame still in flight at the swap, computed before it, delivers this
            # (vLLM 0.16.0's keep pause returns with one frame in flight under async scheduling).  B's cycle
            # covers every token, so the oracle can also read that stream as a shift: harness.core.oracle.
            "stale_first_post_swap": perm_a[last] if n_a < len(ref) else None,
            "observed_first_post_swap": rec["observed"][n_a] if n_a < len(rec["observed"]) else None,
            "engine_a_stream_matches": a_ok,
            "cross_check_engine": rid in by_engine,
            "cross_check_fresh_engine": rid in by_fresh if fresh_check is not None else None,
        }


def _swap_action(llm: Any, transfer: Any, checkpoint: Path, explicit_reset: bool) -> PauseAction:
    """Load ``checkpoint``; then, for the manual-reset variant, reset the prefix cache with the requests frozen."""
    reset = reset_action(llm) if explicit_reset else None

    async def act() -> dict[str, Any]:
        info = await transfer.load(checkpoint)
        return {**info, **(await reset())} if reset is not None else info

    return act


async def _restore_a(llm: Any, transfer: Any, ctx: EngineContext, plan: Plan, timeout: float) -> dict[str, Any]:
    """Load A again, shut the transfer down, and check the engine follows A's cycle."""
    try:
        info = await asyncio.wait_for(transfer.load(ctx.model_dir), timeout)
    finally:
        await transfer.close()
    probe = plan.requests[0]
    (got,) = await run_unpaused(
        llm, [RequestSpec(f"{probe.rid}-restore-check", probe.prompt, RESTORE_CHECK_TOKENS)], timeout, "restore check")
    want = expected_continuation(ctx.perm, probe.prompt[-1], RESTORE_CHECK_TOKENS)
    if got != want:
        raise ScenarioFailed(f"weights A were not restored: after reloading A the engine gave {got}, A gives {want}")
    return {**info, "verified": True}


async def _fresh_engine_check(
    ctx: EngineContext, dir_b: Path, checks: list[tuple[str, tuple[RequestSpec, list[int]]]], timeout: float,
) -> list[tuple[str, list[int], list[int]]]:
    """Upstream's validation: the same cross-check requests on a new engine started with B."""
    fresh = ctx.start_engine(dir_b)
    try:
        got = await run_unpaused(fresh, [c[0] for _, c in checks], timeout, "fresh-engine cross-check")
    finally:
        fresh.shutdown()
    return [(rid, c[1], g) for (rid, c), g in zip(checks, got, strict=True)]
