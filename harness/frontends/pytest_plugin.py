"""pytest plugin: the matrix as test items (``pytest -k post_resume``), engines shared per engine config.

Loaded by the checkout's ``pyproject.toml`` (``addopts = -p harness.frontends.pytest_plugin``), from
whichever vllm-repro is installed (tox's, or one from an air-gapped node's bundle); not a
``pytest11`` entry point, whose hooks (the xdist scheduler among them) would load in every
other project's pytest.  Never imports vllm or torch: engines run in their own environments
through :class:`harness.run.session.EngineSession`, the one engine driver run interactively.

* ``--vllm-versions``, ``--platform`` and one option per axis (``--executors``, ``--scenarios``, ``--vllm-async``,
  ``--vllm-tp``, ...: harness.core.axes.Axis.pytest_flag) choose the cells (defaults from ``VLLM_REPRO_VERSIONS``,
  ``VLLM_REPRO_PLATFORM``, ``VLLM_REPRO_EXECUTORS``, ..., else the platform's default matrix).
* A test asking for the ``post_resume_cell`` argument gets one item per cell,
  id ``vllm0.21.0-mp-async_on-keep-clear``; cells the platform cannot run are
  skipped with the reason.
* Items of one engine config share one engine process, started on first use
  and stopped at the end of the session.  Under pytest-xdist each item is put
  in the ``xdist_group`` of its engine (use ``--dist loadgroup``: one engine
  start per config).  On GPU machines engines of different workers share the
  GPUs as the matrix's ``--jobs auto`` does (``harness.run.slots``): each
  takes a slot on its ``tp`` GPUs (``harness.run.gpus``' file locks, shared by the
  workers), and engines sharing a GPU get a fixed KV cache or take turns
  starting.  ``-n auto`` there starts as many workers as engines may run at once.
* ``--wheelhouse DIR`` / ``--base-python PATH`` (defaults ``$VLLM_REPRO_WHEELHOUSE``
  / ``$VLLM_REPRO_BASE_PYTHON``) build the envs with no network, exactly as
  the CLI's options of the same names; a bad one is a usage error.
* Every judged cell is written to the same results files as the CLI
  (``--repro-reports``, default ``reports/pytest``); ``--repro-keep-engines`` keeps the engines' sessions there
  (``.run-*/``) after a clean run too, for ``vllm-repro bench post-resume``.
* ``--retry-infra N`` (default 1, what the nightly passes; ``$VLLM_REPRO_RETRY_INFRA``): a cell that came out
  ERROR or TIMEOUT runs again on a fresh engine, as the matrix's option of the same name; CRASH and token
  faults never.  The terminal summary lists every retried item, each attempt and why it failed.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from harness.bench.pytest_run import write_session_span
from harness.core.axes import Axis
from harness.core.cell import Cell, EngineKey, find_cell_id
from harness.core.errors import BadInput, EnvBuildError, ReproError
from harness.core.events import engine_facts
from harness.core.oracle import Outcome
from harness.core.records import Attempt
from harness.envbuild.envs import (
    RecipeFor,
    VllmEnv,
    default_cache_dir,
    index_config_from_env,
    recipe_factory,
    source_options,
)
from harness.frontends.pytest_summary import terminal_summary
from harness.plan.engine_args import BUILTIN_MODELS, PRESETS, EngineSetup, engine_setup
from harness.plan.matrix import explicit_axes, parse_versions, selection_axes, selection_type, unsupported_reason
from harness.plan.platforms import detect_platform
from harness.plan.releases import wheelhouse_fetch
from harness.run.context import RunContext, this_python
from harness.run.gpus import GpuLease, GpuLeaseError, hold_startup, lease_slots, visible_gpus
from harness.run.runner import retryable
from harness.run.scenario_results import scenario_result
from harness.run.session import EngineDied, EngineSession
from harness.run.slots import Capacity, auto_jobs, engine_start, for_workers, runs_alone
from harness.run.spec import RunConfig, scenario_entry
from harness.verdicts.known_bugs import KnownBug, annotate, load_known_bugs
from harness.verdicts.results import CellResult, Results, ResultsLog, infra_result, read_results

RUN_DIR_KEY = "vllm_repro_run_dir"
SESSION_START = pytest.StashKey[float]()  # when pytest started (harness.bench.pytest_run.write_session_span)


RECIPES = pytest.StashKey[RecipeFor]()  # how this process builds each version's env (from the options)


# The tiny model's share of a GPU's memory, as the CLI's default --gpu-memory-utilization: it sets how many
# engines share a GPU (harness.run.slots.auto_jobs).
GPU_MEMORY_UTILIZATION = 0.05


# How long a worker waits for GPU slots or a start-up lock: other workers' engines hold theirs while their items
# run (each within its own timeouts), so a whole session's worth, not one engine's.
LEASE_WAIT_S = 7200.0


# --retry-infra's default here: what every nightly matrix passes (.github/workflows/nightly.yml,
# .buildkite/pipeline.yml; tests/unit/test_ci_files.py holds them equal), so one engine that died outside vLLM's
# code or hung on a busy runner (issue 21: a port taken by a neighbour engine) does not fail the session.
DEFAULT_RETRY_INFRA = 1


RETRY_INFRA_ENV = "VLLM_REPRO_RETRY_INFRA"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("vllm-repro")
    g.addoption("--vllm-versions", default=os.environ.get("VLLM_REPRO_VERSIONS"),
                help="vLLM versions of the post_resume matrix (list, A..B range, latest); "
                     "default: 0.21.0,0.32.0 on cpu, 0.21.0,0.22.0,latest on cuda")
    add_axis_options(g)
    g.addoption("--platform", dest="repro_platform", default=os.environ.get("VLLM_REPRO_PLATFORM"),
                help="cpu or cuda (default: detected)")
    g.addoption("--known-bugs", type=Path, default=None,
                help="known-bug table to judge cells against (default: the one shipped with vllm-repro)")
    _add_retry_option(g)
    g.addoption("--repro-reports", type=Path, default=Path("reports/pytest"),
                help="where the results JSON/Markdown/JUnit of the post_resume cells go (default reports/pytest)")
    g.addoption("--repro-keep-engines", action="store_true", default=False,
                help="keep every engine session's folder (events, vLLM's log) under --repro-reports/.run-*/ even "
                     "when no cell was ERROR or TIMEOUT (vllm-repro bench post-resume reads them)")
    # The CLI's --model / --engine-arg / --engine-args / --preset (harness.plan.engine_args), for every engine.
    g.addoption("--vllm-model", default=os.environ.get("VLLM_REPRO_MODEL"),
                help="model every engine loads: a local Hugging Face folder, a hub id, or a built-in "
                     f"({', '.join(BUILTIN_MODELS)}); default bigram-cycle")
    g.addoption("--vllm-engine-arg", action="append", default=[], metavar="KEY=VALUE",
                help="an AsyncEngineArgs field for every engine, repeatable (VALUE is JSON or a string)")
    g.addoption("--vllm-engine-args", action="append", default=[], type=Path, metavar="FILE.json",
                help="a JSON object of engine arguments, repeatable")
    g.addoption("--vllm-preset", default=None, help=f"engine settings people copy: {', '.join(PRESETS)}")
    for flag, kwargs in source_options():  # the CLI's --wheelhouse and --base-python, defaults included
        g.addoption(flag, **kwargs)


def plugin_axes(cell_type: type[Cell] = Cell) -> tuple[Axis, ...]:
    """The axes the plugin offers an option for: every axis with one but the tier (it runs the engine tier)."""
    return tuple(a for a in cell_type.table().axes if a.option and a.name != "tier")


def add_axis_options(g: Any, cell_type: type[Cell] = Cell) -> None:
    """One option per axis of ``cell_type``'s table (:func:`plugin_axes`), default from its variable."""
    for a in plugin_axes(cell_type):  # unlike the CLI's, no per-platform scenario default (matrix_cells)
        note = f" (here: {','.join(map(str, a.option_default))} on every platform)" if a.option_default else ""
        g.addoption(f"--{a.pytest_flag}", dest=a.pytest_dest, default=os.environ.get(a.pytest_env), help=a.help + note)


