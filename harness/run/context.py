"""What a run of engines needs, in one object, and the one interface a place to run them implements.

:class:`RunContext` replaces the parameters that every driver of engines
used to take one by one (run config, index, cache, python, prebuilt envs,
recipe factory, results log, hooks, argv).  :class:`Backend` is where the
engines of a planned matrix run: ``harness.run.local.LocalBackend`` on this
machine, ``harness.run.cluster.RayBackend`` as Ray tasks; ``harness.run.execute``
runs the same matrix loop on either.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.core.cell import Cell, EngineKey
from harness.core.events import Event
from harness.envbuild.envs import EnvRecipe, IndexConfig, VllmEnv, default_recipe, ensure_env
from harness.run.runner import EventHook
from harness.run.slots import Capacity
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, ResultsLog


@dataclass(frozen=True)
class Progress:
    """What the CLI shows while a matrix runs."""

    kind: str  # "env", "engine-start", "event", "cell"
    message: str
    engine: EngineKey | None = None
    cell: CellResult | None = None
    event: Event | None = None


ProgressHook = Callable[[Progress], None]
CellSink = Callable[[CellResult], None]  # where a backend records each cell result as soon as it is known


def this_python() -> str:
    """The harness's own ``MAJOR.MINOR``: the default Python of an env built for a run."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class RunContext:
    """Everything a run of engines needs besides its plan."""

    cfg: RunConfig
    index: IndexConfig
    cache_dir: Path
    log: ResultsLog | None = None  # where judged cells go; None where nothing is judged into a log (``plan``)
    python: str = field(default_factory=this_python)
    # Versions whose env must not be built (``--versions installed``, or at the same path on every node).
    prebuilt: Mapping[str, VllmEnv] = field(default_factory=dict)
    # The recipe of a version label that is not a release (a commit, a wheelhouse).
    recipe_for: Callable[[str], EnvRecipe] | None = None
    build_jobs: int = 2  # envs built at a time in the background (uv's cache is shared)
    # Engines at a time, and the GPUs they share (harness.run.slots).
    capacity: Capacity = field(default_factory=lambda: Capacity(jobs=1))
    argv: tuple[str, ...] = ()
    on_progress: ProgressHook | None = None
    on_event: EventHook | None = None

    def say(self, p: Progress) -> None:
        if self.on_progress is not None:
            self.on_progress(p)

    def event(self, key: EngineKey, ev: Event) -> None:
        """One engine event: shown as progress, then handed to ``on_event``."""
        self.say(Progress("event", ev.kind, key, event=ev))
        if self.on_event is not None:
            self.on_event(key, ev)

    def recipe(self, version: str) -> EnvRecipe:
        """The env recipe of ``version``: ``recipe_for``'s, else the platform's package from the index."""
        if self.recipe_for is not None:
            return self.recipe_for(version)
        return default_recipe(self.cfg.platform, version, self.python, self.index)

    def env(self, version: str, log: Callable[[str], None] = lambda m: None) -> VllmEnv:
        """The env of ``version``: prebuilt, or built (or reused) in the cache; EnvBuildError when it cannot be."""
        if version in self.prebuilt:
            return self.prebuilt[version]
        return ensure_env(self.recipe(version), self.cache_dir, log)


@dataclass(frozen=True)
class BackendReport:
    """What a backend tells the run's meta: the env of each version, how many engines it started, and more."""

    envs: dict[str, dict[str, Any]]
    engine_starts: int
    meta: dict[str, Any] = field(default_factory=dict)  # merged into the Results meta (e.g. ``cluster``)


EngineWork = tuple[EngineKey, tuple[Cell, ...]]  # one engine config and the cells it runs


class Backend(Protocol):
    """Where the engines of a matrix run."""

    def run(self, engines: Sequence[EngineWork], ctx: RunContext, record: CellSink) -> BackendReport:
        """Run every engine config; hand each cell result to ``record`` as soon as it is known."""
        ...


def env_facts(env: VllmEnv) -> dict[str, Any]:
    """The facts of a version's env kept in a run's meta (a CUDA build on a CPU torch adds the torch it pins
    and the CUDA packages left out: harness.envbuild.cputorch)."""
    keys = ("vllm_version", "torch_version", "torch_override", "resolved_as_of")
    extra = ("torch_pinned", "left_out") if env.recipe.cpu_torch else ()
    # Pins no index holds, on packages no run imports (harness.envbuild.unresolvable): named in the report.
    unresolvable = ("unresolvable_left_out",) if env.status.get("unresolvable_left_out") else ()
    return {"path": str(env.path), "package": env.recipe.package,
            **{k: env.status.get(k) for k in (*keys, *extra, *unresolvable)}}
