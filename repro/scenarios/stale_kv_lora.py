"""The LoRA door of the stale-kv scenarios (issue 37 item 3; TRL #7017): a LoRA update under the same adapter name.

vLLM keys a prefix-cache block of a LoRA request by the adapter: by its **name** alone in 0.21.0 and 0.22.0
(``_gen_lora_extra_hash_keys`` returns ``[lora_request.lora_name]``, vllm/v1/core/kv_cache_utils.py:460-472 in
0.21.0, :462-474 in 0.22.0), by ``("lora", name, path)`` in 0.32.0 (:578-595: "so that re-pointing a LoRA name at
a different adapter does not reuse KV computed with the previous one").  So after an RL step that removes the
adapter and loads the new one under the same name, a request sharing a prefix cached under the old adapter may
read that KV.

The context-cell model with two adapters on ``v_proj`` (``lora_adapter``): ``v1`` is zero (the model is weights A),
``v2`` adds what turns A's ``v_proj`` into B's (a marker's KV code shifts by one), the head stays A's.  So under
``v2`` a request reads code ``m + 1`` written by ``v2`` (fresh) or code ``m`` written by ``v1`` (stale), which
``repro.models.context_cell`` gives as A's head reading B's or A's KV: ``expected_continuation(spec, "A", prompt, n,
SHARED, "B")`` and ``expected_continuation(spec, "A", prompt, n)``.

Played on the ``prefix-cache-lora`` engine profile: W and K run under ``LoRARequest(NAME, 1, v1)``; a wait pause
(K finish under v1); ``remove_lora(1)``, ``add_lora(LoRARequest(name, 2, v2))`` with ``name`` the same (``lora-same-
name``, and ``lora-same-name-reset`` with ``reset_prefix_cache()`` after it) or a new one (``lora-new-name``,
TRL's fix); the new requests N (shared prefix) and C (another marker) run under it.  ``lora-same-path``: the
same name with v2 written over v1's files in one folder and loaded from that path (0.31.0+'s key cannot tell).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import repro.scenarios.stale_kv as sk
from repro.models import context_cell as cm
from repro.models.deterministic import write_safetensors
from repro.scenarios.runs import check_pause_api, run_plan, run_unpaused
from repro.scenarios.vocab import (
    REFERENCE_MARGIN,
    EngineContext,
    PauseSpec,
    Plan,
    RequestSpec,
    ScenarioFailed,
    ScenarioUnsupported,
)

NAME = "policy"
RANK = 8  # the adapter's rank: the contexts of the default spec (one column per marker)
# scenario (repro name) -> (the new adapter's name, whether reset_prefix_cache() follows the swap)
VARIANTS = {"lora_same_name": (NAME, False), "lora_same_name_reset": (NAME, True),
            "lora_new_name": (NAME + "-v2", False), "lora_same_path": (NAME, False)}
# Variants whose v2 is written over v1's files in one folder, loaded from the same path (a trainer that saves each
# version to one directory): 0.31.0+'s key, ("lora", name, path), is the same for both.
SAME_PATH = ("lora_same_path",)


def lora_adapter(spec: cm.ContextCellSpec, version: str, cache_dir: Path) -> Path:
    """Build (or reuse) adapter ``version`` (``v1``: zero; ``v2``: A's v_proj to B's) as a PEFT folder."""
    import numpy as np

    if spec.contexts > RANK:
        raise ValueError(f"contexts={spec.contexts}: the adapter has rank {RANK}, one column per marker")
    target = cache_dir / f"{cm.KIND}-{spec.key()}-lora-{version}"
    if (target / "adapter_config.json").is_file():
        return target
    lora_a = np.zeros((RANK, spec.hidden_size), dtype=np.float32)
    lora_b = np.zeros((spec.hidden_size, RANK), dtype=np.float32)
    for m in range(spec.contexts):
        lora_a[m, cm.FIRST_ROW + spec.rows + m] = 1.0  # column m reads marker m's id
        if version == "v2":
            lora_b[cm.value_code(spec, "B", m), m] += 1.0
            lora_b[cm.value_code(spec, "A", m), m] -= 1.0
    tmp = target.with_name(target.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    key = "base_model.model.model.layers.0.self_attn.v_proj"
    write_safetensors(tmp / "adapter_model.safetensors", {f"{key}.lora_A.weight": lora_a,
                                                          f"{key}.lora_B.weight": lora_b})
    (tmp / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": RANK, "lora_dropout": 0.0,
        "target_modules": ["v_proj"], "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
        "base_model_name_or_path": "context-cell"}))
    tmp.rename(target)
    return target


def expectations(spec: cm.ContextCellSpec, record: dict[str, Any], kind: str) -> tuple[list[int], list[int]]:
    """(fresh, stale) for ``record``: ``before`` ran under v1 (A); ``new`` under v2 (A's head reading v2's code)."""
    prompt, n = list(record["prompt"]), int(record["max_tokens"]) + REFERENCE_MARGIN
    if kind == "before":
        return cm.expected_continuation(spec, "A", prompt, n), []
    return cm.expected_continuation(spec, "A", prompt, n, len(prompt) - 1, "B"), cm.expected_continuation(
        spec, "A", prompt, n)


def check(llm: Any) -> None:
    """ScenarioUnsupported when the engine has no LoRA (its profile asks for enable_lora; vLLM may refuse)."""
    for name in ("add_lora", "remove_lora"):
        if not hasattr(llm, name):
            raise ScenarioUnsupported(f"AsyncLLM has no {name}()")
    cfg = getattr(getattr(llm, "vllm_config", None), "lora_config", None)
    if cfg is None:
        raise ScenarioUnsupported("the engine runs without a LoRA config (enable_lora): no adapter can be loaded")


async def swap(llm: Any, name: str, path: Path, reset: bool, facts: dict[str, Any]) -> dict[str, Any]:
    """Remove adapter 1, load ``path`` as adapter 2 named ``name``, and reset when asked: the update."""
    from vllm.lora.request import LoRARequest

    t0 = time.monotonic()
    facts["removed"] = await llm.remove_lora(1)
    facts["added"] = await llm.add_lora(LoRARequest(name, 2, str(path)))
    if not facts["added"]:
        raise ScenarioFailed(f"add_lora({name!r}, 2, {path}) returned {facts['added']!r}")
    if reset:
        facts["reset_returned"] = await llm.reset_prefix_cache()
    facts.update(lora={"name": name, "id": 2, "path": str(path)}, seconds=round(time.monotonic() - t0, 3))
    return dict(facts)


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """stale-kv-reset's plan (wait pause, K, then N and C during it); the adapters are attached by :func:`run`."""
    return sk.build(sid, {**params, "variant": "reset"}, vocab_size, seed)


