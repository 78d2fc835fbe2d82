"""How an engine realises the engine axes of a cell: the engine side of the axes table.

The harness declares every axis once (``harness.core.cell.Cell``) and sends a cell's engine axes by name in the
spec (``repro.wire.EngineSpec.axes``); this module is the one place that maps their values onto vLLM: an
``AsyncEngineArgs`` field (:data:`ENGINE_ARGS`) or an environment variable the harness sets before the engine
process starts (:data:`ENV_VARS`: vLLM reads them at import, in every worker).  An axis the engine has no
mapping for is refused (:func:`unrealised`), so a cell is never run without what its label says.

Pure standard library: the harness imports it (for the environment and the engine arguments a cell owns).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineArg:
    """An axis realised as an ``AsyncEngineArgs`` field: its name, its value, and the option to use instead."""

    field: str
    value: Callable[[Any], Any]
    option: str  # named when a user passes the field as a further engine argument


@dataclass(frozen=True)
class EnvVar:
    """An axis realised as an environment variable of the engine process (None: leave it unset), on the releases
    before ``removed_in`` (None: all): a release whose vllm/envs.py no longer has the variable is not given it."""

    name: str
    value: Callable[[Any], str | None]
    removed_in: str | None = None


def _release(version: Any) -> tuple[int, ...] | None:
    """``0.33.0`` -> (0, 33, 0); None for a label that is no plain release (a commit: every variable is set)."""
    parts = str(version).split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def _backend(executor: Any) -> str:
    return "ray" if str(executor).startswith("ray") else str(executor)


ENGINE_ARGS: dict[str, EngineArg] = {
    "async_scheduling": EngineArg("async_scheduling", bool, "--async (the cell's async axis)"),
    "executor": EngineArg("distributed_executor_backend", _backend,
                          "--executor (the cell's executor axis: mp, uni, ray-v1, ray-v2)"),
    "tp": EngineArg("tensor_parallel_size", int, "--tp (the cell's tensor-parallel axis)"),
}
ENV_VARS: dict[str, tuple[EnvVar, ...]] = {
    # Ray's two executors are one backend; vLLM picks between them with this variable.
    "executor": (EnvVar("VLLM_USE_RAY_V2_EXECUTOR_BACKEND",
                        lambda e: None if not str(e).startswith("ray") else "1" if e == "ray-v2" else "0",
                        removed_in="0.33.0"),),
    # Both always explicit: 0.22+ picks the V2 runner by itself for some models (0.32 by default), and a
    # variable left in the caller's shell must not change what a cell labelled v1 / not batch-invariant runs.
    "model_runner": (EnvVar("VLLM_USE_V2_MODEL_RUNNER", lambda r: "1" if r == "v2" else "0"),),
    "batch_invariant": (EnvVar("VLLM_BATCH_INVARIANT", lambda b: "1" if b else "0"),),
}
# Realised by the process itself: the env's vLLM is the version; repro.engine is the engine tier and picks the door
# (AsyncLLM in-process, or a `vllm serve` it starts and drives over HTTP).
IMPLICIT = frozenset({"version", "tier", "door"})


def engine_args(axes: Mapping[str, Any]) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` fields a cell's engine axes decide."""
    return {ENGINE_ARGS[k].field: ENGINE_ARGS[k].value(v) for k, v in axes.items() if k in ENGINE_ARGS}


def _gone(var: EnvVar, release: tuple[int, ...] | None) -> bool:
    removed = _release(var.removed_in) if var.removed_in else None
    return removed is not None and release is not None and release >= removed


def engine_env(axes: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables a cell's engine axes decide (for its release: ``axes["version"]``)."""
    release = _release(axes.get("version", ""))
    out = {}
    for k, v in axes.items():
        for var in ENV_VARS.get(k, ()):
            value = None if _gone(var, release) else var.value(v)
            if value is not None:
                out[var.name] = value
    return out


def unrealised(axes: Mapping[str, Any]) -> list[str]:
    """Axes this engine side has no mapping for (a harness newer than its repro): the cells cannot run."""
    return sorted(k for k in axes if k not in ENGINE_ARGS and k not in ENV_VARS and k not in IMPLICIT)


def owned_engine_args() -> dict[str, str]:
    """Engine arguments the axes decide, and the option to use instead."""
    return {a.field: a.option for a in ENGINE_ARGS.values()}
