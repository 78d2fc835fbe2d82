"""How an engine's effective settings are read back: from its probes (``repro.settings.effective.probe_engine``) and
the engine
core's settings view (``repro.settings.core_view``), for the declarations of ``repro.settings.declared``.

A :class:`Reading` is what one setting was found to be, where, or why it could not be read.  The four readers here
are the settings no config field proves (async scheduling, the executor class, the workers' model runner, batch
invariance: what the engine really built), each with its judge, the rule that says the cell did not get what it
asked for.  Every other setting is read at dotted paths into the view (:func:`at_paths`).

Pure standard library.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Executor axis value -> class name vLLM must really construct.
EXPECTED_EXECUTOR = {
    "mp": "MultiprocExecutor",
    "uni": "UniProcExecutor",
    "ray-v1": "RayDistributedExecutor",
    "ray-v2": "RayExecutorV2",
}
# The view's sections searched for an undeclared engine argument, vLLM's config first, then the live objects.
LIVE_SECTIONS = ("scheduler", "kv_cache_manager")
FIRST_SECTIONS = ("model_config", "cache_config", "scheduler_config", "parallel_config", "load_config", "vllm_config")


@dataclass(frozen=True)
class Evidence:
    """What an engine says it runs: its probes, and the engine core's settings view (None: not read, ``view_error``)."""

    probe: Mapping[str, Any]
    view: Mapping[str, Any] | None = None
    view_error: str = ""

    @property
    def core(self) -> Mapping[str, Any]:
        return self.probe.get("core") or {}

    @property
    def workers(self) -> list[Mapping[str, Any]]:
        return list(self.probe.get("workers") or [])