def runner(variant: str) -> Any:
    """The RUNNERS entry of ``variant`` (a key of :data:`VARIANTS`)."""
    async def run_variant(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
        return await run(llm, sc, ctx, timeout, variant)

    return run_variant


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float, variant: str) -> dict[str, Any]:
    """Play ``sc`` (see the module's docstring); the scenario event's data."""
    t0 = time.monotonic()
    name, reset = VARIANTS[variant]
    params = {**sc.get("params", {}), "variant": "reset"}
    p = sk.StaleKvParams.from_dict(params)
    spec = sk.context_spec(ctx)
    check(llm)
    check_pause_api(llm)
    v1, v2 = (lora_adapter(spec, v, ctx.model_cache) for v in ("v1", "v2"))
    if variant in SAME_PATH:
        slot = Path(tempfile.mkdtemp(prefix="lora-slot-", dir=ctx.model_cache))
        shutil.copytree(v1, slot, dirs_exist_ok=True)
        v1 = v2 = slot
    old, new = (NAME, 1, str(v1)), (name, 2, str(v2))
    plan = build(sc["id"], params, spec.vocab_size, int(sc.get("seed", 0)))
    reqs = [replace(r, lora=old if r.submit == "start" else new) for r in plan.requests]
    await sk.empty_cache(llm, "before the scenario")
    warm = sk.prompts(spec, p, int(sc.get("seed", 0)))["w"]
    (first,) = await run_unpaused(llm, [RequestSpec(f"{sc['id']}-w", warm, sk.WARM_TOKENS, lora=old)], timeout,
                                  "warm request")
    update: dict[str, Any] = {}

    async def act() -> dict[str, Any]:
        if variant in SAME_PATH:  # the new version's files over the old ones, in the folder v1 was loaded from
            shutil.copytree(lora_adapter(spec, "v2", ctx.model_cache), v2, dirs_exist_ok=True)
        update["lora_swap"] = await swap(llm, name, v2, reset, {})
        if reset:
            update["reset_returned"] = update["lora_swap"]["reset_returned"]
        return dict(update)

    try:
        records, events = await run_plan(llm, Plan(reqs, [PauseSpec(p.mode, p.clear_cache, p.pause_after,
                                                                    action=act)]), timeout)
    finally:
        with contextlib.suppress(Exception):
            await llm.remove_lora(2)
        if variant in SAME_PATH:
            shutil.rmtree(v2, ignore_errors=True)
        await sk.empty_cache(llm, "after removing the adapters")
    if "lora_swap" not in update:
        raise ScenarioFailed("the adapter was never swapped (the pause did not happen)")
    sk.annotate(records, spec, warm[:sk.SHARED], p.mode,
                first == cm.expected_continuation(spec, "A", warm, sk.WARM_TOKENS), expectations)
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3),
            "precondition": sk.summary(records, "reset", update, "lora")}
