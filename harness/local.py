"""The local backend: every engine of the matrix on this machine, one after another (``runner.run_engine``)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from harness.context import BackendReport, CellSink, EngineWork, Progress, RunContext, env_facts
from harness.envs import VllmEnv, ensure_env
from harness.errors import EnvBuildError
from harness.oracle import Outcome
from harness.results import infra_result
from harness.runner import run_engine


class LocalBackend:
    """Engines run here; environments are built ``ctx.build_jobs`` at a time in the background.

    The next version's env is usually ready when the current version's engines finish.
    """

    def run(self, engines: Sequence[EngineWork], ctx: RunContext, record: CellSink) -> BackendReport:
        by_version: dict[str, list[EngineWork]] = {}
        for key, cells in engines:
            by_version.setdefault(key.version, []).append((key, cells))
        envs: dict[str, dict[str, Any]] = {}
        pool = ThreadPoolExecutor(max_workers=max(1, ctx.build_jobs), thread_name_prefix="env-build")
        futures: dict[str, Future[VllmEnv]] = {
            # Recipes here, in the caller's thread: a bad one is the caller's error, not a build failure.
            v: pool.submit(ensure_env, ctx.recipe(v), ctx.cache_dir, lambda m: ctx.say(Progress("env", m)))
            for v in by_version if v not in ctx.prebuilt
        }
        try:
            for version, work in by_version.items():
                envs[version] = _run_version(version, work, futures, ctx, record)
        finally:
            for f in futures.values():
                f.cancel()
            pool.shutdown(wait=True)
        return BackendReport(envs, len(engines))


def _run_version(version: str, work: list[EngineWork], futures: dict[str, Future[VllmEnv]], ctx: RunContext,
                 record: CellSink) -> dict[str, Any]:
    """Run the engines of one version; the facts of its env (or why it could not be built)."""
    ctx.say(Progress("env", f"environment for vLLM {version}"))
    try:
        env = ctx.prebuilt[version] if version in ctx.prebuilt else futures[version].result()
    except (EnvBuildError, OSError) as exc:
        for _, cells in work:
            for c in cells:
                record(infra_result(c, Outcome.BUILD_FAILED, f"environment build failed: {exc}"))
        return {"error": str(exc)}
    for key, cells in work:
        ctx.say(Progress("engine-start", f"engine {key.id}: {len(cells)} scenario(s)", key))
        run_engine(env, key, cells, ctx.cfg, on_event=ctx.event, on_result=record)
    return env_facts(env)