def _add_retry_option(g: Any) -> None:
    """``--retry-infra N``: the CLI's option of the same name (``harness.frontends.commands.options``), with the
    nightly's default."""
    raw = os.environ.get(RETRY_INFRA_ENV)
    g.addoption("--retry-infra", type=int, default=int(raw) if raw else DEFAULT_RETRY_INFRA, metavar="N",
                help="run a cell that came out ERROR or TIMEOUT again on a fresh engine, up to N more times "
                     f"(default {DEFAULT_RETRY_INFRA}, as the nightly; env {RETRY_INFRA_ENV}); CRASH and token "
                     "faults are never retried; the summary lists every retried item and why")


def engine_setup_of(config: pytest.Config, platform: str) -> EngineSetup:
    """The engine set-up from ``--vllm-model``, ``--vllm-engine-arg(s)``, ``--vllm-preset``; UsageError when bad.

    (A preset's executor and batch-invariant mode are not applied here: choose them with ``--executors``.)
    """
    try:
        return engine_setup(platform, config.getoption("vllm_model"), config.getoption("vllm_engine_arg") or (),
                            config.getoption("vllm_engine_args") or (), config.getoption("vllm_preset"))
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from exc


def pytest_configure(config: pytest.Config) -> None:
    config.stash[RECIPES] = env_recipes(config)
    config.stash[SESSION_START] = time.time()


