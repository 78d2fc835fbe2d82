"""Worker-side evidence of vLLM 0.34.0's KV loan to a weight update (``repro.scenarios.kv_loan``).

vLLM 0.34.0 sizes an *extensible* KV cache on CUDA (``CacheConfig.enable_extensible_kv_cache``,
vllm/config/cache.py:395-405) that keeps only the transients warm-up measured free.  A weight update therefore
borrows the KV cache's memory when it is short (``kv_cache_lent_for_weight_update``,
vllm/v1/worker/extensible_kv_cache.py:717-801): only when the cache holds nothing to keep, i.e. after a
clear_cache pause (``EngineCore._set_kv_cache_reclaimable``, vllm/v1/engine/core.py:1075-1084, sets the workers'
``_kv_cache_reclaimable``; ``resume_scheduler`` clears it, :1070); otherwise it warns (or refuses when not even
the largest layer fits) and lends nothing.  The loan releases the physical pages (``release_physical``) and maps
fresh zeroed ones afterwards (``recommit``).

The harness's tiny model never runs short (3 x its largest layer is KB against the >= 1 GiB margin the sizing
keeps free), so a cell forces the shortage by raising ``WEIGHT_UPDATE_PEAK_LAYER_FACTOR``, a module global that
``_release_for_weight_update`` reads at call time (:770); everything else is vLLM's own code.  The evidence is
counted, not inferred: every ``ExtensibleKVCache.release_physical`` and ``recommit`` call of this worker.

Installed on ``WorkerBase`` by the repro shim (``repro_kv_loan``, called through ``collective_rpc``).
"""

from __future__ import annotations

import importlib
from typing import Any

MODULE = "vllm.v1.worker.extensible_kv_cache"
FACTOR = "WEIGHT_UPDATE_PEAK_LAYER_FACTOR"
# needed = factor x largest layer's bytes must exceed any GPU's free memory: the update always runs short.
FORCED_FACTOR = 10**15
COUNTED = ("release_physical", "recommit")
COUNTS: dict[str, int] = dict.fromkeys(COUNTED, 0)
_ORIGINAL: dict[str, Any] = {}


def _count(cls: type, name: str) -> None:
    """Wrap ``cls.name`` once so that every call in this process is counted."""
    original = getattr(cls, name)
    if getattr(original, "_repro_counted", False):
        return

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS[name] += 1
        return original(self, *args, **kwargs)

    counted._repro_counted = True  # type: ignore[attr-defined]
    setattr(cls, name, counted)


def _force(mod: Any, force: bool | None) -> None:
    """Raise the factor (True), put vLLM's own value back (False), or leave it (None)."""
    if force is True:
        _ORIGINAL.setdefault(FACTOR, getattr(mod, FACTOR))
        setattr(mod, FACTOR, FORCED_FACTOR)
    elif force is False and FACTOR in _ORIGINAL:
        setattr(mod, FACTOR, _ORIGINAL.pop(FACTOR))


def kv_loan(self: Any, force: bool | None = None) -> dict[str, Any]:
    """This worker's KV-loan state: whether its KV cache is extensible and reclaimable, its physical bytes, and
    how often the cache's memory was released and recommitted since the probe was first called."""
    try:
        mod = importlib.import_module(MODULE)
    except ImportError as exc:
        return {"available": False, "why": f"this vLLM has no {MODULE} (the extensible KV cache arrived in "
                                           f"vLLM 0.34.0): {exc}"}
    for name in COUNTED:
        _count(mod.ExtensibleKVCache, name)
    _force(mod, force)
    cache = getattr(getattr(self, "model_runner", None), "extensible_kv_cache", None)
    buffer = getattr(cache, "buffer", None)
    return {
        "available": True,
        "extensible": cache is not None,
        "reclaimable": getattr(self, "_kv_cache_reclaimable", None),
        "physical_bytes": getattr(buffer, "physical_bytes", None),
        "factor": getattr(mod, FACTOR),
        "forced": FACTOR in _ORIGINAL,
        **{f"{name}_calls": n for name, n in COUNTS.items()},
    }


def install() -> None:
    from vllm.v1.worker.worker_base import WorkerBase

    WorkerBase.repro_kv_loan = kv_loan  # type: ignore[attr-defined]
