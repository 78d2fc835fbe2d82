"""Issue 37: after an in-place weight update, does a request read KV that the old weights wrote?

Runs on the ``prefix-cache`` engine profile (prefix caching on, 32-token blocks) with the context-cell model
(``repro.models.context_cell``): its next token reads the prompt's marker through attention, and the marker's KV holds a
code that depends on the weights that wrote it, so a prefix-cache hit on blocks computed with weights A, read by
weights B, shows as a specific wrong token (``expected_continuation(..., stale_version="A")``).

Every prompt starts with the same two blocks (marker ``marker`` then 63 plain tokens) and ends with a suffix of
its own.  On an engine holding A (its prefix cache emptied first):

1. W, the warm request, runs alone under A: the shared blocks are cached, computed with A.
2. ``num_requests`` requests K start (each a prefix-cache hit on W's blocks: the precondition that caching is on);
   once each has ``pause_after`` tokens the engine pauses (``clear_cache=False`` but in ``clear``) and the weights
   are reloaded in place from B (``collective_rpc("reload_weights")``, ``ReloadTransfer``); then, by variant:

   * ``keep`` (keep pause): nothing else.  K stay frozen with their KV;
   * ``reset`` (wait pause: K finish under A first): ``reset_prefix_cache()`` on the idle engine;
   * ``refused`` (keep pause): ``reset_prefix_cache()`` while K hold blocks, which vLLM refuses (returns False:
     ``BlockPool.reset_prefix_cache``, vllm/v1/core/block_pool.py:452-459 in 0.21.0, :837-844 in 0.32.0), the
     call NeMo-RL #3839 found doing nothing;
   * ``running`` (keep pause): ``reset_prefix_cache(reset_running_requests=True)``, which preempts K first
     (``Scheduler.reset_prefix_cache``, vllm/v1/core/sched/scheduler.py:1795 in 0.21.0, :2840 in 0.32.0): they are
     recomputed under B after the resume;
   * ``clear`` (keep pause with ``clear_cache=True``): the pause itself resets the cache, K included, before the
     reload (``EngineCore._reset_caches``, vllm/v1/engine/core.py:633-636 and :664-665 in 0.21.0, :898-919 in
     0.32.0).

   ``extra_requests`` new requests N sharing the prefix, and C (another marker, nothing shared: it shows that
   the reload took effect), are submitted during the pause, so they start after it.
3. Weights A are restored and the prefix cache emptied again for the engine's next cell.

Every record carries ``stale_kv``: its kind (``new``: started after the update, must follow fresh B; ``kept``: in
flight across the keep pause, may continue on the KV it holds, written by A, by design; ``before``: finished under
A), the stream that reading A's KV gives, and its prefix-cache hit (``num_cached_tokens``).  Its ``reference`` is
what fresh KV gives: fresh A for ``before``; A's tokens up to the pause, then B reading B's KV for ``kept``; fresh B
for ``new``.  The harness judges it (``harness.core.oracle.stale_kv``): STALE-KV for a new request that follows the
stale stream, OK for a kept one (a kept request recomputed by a reset follows the fresh reference: OK too; on
vLLM 0.17.0-0.21.0 with async scheduling it loses its first post-resume token, vllm#42043: LOSS(1)).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.models import context_cell as cm
from repro.scenarios._profile import precondition
from repro.scenarios.native_update import NativeTransfer, native_transfer
from repro.scenarios.runs import check_pause_api, run_plan, run_unpaused
from repro.scenarios.stale_kv_sleep import SLEEP_DOORS, sleep_enter, sleep_leave, sleep_unsupported
from repro.scenarios.vocab import (
    MAX_MODEL_LEN,
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
from repro.scenarios.weight_transfer import ReloadTransfer, reload_transfer

# variant -> the pause mode and clear_cache it plays (harness.core.scenarios: stale-kv-<variant>)
VARIANTS = {"keep": "keep", "reset": "wait", "refused": "keep", "clear": "keep", "running": "keep"}
# The sleep door's (repro.scenarios.stale_kv_sleep): sleep(level, "keep") stands for the pause, and it clears the
# prefix cache itself; "slept_reset" also calls reset_prefix_cache() after the update.
SLEEP_VARIANTS = {"slept": "keep", "slept_reset": "keep"}
CLEARS = {"clear": True, "slept": True, "slept_reset": True}  # variants whose pause resets the cache itself
BLOCK = 32  # the prefix-cache profile's block_size
SHARED = 2 * BLOCK  # tokens every prompt shares: two whole blocks, the marker at position 0
WARM_TOKENS = 4
SHARED_SUFFIX = "-shared"
# The weight-update doors a variant is played through (issue 37 item 3): the in-place reload, and vLLM 0.21.0+'s
# native start/update/finish_weight_update (repro.scenarios.native_update; scenarios native-update-<variant>).
DOORS = {"reload": "in-place reload to B", "native": "native weight update (start/update/finish_weight_update) to B",
         "sleep1": "sleep(level=1), wake, in-place reload to B", "sleep2": "sleep(level=2), wake, in-place reload to B",
         "lora": "LoRA adapter swap (v1 out, v2 in)"}
NATIVE_VARIANTS = ("keep", "reset", "refused", "running")
# The sleep door's scenarios (harness.core.scenarios: sleep-update-l<level>[-reset]) -> (variant, door).
SLEEP_SCENARIOS = {f"sleep_update_l{level}{suffix}": (variant, f"sleep{level}")
                   for level in (1, 2) for suffix, variant in (("", "slept"), ("_reset", "slept_reset"))}


@dataclass(frozen=True)
class StaleKvParams:
    variant: str = "keep"
    mode: str = "keep"
    clear_cache: bool = False  # only the clear variant's pause resets the cache itself
    num_requests: int = 8  # K: running under A when the pause comes
    extra_requests: int = 4  # N: new requests sharing the prefix, submitted during the pause
    prompt_len: int = 70  # SHARED plus a suffix of each request's own
    max_tokens: int = 48
    pause_after: int = 8
    marker: int = 6  # the shared prefix's marker
    control_marker: int = 1  # C's marker (nothing shared)

    def __post_init__(self) -> None:
        every = {**VARIANTS, **SLEEP_VARIANTS}
        if self.variant not in every:
            raise ValueError(f"stale_kv variant {self.variant!r}; valid: {', '.join(every)}")
        want = (every[self.variant], CLEARS.get(self.variant, False))
        if (self.mode, self.clear_cache) != want:
            raise ValueError(f"stale_kv_{self.variant} pauses in {want[0]} mode with clear_cache={want[1]} "
                             f"(got mode={self.mode!r}, clear_cache={self.clear_cache})")
        if self.prompt_len <= SHARED or self.prompt_len + self.max_tokens + REFERENCE_MARGIN > MAX_MODEL_LEN:
            raise ValueError(f"prompt_len={self.prompt_len}, max_tokens={self.max_tokens}: the prompt must be longer "
                             f"than the {SHARED} shared tokens and prompt + max_tokens + {REFERENCE_MARGIN} fit "
                             f"max_model_len {MAX_MODEL_LEN}")
        if not 0 < self.pause_after < self.max_tokens or self.num_requests < 1 or self.extra_requests < 1:
            raise ValueError(f"pause_after={self.pause_after} must be in 1..max_tokens-1 and num_requests="
                             f"{self.num_requests}, extra_requests={self.extra_requests} at least 1")
        if self.marker == self.control_marker:
            raise ValueError("the control request needs a marker of its own")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StaleKvParams:
        return params_from_dict(cls, data, "stale_kv parameters")


def prompts(spec: cm.ContextCellSpec, p: StaleKvParams, seed: int) -> dict[str, list[int]]:
    """W, K0.., N0.. (the shared prefix and a suffix each) and C (another marker, nothing shared)."""
    def body(n: int, salt: int) -> list[int]:
        # Row 7 * salt + j: a request's first token after the shared prefix differs from every other's (7 is prime
        # to the row count 96 of the default spec; distinctness is checked below for any spec).
        return [cm.plain(spec, (7 * salt + j + seed) % spec.rows, (salt + 3 * j) % spec.contexts) for j in range(n)]

    shared = [cm.marker(spec, p.marker), *body(SHARED - 1, 0)]
    names = ["w", *(f"k{i:02d}" for i in range(p.num_requests)), *(f"n{i:02d}" for i in range(p.extra_requests))]
    out = {name: shared + body(p.prompt_len - SHARED, i + 1) for i, name in enumerate(names)}
    out["c"] = [cm.marker(spec, p.control_marker), *body(p.prompt_len - 1, 5)]
    if len({tuple(v) for v in out.values()}) != len(out):
        raise ValueError(f"stale_kv: {len(out)} requests need distinct prompts; this spec's {spec.rows} rows give "
                         "fewer (lower num_requests or extra_requests)")
    return out


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """K at start, N and C during the pause; W and the update itself are played by :func:`run`."""
    p = StaleKvParams.from_dict(params)
    # The context-cell model's default spec, whatever ``vocab_size`` the engine has: with another model the runner
    # is UNSUPPORTED before any of these is sent (run).
    ps = prompts(cm.ContextCellSpec(), p, seed)
    reqs = [RequestSpec(f"{sid}-{k}", ps[k], p.max_tokens) for k in ps if k.startswith("k")]
    # "-shared": the requests started after the update on the shared prefix, where the known-bug table expects a
    # stale read (harness.core.scenarios: fault_records).
    reqs += [RequestSpec(f"{sid}-{k}{SHARED_SUFFIX}", ps[k], p.max_tokens, ("during", 0)) for k in ps if k[0] == "n"]
    reqs.append(RequestSpec(f"{sid}-c", ps["c"], p.max_tokens, ("during", 0)))
    return Plan(reqs, [PauseSpec(p.mode, p.clear_cache, p.pause_after)])


# --------------------------------------------------------------------------- what each request must show


def kind_of(record: dict[str, Any], mode: str) -> str:
    """``new`` (started after the update), ``kept`` (frozen across a keep pause) or ``before`` (ran under A)."""
    if record.get("submit") not in ("start", None):
        return "new"
    return "kept" if mode == "keep" and record.get("pauses") else "before"


def expectations(spec: cm.ContextCellSpec, record: dict[str, Any], kind: str) -> tuple[list[int], list[int]]:
    """(what fresh KV gives, what reading A's KV gives: [] where nothing was cached under A) for ``record``."""
    prompt, n = list(record["prompt"]), int(record["max_tokens"]) + REFERENCE_MARGIN
    if kind == "before":
        return cm.expected_continuation(spec, "A", prompt, n), []
    if kind == "new":
        return (cm.expected_continuation(spec, "B", prompt, n),
                cm.expected_continuation(spec, "B", prompt, n, SHARED, "A"))
    n_a = int(record["pauses"][0]["client_tokens"])
    head = cm.expected_continuation(spec, "A", prompt, n_a)
    history = prompt + head
    # After the update the kept request's own KV (the marker's, written by A) is what it reads without a reset;
    # recomputed (a reset that preempts it) it reads B's.
    fresh = cm.expected_continuation(spec, "B", history, n - n_a)
    stale = cm.expected_continuation(spec, "B", history, n - n_a, len(history) - 1, "A")
    return head + fresh, head + stale


def annotate(records: list[dict[str, Any]], spec: cm.ContextCellSpec, shared: list[int], mode: str,
             model_ok: bool, expect: Any = None) -> None:
    """Give each record its reference, its ``stale_kv`` facts and the model check; ``shared``: the prefix W cached
    under A (a request without it, C, has no stale stream: nothing of A's could be reused)."""
    for rec in records:
        kind = kind_of(rec, mode)
        fresh, stale = (expect or expectations)(spec, rec, kind)
        hit = rec["prompt"][:len(shared)] == shared
        rec["reference"] = fresh
        rec["reference_matches_model"] = model_ok
        rec["stale_kv"] = {"kind": kind, "stale": stale if hit else [], "shared_prefix": hit,
                           "num_cached_tokens": rec.get("num_cached_tokens")}


def summary(records: list[dict[str, Any]], variant: str, update: dict[str, Any], door: str = "reload",
            ) -> dict[str, Any]:
    """The precondition: prefix caching served K from W's blocks (else nothing could go stale), and the facts."""
    kinds = {k: [r for r in records if r["stale_kv"]["kind"] == k] for k in ("before", "kept", "new")}
    started = kinds["before"] + kinds["kept"]
    hits = [r.get("num_cached_tokens") for r in started]
    new_hits = [r.get("num_cached_tokens") for r in kinds["new"]]
    evidence = {"variant": variant, "kinds": {k: len(v) for k, v in kinds.items()},
                "cached_tokens_before_update": hits, "cached_tokens_after_update": new_hits, **update}
    refused = variant != "refused" or update.get("reset_returned") is False
    if not all(isinstance(h, int) and h >= BLOCK for h in hits):
        why = (f"precondition not met: the requests started under A reported cached tokens {hits}, not a hit on the "
               "warm request's blocks each, so no KV written by A could be reused")
        return precondition(False, "", why, evidence)
    if not refused:
        why = (f"precondition not met: reset_prefix_cache() with {len(kinds['kept'])} kept requests holding blocks "
               f"returned {update.get('reset_returned')!r}, not False: the refused door was not reached")
        return precondition(False, "", why, evidence)
    what = (f"{len(kinds['new'])} requests started after the {DOORS[door]} (cached tokens {new_hits}), "
            f"{len(kinds['kept'])} kept across the pause, {len(kinds['before'])} finished under A")
    if "reset_returned" in update:
        what += f"; reset_prefix_cache() returned {update['reset_returned']}"
    return precondition(True, what, "", evidence)


# --------------------------------------------------------------------------- the scenario


def runner(variant: str, door: str = "reload") -> Any:
    """The RUNNERS entry of ``stale_kv_<variant>`` (``native_update_<variant>`` with ``door="native"``)."""
    async def run_variant(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
        return await run(llm, sc, ctx, timeout, variant, door)

    return run_variant


def builder(variant: str) -> Any:
    """The SCENARIOS entry of ``stale_kv_<variant>``: :func:`build` with the variant's name."""
    def build_variant(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
        return build(sid, {"variant": variant, **params}, vocab_size, seed)

    return build_variant


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float, variant: str,
              door: str = "reload") -> dict[str, Any]:
    """Play ``sc`` (see the module's docstring); the scenario event's data."""
    t0 = time.monotonic()
    params = {"variant": variant, **sc.get("params", {})}
    p = StaleKvParams.from_dict(params)
    spec = context_spec(ctx)
    plan = build(sc["id"], params, spec.vocab_size, int(sc.get("seed", 0)))
    check_pause_api(llm)
    if door in SLEEP_DOORS:
        sleep_unsupported(llm)
    transfer = await (native_transfer(llm) if door == "native" else reload_transfer(llm))
    await empty_cache(llm, "before the scenario")
    warm = prompts(spec, p, int(sc.get("seed", 0)))["w"]
    (first,) = await run_unpaused(llm, [RequestSpec(f"{sc['id']}-w", warm, WARM_TOKENS)], timeout, "warm request")
    model_ok = first == cm.expected_continuation(spec, "A", warm, WARM_TOKENS)
    dir_b = cm.build_checkpoint(spec, "B", ctx.model_cache)
    update: dict[str, Any] = {}
    try:
        records, events = await run_plan(llm, Plan(plan.requests, [_pause(llm, p, door, _update(
            llm, transfer, dir_b, variant, update))]), timeout)
    finally:
        update["restored_a"] = await transfer.load(ctx.model_dir)
        await empty_cache(llm, "after restoring weights A")
    if transfer.name not in update:
        raise ScenarioFailed("the weights were never updated (the pause did not happen)")
    annotate(records, spec, warm[:SHARED], p.mode, model_ok)
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3),
            "precondition": summary(records, variant, update, door)}