def env_recipes(config: pytest.Config) -> RecipeFor:
    """How each version's env is built, as the CLI builds it from the same options: from ``--wheelhouse`` onto the
    interpreter holding torch, else from the index (``VLLM_REPRO_INDEX_URL`` etc.).  A missing or broken
    wheelhouse, or no interpreter fit to be its base, is a usage error naming the fix, before any item runs."""
    try:
        return recipe_factory(_platform(config), this_python(), index_config_from_env(),
                              config.getoption("wheelhouse"), config.getoption("base_python"))
    except ReproError as exc:
        raise pytest.UsageError(str(exc)) from exc


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` on a GPU machine: as many workers as engines may run at once there (the matrix's
    ``--jobs auto``: several per GPU for the tiny model, one CPU core each), so no worker idles waiting for a GPU
    slot.  Elsewhere, or with ``$PYTEST_XDIST_AUTO_NUM_WORKERS``, pytest-xdist's own count (the CPU cores)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or _platform(config) != "cuda":
        return None
    gpus = visible_gpus()
    return auto_jobs("cuda", gpus, GPU_MEMORY_UTILIZATION).jobs if gpus else None


def engine_capacity(platform: str, gpus: list[str], workers: int, gmu: float | None = None) -> Capacity:
    """How this run's workers share the GPUs: the matrix's automatic capacity, for at most one engine per worker
    (so a run without xdist keeps whole GPUs and vLLM's own memory profiling, as before).  ``gmu``: each
    engine's GPU memory fraction (default the tiny model's; a preset's is larger)."""
    gmu = (gmu or GPU_MEMORY_UTILIZATION) if platform == "cuda" else None
    return for_workers(auto_jobs(platform, gpus if platform == "cuda" else [], gmu), workers)


def _platform(config: pytest.Config) -> str:
    raw = config.getoption("repro_platform")
    if raw is None:
        return detect_platform()
    if raw not in ("cpu", "cuda"):
        raise pytest.UsageError(f"unknown --platform {raw!r}; valid choices: cpu, cuda")
    return raw


def matrix_cells(config: pytest.Config, cell_type: type[Cell] = Cell) -> list[Cell]:
    """The cells selected by the command-line options (by default every mode, async and clear_cache value, and
    on cuda TP 1 and 2: TP=2 cells skip as UNSUPPORTED with the reason where fewer GPUs are visible)."""
    platform = _platform(config)
    try:
        wheelhouse = config.getoption("wheelhouse")
        # Air-gapped: ranges and latest (in the cuda default) resolve from what the wheelhouse holds.
        versions = parse_versions(config.getoption("vllm_versions"), platform,
                                  fetch=wheelhouse_fetch(wheelhouse) if wheelhouse else None)
        raw = {a.option: config.getoption(a.pytest_dest) for a in plugin_axes(cell_type)}
        axes = selection_axes(raw, platform, cell_type, per_platform=False)
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from exc
    explicit = explicit_axes(raw, cell_type)
    cells: list[Cell] = selection_type(cell_type)(versions=versions, explicit=explicit, **axes).cells()
    return cells


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "post_resume_cell" not in metafunc.fixturenames:
        return
    platform = _platform(metafunc.config)
    engine_setup_of(metafunc.config, platform)  # a bad --vllm-model / --vllm-engine-arg is a usage error, at once
    params = []
    for cell in matrix_cells(metafunc.config):
        # Marks go on the parameters, so they exist before any collection hook:
        # pytest-xdist's --dist loadgroup reads xdist_group in its own hook,
        # whose order relative to a plugin's is not guaranteed (seen: pytest
        # 9.2 ran it first, and the groups were lost).
        marks = [pytest.mark.cpu_engine if platform == "cpu" else pytest.mark.gpu,
                 pytest.mark.xdist_group(cell.engine.id)]
        if cell.tp > 1:
            marks.append(pytest.mark.multi_gpu)
        reason = unsupported_reason(cell, platform, len(visible_gpus()) if platform == "cuda" else None)
        if reason:
            marks.append(pytest.mark.skip(reason=f"UNSUPPORTED: {reason}"))
        params.append(pytest.param(cell, id=cell.id, marks=marks))
    metafunc.parametrize("post_resume_cell", params)


def engine_scope(nodeid: str) -> str:
    """The scheduling unit of a test id: its engine config for post_resume cells, else the test itself."""
    cell = find_cell_id(nodeid)
    return nodeid if cell is None else cell.engine.id


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: schedule post_resume items by engine config (one engine start per config).

    xdist's own loadgroup relies on renaming items from their xdist_group
    marker, which pytest 9.2 no longer honours (both workers then started
    every engine); grouping here works from the test id alone.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class EngineScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return engine_scope(nodeid.split("@", 1)[0])

    return EngineScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # pytest-xdist hook (controller side)
    node.workerinput[RUN_DIR_KEY] = str(_run_dir(node.config))


def _run_dir(config: pytest.Config) -> Path:
    workerinput = getattr(config, "workerinput", None)
    if workerinput and RUN_DIR_KEY in workerinput:
        return Path(workerinput[RUN_DIR_KEY])
    if not hasattr(config, "_repro_run_dir"):
        base = config.getoption("repro_reports")
        config._repro_run_dir = base / f".run-{uuid.uuid4().hex[:8]}"  # type: ignore[attr-defined]
    return config._repro_run_dir  # type: ignore[attr-defined]


@dataclass(frozen=True)
class EngineDown:
    """Why the engine of a config is not available to this pytest process: the cells' outcome and reason."""

    outcome: Outcome
    reason: str


class EnginePool:
    """Lazily started engine sessions, one per engine config, for one pytest process."""

    def __init__(self, config: pytest.Config) -> None:
        self.platform = _platform(config)
        self.cache = default_cache_dir()
        self.index = index_config_from_env()
        self.run_dir = _run_dir(config)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.worker = worker
        setup = engine_setup_of(config, self.platform)
        self.cfg = RunConfig(platform=self.platform, work_dir=self.run_dir / worker,
                             model_cache=self.cache / "models", engine_timeout=600, scenario_timeout=120,
                             gpu_memory_utilization=(setup.gpu_memory_utilization or GPU_MEMORY_UTILIZATION)
                             if self.platform == "cuda" else None,
                             model_kind=setup.model.kind, model_params=setup.model.params,
                             model_label=setup.model.label, engine_args=setup.engine_args, preset=setup.preset)
        self.log = ResultsLog(self.run_dir / f"results.{worker}.jsonl")
        self.ctx = RunContext(self.cfg, self.index, self.cache, self.log, recipe_for=config.stash[RECIPES])
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        self.cap = engine_capacity(self.platform, visible_gpus() if self.platform == "cuda" else [], workers,
                                   self.cfg.gpu_memory_utilization)
        self.lock_dir = self.run_dir / "gpu-locks"  # shared by every worker of this run
        self.sessions: dict[EngineKey, EngineSession | EngineDown] = {}
        self.envs: dict[str, VllmEnv | EngineDown] = {}
        self.bugs: tuple[KnownBug, ...] = load_known_bugs(config.getoption("known_bugs"))
        self.hangs: list[tuple[str, str]] = []
        self.leases: dict[EngineKey, GpuLease] = {}
        self.retry_infra: int = config.getoption("retry_infra")
        if self.retry_infra < 0:
            raise pytest.UsageError(f"--retry-infra must be 0 or more, got {self.retry_infra}")

    def _env(self, version: str) -> VllmEnv | EngineDown:
        if version not in self.envs:
            try:
                self.envs[version] = self.ctx.env(version)
            except EnvBuildError as exc:
                self.envs[version] = EngineDown(Outcome.BUILD_FAILED, f"BUILD-FAILED: {exc}")
        return self.envs[version]

    def _release(self, key: EngineKey) -> None:
        lease = self.leases.pop(key, None)
        if lease is not None:
            lease.release()

    def _lease(self, key: EngineKey) -> GpuLease | None:
        # GPU slots across xdist workers: file locks shared by every worker of
        # this run, as many per GPU as the capacity allows; a TP=2 engine holds
        # a slot on two GPUs.  This worker's other engines are stopped first
        # (their items ran: items are grouped by engine), so a worker never
        # waits on slots it holds itself; so is the lease of any engine that
        # failed, died or is starting again.
        if self.platform != "cuda":
            return None
        for other, s in list(self.sessions.items()):
            if other != key and isinstance(s, EngineSession):
                s.close()
                del self.sessions[other]  # started again should a later item need it
        for other in list(self.leases):
            if not isinstance(self.sessions.get(other), EngineSession):
                self.leases.pop(other).release()
        lease = lease_slots(key.tp, self.lock_dir, self.cap, timeout=LEASE_WAIT_S, alone=runs_alone(key))
        self.leases[key] = lease
        return lease

    def session(self, key: EngineKey) -> EngineSession | EngineDown:
        """The running session for ``key``, or why it could not start."""
        if key not in self.sessions:
            self.sessions[key] = self._start(key)
        return self.sessions[key]

    def _start(self, key: EngineKey) -> EngineSession | EngineDown:
        env = self._env(key.version)
        if isinstance(env, EngineDown):
            return env
        try:
            lease = self._lease(key)
            # Beside other engines on its GPUs: a fixed KV cache, else its GPUs' start-up locks until it is ready.
            start = engine_start(self.cap, lease.gpus if lease else (), env, runs_alone(key))
            startup = hold_startup(self.lock_dir, start.startup_locks, timeout=LEASE_WAIT_S)
        except GpuLeaseError as exc:
            self._release(key)
            return EngineDown(Outcome.ERROR, f"ERROR: {exc}")
        s = EngineSession(env, key, self.cfg, extra_env=lease.env if lease else None, engine_extra=start.engine_extra)
        try:
            s.start()
        except EngineDied as exc:
            self._release(key)
            return EngineDown(exc.outcome, str(exc))
        finally:
            startup.release()  # ready, refused or dead: the next engine on these GPUs may start
        return s

    def run_cell(self, cell: Cell, scenario: dict[str, Any] | None = None) -> CellResult:
        """Run ``cell``'s scenario (or ``scenario``) on the shared engine; judge and log it.

        With ``--retry-infra N`` an ERROR/TIMEOUT result is tried again on a fresh engine, up to N times, and
        the result lists every attempt.
        """
        attempts: list[Attempt] = []
        while True:
            started, t0 = datetime.now().astimezone().isoformat(timespec="seconds"), time.monotonic()
            s = self.session(cell.engine)
            if isinstance(s, EngineDown):
                res = infra_result(cell, s.outcome, s.reason)
            else:
                res = self._run_on(s, cell, scenario or scenario_entry(cell, self.cfg))
            attempts.append(Attempt(len(attempts) + 1, res.outcome.value, res.label, res.summary, res.reason,
                                    res.duration_s, round(time.monotonic() - t0, 3), started))
            if len(attempts) > self.retry_infra or not retryable(res):
                break
            self._forget(cell.engine)
        if len(attempts) > 1:
            res = replace(res, attempts=tuple(attempts))
        res = annotate(res, self.bugs)
        if scenario is None:
            self.log.append(res)
        return res

    def _forget(self, key: EngineKey) -> None:
        """Drop the engine of ``key`` (stopped if it runs): the next item starts a fresh one."""
        s = self.sessions.pop(key, None)
        if isinstance(s, EngineSession):
            s.close()
        self._release(key)

    def _run_on(self, s: EngineSession, cell: Cell, scenario: dict[str, Any]) -> CellResult:
        info = s.engine_event.info if s.engine_event is not None else engine_facts({})
        try:
            ev = s.run(scenario)
        except EngineDied as exc:
            self.sessions[cell.engine] = EngineDown(exc.outcome, str(exc))
            self._release(cell.engine)
            return infra_result(cell, exc.outcome, str(exc), info)
        if ev.status == "crash" or (ev.status == "timeout" and not ev.engine_recovered):
            # The engine core died (CRASH), or its state is unknown after a timeout: the next scenario gets a
            # fresh engine.
            self._forget(cell.engine)
        return scenario_result(cell, ev, info)

    def report_hang(self, version: str, plan: dict[str, Any], reason: str) -> None:
        """Keep a schedule that hung the engine, for ``vllm-repro plan`` and the session summary."""
        import json

        self.hangs.append((version, reason))
        path = self.run_dir.parent / "hangs.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps({"version": version, "reason": reason, "plan": plan}) + "\n")

    def close(self) -> None:
        for s in self.sessions.values():
            if isinstance(s, EngineSession):
                s.close()
        for lease in self.leases.values():
            lease.release()


@pytest.fixture(scope="session")
def repro_engines(request: pytest.FixtureRequest) -> Iterator[EnginePool]:
    """Engine sessions shared by every item of this pytest process, stopped at the end."""
    pool = EnginePool(request.config)
    request.config._repro_pool = pool  # type: ignore[attr-defined]
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def repro_run_cell(repro_engines: EnginePool) -> Callable[[Cell], CellResult]:
    return repro_engines.run_cell


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if getattr(config, "workerinput", None) is not None:
        return  # workers only append; the controller writes the reports
    run_dir = _run_dir(config)
    logs = sorted(run_dir.glob("results.*.jsonl")) if run_dir.is_dir() else []
    cells: list[CellResult] = []
    for log in logs:
        cells += read_results(log).cells
    if not cells:
        return
    from harness.verdicts.report import write_reports

    out = config.getoption("repro_reports")
    results = Results(tuple(sorted(cells, key=lambda c: c.id)), {"platform": _platform(config), "source": "pytest"})
    paths = write_reports(results, out)
    config._repro_report_paths = paths  # type: ignore[attr-defined]
    config._repro_cells = results.cells  # type: ignore[attr-defined]
    write_session_span(run_dir, config.stash.get(SESSION_START, None))
    # Engine logs are kept only when something went wrong with an engine, or when asked (the benchmark).
    if not config.getoption("repro_keep_engines") and not any(c.outcome in (Outcome.ERROR, Outcome.TIMEOUT)
                                                                  for c in cells):
        shutil.rmtree(run_dir, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    terminal_summary(terminalreporter, config)
