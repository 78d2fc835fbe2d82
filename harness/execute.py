"""Run a planned matrix: build envs, start one engine per engine config, log results as they come."""

from __future__ import annotations

import platform as _platform
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from harness import __version__
from harness.envs import EnvRecipe, IndexConfig, VllmEnv, ensure_env, package_for
from harness.errors import EnvBuildError
from harness.faults import bugs_with_injection
from harness.known_bugs import annotate
from harness.matrix import Cell, EngineKey, MatrixPlan
from harness.oracle import Outcome
from harness.results import CellResult, Results, ResultsLog, infra_result
from harness.runner import EventHook, RunConfig, run_engine


@dataclass(frozen=True)
class Progress:
    """What the CLI shows while a matrix runs."""

    kind: str  # "env", "engine-start", "event", "cell"
    message: str
    engine: EngineKey | None = None
    cell: CellResult | None = None
    event: dict[str, Any] | None = None


ProgressHook = Callable[[Progress], None]


def run_matrix(
    plan: MatrixPlan,
    cfg: RunConfig,
    index: IndexConfig,
    cache_dir: Path,
    log: ResultsLog,
    python: str | None = None,
    on_progress: ProgressHook | None = None,
    on_event: EventHook | None = None,
    argv: list[str] | None = None,
    prebuilt: dict[str, VllmEnv] | None = None,
    build_jobs: int = 2,
    recipe_for: Callable[[str], EnvRecipe] | None = None,
) -> Results:
    """Run every engine of ``plan``; each cell result is appended to ``log`` as soon as it is known.

    Environments are built ``build_jobs`` at a time in the background (uv's
    cache is shared), so the next version's env is usually ready when the
    current version's engines finish.  ``prebuilt`` maps versions to envs
    that must not be built (``--versions installed``); ``recipe_for`` builds
    the recipe of a version label that is not a release (a commit).
    """
    say: ProgressHook = on_progress or (lambda p: None)
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    started = datetime.now().astimezone()
    record = CellRecorder(plan, cfg, log, say)

    by_version: dict[str, list[tuple[EngineKey, tuple[Cell, ...]]]] = {}
    for key, cells in plan.engines:
        by_version.setdefault(key.version, []).append((key, cells))

    envs: dict[str, dict[str, Any]] = {}
    prebuilt = prebuilt or {}
    pool = ThreadPoolExecutor(max_workers=max(1, build_jobs), thread_name_prefix="env-build")
    futures: dict[str, Future[VllmEnv]] = {}
    for version in by_version:
        if version not in prebuilt:
            recipe = recipe_for(version) if recipe_for else EnvRecipe(
                package_for(cfg.platform), version, cfg.platform, python, index)
            futures[version] = pool.submit(ensure_env, recipe, cache_dir, lambda m: say(Progress("env", m)))
    try:
        _run_versions(by_version, futures, prebuilt, cfg, record, say, on_event, envs)
    finally:
        for f in futures.values():
            f.cancel()
        pool.shutdown(wait=True)

    return record.results(run_meta(cfg, started, argv, envs, len(plan.engines)))


class CellRecorder:
    """Where a run's cell results go: judged against the known-bug table, logged at once, kept once.

    Records the plan's UNSUPPORTED cells on creation.  Shared by the local
    and the Ray-cluster matrix.
    """

    def __init__(self, plan: MatrixPlan, cfg: RunConfig, log: ResultsLog, say: ProgressHook) -> None:
        self.plan, self.log, self.say = plan, log, say
        # With --inject the injected bug covers every version: its cells must show it (the self-test).
        self.bugs = bugs_with_injection(cfg.inject)
        self.done: dict[str, CellResult] = {}
        for cell, reason in plan.unsupported:
            self(infra_result(cell, Outcome.UNSUPPORTED, reason))

    def __call__(self, res: CellResult) -> None:
        if res.id in self.done:  # a Ray task's result can arrive after its ERROR was recorded
            return
        res = annotate(res, self.bugs)
        self.log.append(res)
        self.done[res.id] = res
        self.say(Progress("cell", f"{res.id}: {res.summary}", res.cell.engine, res))

    def results(self, meta: dict[str, Any]) -> Results:
        """Every recorded cell, in plan order."""
        order = {c.id: i for i, c in enumerate(self.plan.cells)}
        return Results(tuple(sorted(self.done.values(), key=lambda r: order.get(r.id, 0))), meta)


def run_meta(
    cfg: RunConfig, started: datetime, argv: list[str] | None, envs: dict[str, Any], engine_starts: int
) -> dict[str, Any]:
    """The ``meta`` of a run's Results (what ran where, with which settings)."""
    return {
        "tool_version": __version__,
        "created": started.isoformat(timespec="seconds"),
        "finished": datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": cfg.platform,
        "host": {"machine": _platform.machine(), "node": _platform.node(), "python": _platform.python_version()},
        "argv": argv or [],
        "envs": envs,
        "engine_starts": engine_starts,
        "inject": list(cfg.inject),
        "repeat": cfg.repeat,
    }


def _run_versions(
    by_version: dict[str, list[tuple[EngineKey, tuple[Cell, ...]]]],
    futures: dict[str, Future[VllmEnv]],
    prebuilt: dict[str, VllmEnv],
    cfg: RunConfig,
    record: Callable[[CellResult], None],
    say: ProgressHook,
    on_event: EventHook | None,
    envs: dict[str, dict[str, Any]],
) -> None:
    for version, engines in by_version.items():
        say(Progress("env", f"environment for vLLM {version}"))
        try:
            env = prebuilt[version] if version in prebuilt else futures[version].result()
        except (EnvBuildError, OSError) as exc:
            for _, cells in engines:
                for c in cells:
                    record(infra_result(c, Outcome.BUILD_FAILED, f"environment build failed: {exc}"))
            envs[version] = {"error": str(exc)}
            continue
        envs[version] = {"path": str(env.path), **{k: env.status.get(k) for k in
                         ("vllm_version", "torch_version", "torch_override", "resolved_as_of")}}
        for key, cells in engines:
            say(Progress("engine-start", f"engine {key.id}: {len(cells)} scenario(s)", key))

            def relay(k: EngineKey, ev: dict[str, Any]) -> None:
                say(Progress("event", str(ev.get("event")), k, event=ev))
                if on_event is not None:
                    on_event(k, ev)

            run_engine(env, key, cells, cfg, on_event=relay, on_result=record)
