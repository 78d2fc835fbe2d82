"""How an engine realises the engine axes of a cell: the engine side of the axes table.

The harness declares every axis once (``harness.core.cell.Cell``) and sends a cell's engine axes by name in the
spec (``repro.core.wire.EngineSpec.axes``); this module maps their values onto vLLM as their declarations say
(``repro.settings.declared``): an ``AsyncEngineArgs`` field (``Setting.engine_arg``) or an environment variable the
harness
sets before the engine process starts (``Setting.env``: vLLM reads them at import, in every worker).  An axis the
engine has no mapping for is refused (:func:`unrealised`), so a cell is never run without what its label says.

Pure standard library: the harness imports it (for the environment and the engine arguments a cell owns).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repro.settings.declared import SETTINGS, EngineArg, EnvVar


def _engine_arg(axis: str) -> EngineArg | None:
    """The engine argument realising ``axis``, from its setting's declaration (repro.settings.declared), looked up when
    asked: a declaration added later (a test's scratch setting) is followed."""
    return next((s.engine_arg for s in SETTINGS.values() if s.axis == axis and s.engine_arg), None)


def _env_vars(axis: str) -> tuple[EnvVar, ...]:
    return next((s.env for s in SETTINGS.values() if s.axis == axis and s.env), ())


def _release(version: Any) -> tuple[int, ...] | None:
    """``0.33.0`` -> (0, 33, 0); None for a label that is no plain release (a commit: every variable is set)."""
    parts = str(version).split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


# Realised by the process itself: the env's vLLM is the version; repro.engine.main is the engine tier and picks the door
# (AsyncLLM in-process, or a `vllm serve` it starts and drives over HTTP).
IMPLICIT = frozenset({"version", "tier", "door"})


def engine_args(axes: Mapping[str, Any]) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` fields a cell's engine axes decide."""
    return {arg.field: arg.value(v) for k, v in axes.items() if (arg := _engine_arg(k)) is not None}


def _gone(var: EnvVar, release: tuple[int, ...] | None) -> bool:
    removed = _release(var.removed_in) if var.removed_in else None
    return removed is not None and release is not None and release >= removed


def engine_env(axes: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables a cell's engine axes decide (for its release: ``axes["version"]``)."""
    release = _release(axes.get("version", ""))
    out = {}
    for k, v in axes.items():
        for var in _env_vars(k):
            value = None if _gone(var, release) else var.value(v)
            if value is not None:
                out[var.name] = value
    return out


def unrealised(axes: Mapping[str, Any]) -> list[str]:
    """Axes this engine side has no mapping for (a harness newer than its repro): the cells cannot run."""
    return sorted(k for k in axes if _engine_arg(k) is None and not _env_vars(k) and k not in IMPLICIT)


def owned_engine_args() -> dict[str, str]:
    """Engine arguments the axes decide, and the option to use instead."""
    return {s.engine_arg.field: s.engine_arg.option for s in SETTINGS.values() if s.axis and s.engine_arg}