@dataclass(frozen=True)
class Reading:
    """One setting as read back: ``found`` with ``value`` (and every value read, ``values``) at ``where``, or not
    found, and ``why``.  ``detail``: a reader's further evidence (the effective record keeps it)."""

    value: Any = None
    found: bool = False
    where: str = ""
    why: str = ""
    values: tuple[Any, ...] = ()
    paths: tuple[str, ...] = ()  # where each of ``values`` was read
    detail: Mapping[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- settings proven by the probes


def async_scheduling(ev: Evidence) -> Reading:
    """Effective async scheduling: the front end, the engine core's config and scheduler class, and the workers
    agree, else unknown."""
    core, workers = ev.core, ev.workers
    parts = {
        "frontend": ev.probe.get("frontend_async_scheduling"),
        "core_config": core.get("async_scheduling"),
        "core_scheduler_async": (core.get("scheduler_class") or "").endswith("AsyncScheduler") if core else None,
        # A worker whose runner has no async flag of its own (0.34.0's V2 GPU runner) runs whatever the core
        # schedules: the core's scheduler class and config are its evidence, so it adds no vote of its own.
        "workers": [w.get("use_async_scheduling") for w in workers if w.get("runner_async_flag", True)]
        if workers else None,
    }
    known = [v for k, v in parts.items() if k != "workers" and v is not None]
    known += parts["workers"] or []
    value = True if known and all(v is True for v in known) else False if known and all(
        v is False for v in known) else None  # unknown, or inconsistent across processes
    return Reading(value, value is not None, "probes: front-end config, core config, core scheduler class, workers",
                   f"could not establish effective async_scheduling: {parts}", detail={"async_parts": parts})


def async_problem(requested: Any, r: Reading) -> str | None:
    if not r.found:
        return r.why
    if r.value != requested:
        return (f"asked for async_scheduling={requested} but it is effectively {r.value} "
                f"({r.detail.get('async_parts')})")
    return None


def executor_class(ev: Evidence) -> Reading:
    cls = (ev.core.get("executor_class") or "").rsplit(".", 1)[-1] or None
    return Reading(cls, cls is not None, "probe: the engine core's model_executor class",
                   "the engine core reported no executor class")


def executor_problem(requested: Any, r: Reading) -> str | None:
    want = EXPECTED_EXECUTOR.get(str(requested))
    if r.found and want and r.value != want:
        return f"asked for executor {requested} ({want}) but vLLM built {r.value}"
    return None


def runner_generation(model_runner_class: str | None) -> str | None:
    """``v2`` for vLLM's V2 model runners, ``v1`` for the others, None when unknown.

    V2 runners live in packages (``vllm.v1.worker.gpu.model_runner``, 0.32's
    ``vllm.v1.worker.cpu.model_runner``); V1 in ``gpu_model_runner`` / ``cpu_model_runner``.
    """
    if not model_runner_class or model_runner_class == "None":
        return None
    module = model_runner_class.rsplit(".", 1)[0]
    return "v2" if module.startswith(("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")) else "v1"


def model_runner(ev: Evidence) -> Reading:
    runners = {runner_generation(w.get("model_runner_class")) for w in ev.workers}
    value = next(iter(runners)) if len(runners) == 1 else None
    classes = sorted({str(w["model_runner_class"]) for w in ev.workers if w.get("model_runner_class")})
    return Reading(value, value is not None, "probe: every worker's model_runner class",
                   "no worker probe" if not ev.workers else f"workers run {classes}",
                   detail={"model_runner_classes": classes, "generations": sorted(map(str, runners))})


def runner_problem(requested: Any, r: Reading) -> str | None:
    # Only a confirmed v2 counts as v2; v1 is refused only when a worker is seen running v2.
    want = requested or "v1"
    if (r.value != "v2") if want == "v2" else ("v2" in r.detail.get("generations", ())):
        return (f"asked for model runner {want} (VLLM_USE_V2_MODEL_RUNNER) but the workers run "
                f"{', '.join(r.detail.get('model_runner_classes', ())) or 'an unknown runner (no worker probe)'}")
    return None


def batch_invariant(ev: Evidence) -> Reading:
    # A worker that never loaded vLLM's batch-invariant module (None) did not switch it on.
    flags = [w.get("batch_invariant") is True for w in ev.workers]
    value = (all(flags) if all(flags) or not any(flags) else None) if flags else None
    return Reading(value, bool(flags), "probe: every worker's batch-invariant module flag", "no worker probe")


def invariant_problem(requested: Any, r: Reading) -> str | None:
    want = bool(requested)
    if want is not r.value and (want or r.found):
        return (f"asked for VLLM_BATCH_INVARIANT={int(want)} but the workers' batch-invariant mode is "
                f"{'mixed' if r.value is None else r.value}")
    return None


# --------------------------------------------------------------------------- settings read at config paths

_ABSENT = object()


def lookup(view: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` (``section`` or ``section.field[.key]``) of the view, or ``_ABSENT``.  A section that
    is None (no speculative_config) has every field None."""
    section, _, rest = path.partition(".")
    if section not in view:
        return _ABSENT
    value = view[section]
    for key in rest.split(".") if rest else ():
        if value is None:
            return None
        if not isinstance(value, Mapping) or key not in value:
            return _ABSENT
        value = value[key]
    return value


def at_paths(ev: Evidence, paths: tuple[str, ...], name: str) -> Reading:
    """The setting read at every path of ``paths`` the view has (all are recorded; ``same`` wants all to agree)."""
    if ev.view is None:
        return Reading(why=f"the engine core's settings view was not read ({ev.view_error or 'no view'})")
    if not paths:
        return Reading(why=f"no field {name} in any of the {len(ev.view)} sections of this vLLM's config and "
                           "scheduler (an argument vLLM keeps elsewhere, or drops)")
    found = [(p, v) for p in paths if (v := lookup(ev.view, p)) is not _ABSENT]
    if not found:
        return Reading(why=f"this vLLM's engine core has no {' or '.join(paths)}")
    return Reading(found[0][1], True, ", ".join(p for p, _ in found), values=tuple(v for _, v in found),
                   paths=tuple(p for p, _ in found))


def generic_paths(ev: Evidence, name: str) -> tuple[str, ...]:
    """Where an undeclared engine argument ``name`` lives in the view: a section of that name, else the first
    section with a field of that name, the engine's own config sections first (:data:`FIRST_SECTIONS`), then the
    others, then the live scheduler's.  Only one: a sub-config repeats names with other meanings
    (``speculative_config.revision`` is the draft model's, not the model's)."""
    view = ev.view or {}
    if name in view:
        return (name,)
    rest = sorted(s for s in view if s not in FIRST_SECTIONS and s not in LIVE_SECTIONS)
    for section in (*FIRST_SECTIONS, *rest, *LIVE_SECTIONS):
        if isinstance(view.get(section), Mapping) and name in view[section]:
            return (f"{section}.{name}",)
    return ()


def _same(requested: Any, effective: Any) -> bool:
    if isinstance(requested, Mapping):
        return isinstance(effective, Mapping) and all(
            k in effective and _same(v, effective[k]) for k, v in requested.items())
    if isinstance(requested, bool) or isinstance(effective, bool):
        return requested is effective
    if isinstance(requested, int | float) and isinstance(effective, int | float):
        return math.isclose(requested, effective, rel_tol=1e-9)
    if isinstance(requested, list | tuple) and isinstance(effective, list | tuple):
        return len(requested) == len(effective) and all(map(_same, requested, effective))
    if isinstance(requested, str) and isinstance(effective, str):
        # torch dtypes are viewed as "torch.float32"; enums by their name (repro.settings.core_view).
        return requested == effective or effective == f"torch.{requested}"
    return bool(requested == effective)


def same(requested: Any, values: tuple[Any, ...]) -> bool:
    """Whether every value read back is what was asked."""
    return bool(values) and all(_same(requested, v) for v in values)


def first_difference(requested: Any, r: Reading) -> tuple[Any, str]:
    """The first value read back that is not what was asked, and where it was read."""
    for value, path in zip(r.values, r.paths, strict=True):
        if not _same(requested, value):
            return value, path
    return r.value, r.where