def context_spec(ctx: EngineContext) -> cm.ContextCellSpec:
    """The engine's context-cell spec; ScenarioUnsupported with another model or spec."""
    if ctx.model_kind != cm.KIND or not isinstance(ctx.model_spec, cm.ContextCellSpec):
        raise ScenarioUnsupported(f"stale_kv needs a model whose tokens read the context (run it with --model "
                                  f"{cm.KIND}); the {ctx.model_kind} model cannot show KV written by other weights")
    if ctx.model_spec != cm.ContextCellSpec():
        raise ScenarioUnsupported(f"stale_kv's prompts are built for the default context-cell spec; this engine "
                                  f"loaded {ctx.model_spec}")
    return ctx.model_spec


def _pause(llm: Any, p: StaleKvParams, door: str, update: PauseAction) -> PauseSpec:
    """The pause with ``update`` as its action; the sleep doors sleep instead and update while waking."""
    if door not in SLEEP_DOORS:
        return PauseSpec(p.mode, p.clear_cache, p.pause_after, action=update)
    level = SLEEP_DOORS[door]
    return PauseSpec(p.mode, p.clear_cache, p.pause_after, enter=sleep_enter(llm, level, p.mode),
                     leave=sleep_leave(llm, update))


def _update(llm: Any, transfer: ReloadTransfer | NativeTransfer, dir_b: Path, variant: str,
            facts: dict[str, Any]) -> PauseAction:
    """The pause action: update to B through the door (reload in place, or the native door), then the variant's
    reset (none, on the idle engine, refused, or preempting the kept requests)."""
    async def act() -> dict[str, Any]:
        facts[transfer.name] = await transfer.load(dir_b)
        if variant in ("reset", "refused", "slept_reset"):
            facts["reset_returned"] = await llm.reset_prefix_cache()
        elif variant == "running":
            facts["reset_returned"] = await llm.reset_prefix_cache(reset_running_requests=True)
        return dict(facts)

    return act


async def empty_cache(llm: Any, when: str) -> None:
    """``reset_prefix_cache()`` on the idle engine: an earlier cell's blocks (or this one's, computed with B) must
    not reach the next requests under A; vLLM refusing it on an idle engine fails the scenario."""
    if await llm.reset_prefix_cache() is False:
        raise ScenarioFailed(f"reset_prefix_cache() on the idle engine {when} returned False")
