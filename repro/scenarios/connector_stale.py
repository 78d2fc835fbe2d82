"""vllm#57970: ``pause_generation(clear_cache=True)`` leaves a KV connector's store in place, so a request admitted
after a weight swap starts from KV computed with the weights before it.

Runs on the ``kv-example`` engine profile: vLLM's in-tree ExampleConnector behind a logging subclass
(``repro.probes.kv_example``), its store in the engine's work dir, prefix caching on, 32-token blocks.  Prompts
are 66 tokens, so the connector stores (and later reports as an external hit) 64 of them.

1. P alone under weights A: it misses and the connector writes P's KV (computed with A).
2. ``num_requests`` long requests R run; once each has ``pause_after`` tokens: ``pause_generation(mode,
   clear_cache=True)``, reload B in place (``ReloadTransfer``), resume; P is sent again right after.  In keep mode
   the reset preempts every R, which re-enter from the waiting queue; in wait mode they finished under A.
3. Control (the check can fail): wipe the store (the client's workaround), ``reset_prefix_cache()``, every prompt
   again.  Each must miss (0 external and 0 local tokens), or the scenario fails (ERROR); the connector then stores
   the KV that B computes for it.  Weights A are restored afterwards and the store wiped.

Judged, per request admitted after the swap, on **the KV it started from**: a record whose ``observed`` is the
fingerprint (SHA-256 per layer file, ``repro.probes.kv_example.fingerprint``) of the store entry it loaded, as
the store stood at the swap (KV computed with A), and whose ``reference`` is the fingerprint of the entry B
computes for the same tokens (the control's).  No load from before the swap: observed = reference (OK).  A load:
``DIVERGED(at 0)``.  The token streams are judged as well (A's cycle before the swap, B's after), but the
bigram-cycle model cannot show stale KV in tokens: its ``o_proj`` is zero, so no attention output reaches the
logits.  The precondition states the hits, the ``reset_cache`` calls the pause made and whether the control
missed; a run where B's KV equals A's (nothing to tell apart) or nothing was admitted after the swap is
UNSUPPORTED.  ``reset_prefix_cache(reset_connector=True)`` (where it takes the argument) is called once before
the control and its answer, the ``reset_cache`` calls it made and P's next hit are reported as facts.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.models.deterministic import build_checkpoint, expected_continuation, load_perm, swap_partner
from repro.probes import kv_example as kx
from repro.scenarios._profile import precondition
from repro.scenarios.connector_stale_judge import kv_records, stale_summary, token_records
from repro.scenarios.runs import check_pause_api, run_plan, run_unpaused
from repro.scenarios.vocab import (
    EngineContext,
    PauseSpec,
    Plan,
    RequestSpec,
    ScenarioFailed,
    ScenarioUnsupported,
    make_prompts,
    params_from_dict,
)
from repro.scenarios.weight_transfer import ReloadTransfer, reload_transfer

MODES = ("keep", "wait")
VIAS = ("pause", "sleep")
BLOCK = 32  # the kv-example profile's block_size


@dataclass(frozen=True)
class ConnectorStaleParams:
    mode: str = "keep"
    clear_cache: bool = True  # the #57970 contract: only true is meaningful
    num_requests: int = 4  # R: running at the pause
    prompt_len: int = 66  # 2 blocks + 2: ExampleConnector stores (len - 2) // 32 * 32 = 64 tokens
    max_tokens: int = 48
    pause_after: int = 8
    probe_tokens: int = 4  # tokens of P and of each control request
    # How the engine stops for the swap: pause_generation(mode, clear_cache=True) / resume_generation(), or
    # vLLM 0.34.0's sleep(level=1, mode, reset_connector) / wake_up (the sleep-connector scenarios).
    via: str = "pause"
    reset_connector: bool = True  # via="sleep" only: sleep's reset_connector= (AsyncLLM.sleep, 0.34.0)

    def __post_init__(self) -> None:
        if self.mode not in MODES or not self.clear_cache:
            raise ValueError(f"connector_stale mode={self.mode!r} clear_cache={self.clear_cache}: it pauses in "
                             f"{'/'.join(MODES)} mode with clear_cache=True (the contract vllm#57970 is about)")
        if self.via not in VIAS:
            raise ValueError(f"connector_stale via={self.via!r}; valid: {', '.join(VIAS)}")
        if self.prompt_len % BLOCK != 2 or self.prompt_len < BLOCK + 2:
            raise ValueError(f"prompt_len={self.prompt_len}: must be k*{BLOCK} + 2 (k >= 1), so the connector "
                             "stores whole blocks and a resumed request's load names the same entry")
        # ExampleConnector keys a resumed request's load on its first (tokens - 1) // 32 * 32 tokens: past the
        # prompt's blocks it names an entry that was never written and the worker's load_file raises.
        # A keep pause lands a few tokens past its trigger (8 -> 9-11 measured on 0.32.0): half a block of slack.
        if not 0 < self.pause_after <= BLOCK // 2 or self.pause_after >= self.max_tokens:
            raise ValueError(f"pause_after={self.pause_after}: must be 1..{BLOCK // 2} and below max_tokens")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConnectorStaleParams:
        return params_from_dict(cls, data, "connector_stale parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """R at start and P again right after resume; P's first run and the control are played by :func:`run`."""
    p = ConnectorStaleParams.from_dict(params)
    prompts = make_prompts(p.num_requests + 1, p.prompt_len, vocab_size, seed)
    reqs = [RequestSpec(f"{sid}-r{i:02d}", prompts[i + 1], p.max_tokens) for i in range(p.num_requests)]
    reqs.append(RequestSpec(f"{sid}-p-again", prompts[0], p.probe_tokens, ("after", 0)))
    return Plan(reqs, [PauseSpec(p.mode, True, p.pause_after)])


