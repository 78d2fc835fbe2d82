"""The engine core's view of its own settings: what ``repro.settings.declared`` reads every setting back from.

Installed on ``EngineCore`` by the repro shim (``repro_settings``, called with ``call_utility_async``; the server
door reaches it through its loopback utility route).  Read in the engine core because that is where the
scheduler runs: its ``vllm_config`` is the one the platform adjusted (``check_and_update_config``) and start-up
completed (``_initialize_kv_caches`` writes ``cache_config.num_gpu_blocks`` there, vllm/v1/engine/core.py), and its
scheduler and KV cache manager hold the limits that are really applied (``max_num_running_reqs``,
``max_num_scheduled_tokens``, ``enable_caching``).

The view: one section per config object of ``vllm_config`` (its JSON-able fields; None for an absent one, such
as ``speculative_config`` without speculative decoding), ``vllm_config`` for its own plain fields, and
``scheduler`` / ``kv_cache_manager`` for the live objects' plain attributes.  Read-only; no vLLM import.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

_MAX_ITEMS = 64  # a list or dict longer than this is no setting (capture sizes, token lists): left out


def _json(value: Any, depth: int = 0) -> tuple[bool, Any]:
    """(True, the JSON form) of a value a setting can hold, else (False, None)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True, value
    if isinstance(value, enum.Enum):
        return True, value.name
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return True, str(value)  # "torch.float32"
    if depth >= 2:
        return False, None
    if isinstance(value, list | tuple) and len(value) <= _MAX_ITEMS:
        items = [_json(v, depth + 1) for v in value]
        return (True, [v for _, v in items]) if all(ok for ok, _ in items) else (False, None)
    if isinstance(value, Mapping) and len(value) <= _MAX_ITEMS:
        pairs = {str(k): _json(v, depth + 1) for k, v in value.items()}
        return True, {k: v for k, (ok, v) in pairs.items() if ok}
    return False, None


def fields_of(obj: Any) -> dict[str, Any]:
    """The public JSON-able attributes of ``obj`` (a config dataclass or a live object)."""
    out = {}
    for key, value in getattr(obj, "__dict__", {}).items():
        if key.startswith("_"):
            continue
        ok, shown = _json(value)
        if ok:
            out[key] = shown
    return out


def plain_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Engine arguments as the settings view shows them: JSON values as they are, a config object (the weight-sync
    scenario's ``WeightTransferConfig``) as its fields, so that it compares with the view's section of that name."""
    out = {}
    for key, value in kwargs.items():
        ok, shown = _json(value)
        out[key] = shown if ok else fields_of(value)
    return out


def _is_section(value: Any) -> bool:
    return hasattr(value, "__dict__") and type(value).__name__.endswith("Config")


def view(vllm_config: Any, scheduler: Any = None) -> dict[str, Any]:
    """The settings view of ``vllm_config`` and the running ``scheduler``."""
    out: dict[str, Any] = {"vllm_config": fields_of(vllm_config)}
    for key, value in getattr(vllm_config, "__dict__", {}).items():
        if key.startswith("_"):
            continue
        if value is None and key.endswith("_config"):
            out[key] = None
        elif _is_section(value):
            out[key] = fields_of(value)
    if scheduler is not None:
        out["scheduler"] = fields_of(scheduler)
        manager = getattr(scheduler, "kv_cache_manager", None)
        if manager is not None:
            out["kv_cache_manager"] = fields_of(manager)
    return out


def _settings(self: Any) -> dict[str, Any]:
    return view(self.vllm_config, getattr(self, "scheduler", None))


def install(core_module: Any) -> None:
    """Add ``EngineCore.repro_settings`` (vllm/v1/engine/core.py, every release the harness runs)."""
    core_module.EngineCore.repro_settings = _settings