def check_connector(llm: Any) -> None:
    """ScenarioUnsupported unless the engine runs the probe connector and this release's can load on this device."""
    cfg = getattr(getattr(llm, "vllm_config", None), "kv_transfer_config", None)
    if getattr(cfg, "kv_connector", None) != kx.CONNECTOR:
        raise ScenarioUnsupported(f"the engine's kv_transfer_config is {cfg!r}, not {kx.CONNECTOR} (the kv-example "
                                  "profile): nothing to probe")
    import torch

    src = inspect.getsource(kx.ExampleConnector.start_load_kv)
    if ".cuda()" in src and not torch.cuda.is_available():
        raise ScenarioUnsupported("this vLLM's ExampleConnector loads an external hit with .cuda() (start_load_kv, "
                                  "vLLM <= 0.21.0), which vLLM's CPU platform cannot run")



async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Play ``sc`` (see the module's docstring); the scenario event's data."""
    t0 = time.monotonic()
    p = ConnectorStaleParams.from_dict(sc.get("params", {}))
    if ctx.perm is None:
        raise ScenarioUnsupported(f"connector_stale swaps between two bigram-cycle checkpoints; the {ctx.model_kind} "
                                  "model has no checkpoint B (run it with --model bigram-cycle, the default)")
    check_pause_api(llm)
    check_connector(llm)
    if p.via == "sleep":
        check_sleep_connector(llm)
    transfer = await reload_transfer(llm)
    sid = sc["id"]
    plan = build(sid, sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    store, log = Path.cwd() / kx.STORE, Path.cwd() / kx.LOG
    kx.wipe(store)  # an earlier cell on this engine
    log.unlink(missing_ok=True)
    probe = plan.requests[-1]
    (first,) = await run_unpaused(llm, [RequestSpec(f"{sid}-p-first", probe.prompt, p.probe_tokens)], timeout,
                                  "the probe prompt under A")
    dir_b = build_checkpoint(swap_partner(ctx.model_spec), ctx.model_cache)
    perm_b = load_perm(dir_b)
    try:
        played = await _swapped(llm, transfer, plan, dir_b, store, log, timeout, p)
        explicit = await _explicit_reset(llm, probe, log, timeout)
        control = await _control(llm, plan, store, log, timeout, sid, p.probe_tokens)
    finally:
        restored = await transfer.load(ctx.model_dir)
        kx.wipe(store)
    models_ok = first == expected_continuation(ctx.perm, probe.prompt[-1], len(first)) and all(
        got == expected_continuation(perm_b, prompt[-1], len(got)) for prompt, got in control["streams"])
    records = token_records(played.records, p.mode, ctx.perm, perm_b, models_ok)
    kv = kv_records(records, played.post_swap, played.at_swap, control["fingerprints"])
    cond = stale_summary(kv, played.pause_resets, explicit)
    facts = {"event": "connector_stale", "pause_reset_cache_calls": played.pause_resets,
             "store_entries_at_swap": len(played.at_swap), "changed_after_swap": played.changed,
             "explicit_reset": explicit, "control_missed": True, "restored_a": restored}
    return {"records": records + kv, "events": [*played.events, facts],
            "duration_s": round(time.monotonic() - t0, 3),
            "precondition": precondition(cond.met, cond.what, cond.why_not, {**facts, **cond.evidence})}


@dataclass(frozen=True)
class _Played:
    """The plan played with the swap to B in its pause."""

    records: list[dict[str, Any]]
    events: list[dict[str, Any]]
    post_swap: list[dict[str, Any]]  # the connector's log lines after the swap
    at_swap: dict[str, list[int]]  # the store's fingerprints at the swap (KV computed with A)
    pause_resets: int  # reset_cache calls before the swap: the pause's
    changed: list[str]  # entries rewritten after the swap (ExampleConnector never rewrites one: [])


async def _swapped(llm: Any, transfer: ReloadTransfer, plan: Plan, dir_b: Path, store: Path, log: Path,
                   timeout: float, p: ConnectorStaleParams) -> _Played:
    """The plan, swapping to B in the pause: its records, the log lines after the swap, the store at the swap."""
    marks: dict[str, Any] = {}

    async def swap() -> dict[str, Any]:
        info = await transfer.load(dir_b)
        lines = kx.read_log(log)
        marks.update(n=len(lines), at_swap=kx.snapshot(store),
                     resets=sum(e.get("op") == "reset_cache" for e in lines))
        return info

    (pause,) = plan.pauses
    doors = sleep_door(llm, pause.mode, p.reset_connector) if p.via == "sleep" else {}
    records, events = await run_plan(llm, Plan(plan.requests, [PauseSpec(pause.mode, True, pause.after_tokens,
                                                                         action=swap, **doors)]), timeout)
    if "n" not in marks:
        raise ScenarioFailed("the weights were never swapped (the pause did not happen)")
    after = kx.snapshot(store)
    changed = sorted(Path(f).name for f, fp in marks["at_swap"].items() if after.get(f) != fp)
    return _Played(records, events, kx.read_log(log)[marks["n"]:], marks["at_swap"], marks["resets"], changed)


def check_sleep_connector(llm: Any) -> None:
    """ScenarioUnsupported unless this AsyncLLM sleeps in a mode with ``reset_connector=`` (vLLM 0.34.0)."""
    sleep = getattr(llm, "sleep", None)
    names = inspect.signature(sleep).parameters if sleep is not None else {}
    if not {"mode", "reset_connector"} <= set(names):
        raise ScenarioUnsupported("AsyncLLM.sleep() takes no reset_connector= (it arrived in vLLM 0.34.0, "
                                  "vllm/v1/engine/async_llm.py:1212-1214)")


def sleep_door(llm: Any, mode: str, reset_connector: bool) -> dict[str, Any]:
    """The pause as a level-1 sleep: ``sleep(level=1, mode, reset_connector)``; after the swap, the weights are
    woken before B is loaded into them and the KV cache last (``wake_up(tags)``; 0.34.0 resumes only when fully
    awake, vllm/v1/engine/core.py:1153-1160), as verl 0.9.1 orders its update."""

    async def enter() -> dict[str, Any]:
        await llm.sleep(level=1, mode=mode, reset_connector=reset_connector)
        if not await llm.is_sleeping():
            raise ScenarioFailed("after sleep(level=1) vLLM reports is_sleeping()=False: no sleep to test")
        await llm.wake_up(tags=["weights"])
        return {"call": "sleep", "level": 1, "mode": mode, "reset_connector": reset_connector}

    async def leave() -> dict[str, Any]:
        await llm.wake_up(tags=["kv_cache"])
        if await llm.is_sleeping():
            raise ScenarioFailed("after wake_up(kv_cache) vLLM still reports is_sleeping()=True")
        return {"call": "wake_up", "tags": ["kv_cache"]}

    return {"enter": enter, "leave": leave}


async def _explicit_reset(llm: Any, probe: RequestSpec, log: Path, timeout: float) -> dict[str, Any]:
    """``reset_prefix_cache(reset_connector=True)``: its answer, the reset_cache calls it made, P's next hit."""
    if "reset_connector" not in inspect.signature(llm.reset_prefix_cache).parameters:
        return {"called": False, "why": "reset_prefix_cache takes no reset_connector="}
    n = len(kx.read_log(log))
    ok = await llm.reset_prefix_cache(reset_connector=True)
    rid = f"{probe.rid}-after-explicit-reset"
    await run_unpaused(llm, [RequestSpec(rid, probe.prompt, 1)], timeout, "the probe after an explicit reset")
    lines = kx.read_log(log)[n:]
    hit = kx.entries_of(lines, rid)
    return {"called": True, "returned": ok, "reset_cache_calls": sum(e.get("op") == "reset_cache" for e in lines),
            "probe_ext": hit[-1]["ext"] if hit else None, "probe_local": hit[-1]["local"] if hit else None}


async def _control(llm: Any, plan: Plan, store: Path, log: Path, timeout: float, sid: str,
                   tokens: int) -> dict[str, Any]:
    """Wipe the store, reset the prefix cache, every prompt again: each must miss; the KV B computes for it."""
    kx.wipe(store)
    if await llm.reset_prefix_cache() is False:
        raise ScenarioFailed("the control's reset_prefix_cache() returned False: its requests could hit locally")
    n = len(kx.read_log(log))
    reqs = [RequestSpec(f"{sid}-ctl-{i:02d}", r.prompt, tokens) for i, r in enumerate(plan.requests)]
    streams = await run_unpaused(llm, reqs, timeout, "control")
    lines = kx.read_log(log)[n:]
    fingerprints: dict[str, list[int]] = {}
    for r in reqs:
        hits = kx.entries_of(lines, r.rid)
        if not hits or any(e["ext"] or e["local"] for e in hits):
            raise ScenarioFailed(f"control request {r.rid} after wiping the store did not miss ({hits}): the probe "
                                 "cannot tell a stale hit from a fresh one")
        fingerprints[hits[-1]["folder"]] = kx.fingerprint(Path(hits[-1]["folder"]))
    return {"fingerprints": fingerprints, "streams": [(r.prompt, s) for r, s in zip(reqs, streams, strict=True)]}
