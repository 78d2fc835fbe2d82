"""Engines side by side (harness.run.slots, harness.run.local): capacity, GPU slots, order, failures.

The engines here are stand-ins (``run_engine`` replaced): threads that report synthetic cell results, so the
tests exercise the scheduling itself, synchronised by events and barriers, never by sleeps.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import harness.run.cores as cores
import harness.run.local as local
from harness.core.cell import Cell
from harness.core.events import EngineEvent
from harness.core.oracle import Outcome
from harness.core.records import EngineInfo
from harness.envbuild.envs import EnvRecipe, IndexConfig, VllmEnv
from harness.plan.matrix import MatrixPlan
from harness.run.context import RunContext
from harness.run.cores import core_sets, omp_bind
from harness.run.execute import execute_plan
from harness.run.runner import Cancelled
from harness.run.slots import (
    SHARED_GPU_KV_BYTES,
    Capacity,
    EngineStart,
    Slots,
    auto_jobs,
    capacity,
    engine_start,
    for_workers,
    pick_gpus,
)
from harness.run.spec import RunConfig
from harness.run.turns import ScenarioTurns, Turn
from harness.verdicts.results import CellResult, ResultsLog, read_results

pytestmark = pytest.mark.unit


def test_slots_bound_jobs_and_gpu_sharing() -> None:
    s = Slots(Capacity(jobs=3, gpus=("0", "1"), per_gpu=2))
    assert s.take(1) == ("0",)
    assert s.take(1) == ("1",)  # the least loaded GPU first: spread before stacking
    assert s.take(2) == ("0", "1")  # TP=2 takes two distinct GPUs
    assert s.take(0) is None  # three engines run: the fourth waits
    s.give(("0",))
    assert s.take(2) is None  # GPU 1 has no free slot left
    assert s.take(1) == ("0",)
    assert s.fits(2) and not s.fits(3)


def test_cpu_slots_need_no_gpu() -> None:
    s = Slots(Capacity(jobs=1))
    assert s.take(0) == ()
    assert s.take(0) is None
    s.give(())
    assert s.take(0) == ()


@pytest.mark.parametrize(("platform", "gpus", "gmu", "cores", "want"), [
    ("cpu", (), None, 2, Capacity(jobs=1)),  # this machine and CI: one engine at a time
    ("cpu", (), None, 32, Capacity(jobs=4)),
    ("cuda", ("0",), 0.05, 16, Capacity(jobs=15, gpus=("0",), per_gpu=16)),  # one core for the harness
    ("cuda", ("0", "1"), 0.05, 32, Capacity(jobs=31, gpus=("0", "1"), per_gpu=16)),
    ("cuda", ("0", "1"), 0.05, 8, Capacity(jobs=7, gpus=("0", "1"), per_gpu=16)),  # one core for the harness
    ("cuda", ("0",), 0.5, 16, Capacity(jobs=1, gpus=("0",), per_gpu=1)),  # a big model: one per GPU
    ("cuda", (), 0.05, 16, Capacity(jobs=2)),  # cuda without a visible GPU
])
def test_auto_capacity(platform: str, gpus: tuple[str, ...], gmu: float | None, cores: int, want: Capacity) -> None:
    assert auto_jobs(platform, gpus, gmu, cores) == want


def test_pick_gpus_spreads_before_stacking() -> None:
    assert pick_gpus({"0": 1, "1": 2, "2": 2}, ("0", "1", "2"), 2) == ("1", "2")
    assert pick_gpus({"0": 2, "1": 2}, ("1", "0"), 1) == ("1",)  # ties: visible order
    assert pick_gpus({"0": 0, "1": 3}, ("0", "1"), 2) is None
    assert pick_gpus({}, (), 0) == ()


@pytest.mark.parametrize(("workers", "want"), [
    (1, Capacity(jobs=1, gpus=("0",), per_gpu=1)),  # no xdist: a whole GPU, no sharing
    (3, Capacity(jobs=3, gpus=("0",), per_gpu=3)),
    (16, Capacity(jobs=15, gpus=("0",), per_gpu=15)),  # more workers than engines fit: the capacity bounds them
])
def test_capacity_for_workers(workers: int, want: Capacity) -> None:
    cap = for_workers(auto_jobs("cuda", ("0",), 0.05, cores=16), workers)
    assert cap == want
    assert cap.shares_gpus == (workers > 1)
    assert for_workers(Capacity(jobs=2), 4) == Capacity(jobs=2)  # cpu: no GPUs


@pytest.mark.parametrize(("cores", "want"), [(2, Capacity(jobs=2, scenarios=1)), (16, Capacity(jobs=3, scenarios=2))])
def test_cpu_engines_pipeline(cores: int, want: Capacity) -> None:
    """On CPU the automatic capacity starts one engine more than may decode at once: its start-up overlaps."""
    assert capacity(0, "cpu", [], None, cores=cores) == want
    assert capacity(0, "cuda", [], None, cores=cores) == want  # cuda asked for, no GPU visible


def test_jobs_given_spread_over_the_gpus() -> None:
    assert capacity(4, "cuda", ["0", "1"], 0.05) == Capacity(jobs=4, gpus=("0", "1"), per_gpu=2)
    assert capacity(3, "cpu", [], None, cores=2) == Capacity(jobs=3, scenarios=1)
    assert not capacity(2, "cuda", ["0", "1"], 0.05).shares_gpus


# --------------------------------------------------------------------------- how an engine starts beside others


def _env(tmp_path: Path, version: str, fixed_kv: bool | None) -> VllmEnv:
    """An env whose vLLM has ``kv_cache_memory_bytes`` (True), has not (False), or has no readable source (None)."""
    root = tmp_path / f"env-{version}"
    args = root / "lib" / "python3.12" / "site-packages" / "vllm" / "engine" / "arg_utils.py"
    args.parent.mkdir(parents=True)
    if fixed_kv is not None:
        args.write_text("kv_cache_memory_bytes: int | None = None\n" if fixed_kv else "gpu_memory_utilization = 0.9\n")
    return VllmEnv(root, EnvRecipe("vllm", version, "cuda", "3.12"), {"valid": True})


def test_engine_start_fixed_kv_else_startup_locks(tmp_path: Path) -> None:
    shared = Capacity(jobs=4, gpus=("0", "1"), per_gpu=2)
    new, old = _env(tmp_path, "0.21.0", fixed_kv=True), _env(tmp_path, "0.16.0", fixed_kv=False)
    # Sharing GPUs with a vLLM that has kv_cache_memory_bytes: a fixed KV cache, no waiting.
    assert engine_start(shared, ("0", "1"), new) == EngineStart(
        engine_extra={"kv_cache_memory_bytes": SHARED_GPU_KV_BYTES})
    # Without it: vLLM profiles memory, so start-ups on its GPUs (both, for TP=2) take turns.
    assert engine_start(shared, ("0", "1"), old) == EngineStart(startup_locks=("0", "1"))
    # A GPU of its own, or none: as one engine at a time.
    assert engine_start(Capacity(jobs=2, gpus=("0", "1"), per_gpu=1), ("0",), old) == EngineStart()
    assert engine_start(shared, (), old) == EngineStart()
    assert engine_start(Capacity(jobs=2, gpus=("0",), per_gpu=2), ("0",), _env(tmp_path, "0.9.0", None)) == \
        EngineStart(startup_locks=("0",))  # no vLLM source to read: assume no fixed KV cache


# --------------------------------------------------------------------------- the local backend


class FakeEngines:
    """``run_engine`` stand-in: records what each engine got; ``gate`` lets a test hold engines running."""

    def __init__(self, gate: threading.Barrier | None = None, after: threading.Barrier | None = None,
                 teardown_until: int = 0) -> None:
        self.gate, self.after, self.calls, self.lock = gate, after, [], threading.Lock()
        self.teardown_until, self.teardowns_waited_out = teardown_until, 0
        self.now = self.most = self.starting = self.most_starting = self.deciding = self.most_deciding = 0

    def __call__(self, env: VllmEnv, key: Any, cells: tuple[Cell, ...], cfg: RunConfig, on_event: Any = None,
                 on_result: Any = None, extra_env: Any = None, engine_extra: Any = None,
                 cancel: Any = None, turns: ScenarioTurns | None = None) -> list[CellResult]:
        with self.lock:
            self.calls.append((key.id, extra_env, engine_extra))
            self.now += 1
            self.starting += 1
            self.most = max(self.most, self.now)
            self.most_starting = max(self.most_starting, self.starting)
        if self.gate is not None:  # during start-up
            self.gate.wait(timeout=30)
        with self.lock:
            self.starting -= 1
        on_event(key, EngineEvent(EngineInfo({})))  # ready
        turn = Turn(turns, lambda: None) if turns is not None else None
        if turn is not None:  # as runner._follow: ask for the turn once ready, until it comes
            turn.ready()
            while not turn.poll(0.05):
                pass
        with self.lock:
            self.deciding += 1
            self.most_deciding = max(self.most_deciding, self.deciding)
        if self.after is not None:  # during the scenarios
            self.after.wait(timeout=30)
        out = [CellResult(c, Outcome.ERROR if key.version == "9.9.9" else Outcome.OK, "x") for c in cells]
        with self.lock:
            self.deciding -= 1
        if turn is not None:
            turn.end()
        for r in out:
            on_result(r)
        if self.teardown_until:  # tearing down until that many engines were started (at most 3 s)
            for _ in range(60):
                if len(self.calls) >= self.teardown_until:
                    break
                threading.Event().wait(0.05)
            else:
                with self.lock:
                    self.teardowns_waited_out += 1
        with self.lock:
            self.now -= 1
        return out


def _plan(versions: tuple[str, ...], tp: int = 1) -> MatrixPlan:
    engines = tuple((Cell(v, "mp", a, "keep", True, tp).engine, (Cell(v, "mp", a, "keep", True, tp),
                                                                 Cell(v, "mp", a, "wait", True, tp)))
                    for v in versions for a in (False, True))
    return MatrixPlan(engines=engines, unsupported=((Cell(versions[0], "ray-v1", True, "keep", True), "no"),))


def _run(tmp_path: Path, plan: MatrixPlan, cap: Capacity, envs: dict[str, VllmEnv]) -> Any:
    cfg = RunConfig(platform="cuda", work_dir=tmp_path / "w", model_cache=tmp_path / "m", n_gpus=len(cap.gpus))
    ctx = RunContext(cfg, IndexConfig(), tmp_path / "cache", ResultsLog(tmp_path / "results.jsonl"),
                     prebuilt=envs, capacity=cap)
    return execute_plan(plan, ctx)


def test_engines_run_side_by_side_and_the_log_keeps_the_sequential_order(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngines(threading.Barrier(2))  # each engine waits until a second one runs beside it
    monkeypatch.setattr(local, "run_engine", fake)
    plan = _plan(("0.21.0", "0.22.0"))
    envs = {v: _env(tmp_path, v, fixed_kv=True) for v in ("0.21.0", "0.22.0")}
    results = _run(tmp_path, plan, Capacity(jobs=2, gpus=("0",), per_gpu=2), envs)
    assert fake.most == 2
    logged = [c.id for c in read_results(tmp_path / "results.jsonl").cells]
    assert logged == [c.id for c, _ in plan.unsupported] + [c.id for _, cs in plan.engines for c in cs]
    assert [c.id for c in results.cells] == [c.id for c in plan.cells]
    # Sharing a GPU with a vLLM that has kv_cache_memory_bytes: a fixed KV cache, the GPU by CUDA_VISIBLE_DEVICES.
    assert {(env["CUDA_VISIBLE_DEVICES"], tuple(extra.items())) for _, env, extra in fake.calls} == {
        ("0", (("kv_cache_memory_bytes", SHARED_GPU_KV_BYTES),))}


def test_jobs_bound_the_engines_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngines()
    monkeypatch.setattr(local, "run_engine", fake)
    envs = {v: _env(tmp_path, v, fixed_kv=True) for v in ("0.21.0", "0.22.0", "0.32.0")}
    _run(tmp_path, _plan(("0.21.0", "0.22.0", "0.32.0"), tp=2), Capacity(jobs=4, gpus=("0", "1"), per_gpu=1), envs)
    assert fake.most == 1  # TP=2 on two GPUs with one slot each: one engine at a time
    assert {env["CUDA_VISIBLE_DEVICES"] for _, env, _ in fake.calls} == {"0,1"}
    assert not any(extra for _, _, extra in fake.calls)  # no GPU shared: vLLM's own memory profiling


def test_cpu_engines_start_up_side_by_side_but_decode_one_at_a_time(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Two engines must be in start-up at once (the barrier during start-up), yet only one in its scenarios.
    fake = FakeEngines(threading.Barrier(2))
    monkeypatch.setattr(local, "run_engine", fake)
    envs = {v: _env(tmp_path, v, fixed_kv=True) for v in ("0.21.0", "0.22.0")}
    res = _run(tmp_path, _plan(("0.21.0", "0.22.0")), Capacity(jobs=2, scenarios=1), envs)
    assert fake.most == 2 and fake.most_starting == 2 and fake.most_deciding == 1
    assert len(fake.calls) == 4 and all(r.outcome == Outcome.OK for r in res.cells if r.cell.executor == "mp")


def test_a_pipelined_engine_tearing_down_frees_its_job_for_the_next(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Two jobs, four engines: the third must start while the first two, judged, are still tearing down.
    fake = FakeEngines(teardown_until=3)
    monkeypatch.setattr(local, "run_engine", fake)
    envs = {v: _env(tmp_path, v, fixed_kv=True) for v in ("0.21.0", "0.22.0")}
    _run(tmp_path, _plan(("0.21.0", "0.22.0")), Capacity(jobs=2, scenarios=1), envs)
    assert fake.teardowns_waited_out == 0 and len(fake.calls) == 4


def test_without_a_pipeline_engines_decode_side_by_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The unit test above fails without the turns: here both engines decode at once (the barrier after ready).
    fake = FakeEngines(after=threading.Barrier(2))
    monkeypatch.setattr(local, "run_engine", fake)
    envs = {v: _env(tmp_path, v, fixed_kv=True) for v in ("0.21.0", "0.22.0")}
    _run(tmp_path, _plan(("0.21.0", "0.22.0")), Capacity(jobs=2), envs)
    assert fake.most_deciding == 2


def test_without_a_fixed_kv_cache_start_ups_on_one_gpu_take_turns(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Both engines must be past start-up at once (the barrier after "engine ready"), yet never in start-up
    # together: the GPU's start-up lock is held until the engine reports ready, then handed on.
    fake = FakeEngines(after=threading.Barrier(2))
    monkeypatch.setattr(local, "run_engine", fake)
    envs = {"0.16.0": _env(tmp_path, "0.16.0", fixed_kv=False)}
    _run(tmp_path, _plan(("0.16.0",)), Capacity(jobs=2, gpus=("0",), per_gpu=2), envs)
    assert fake.most == 2 and fake.most_starting == 1
    assert not any(extra for _, _, extra in fake.calls)


def test_a_failed_engine_or_env_does_not_hold_up_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngines()
    monkeypatch.setattr(local, "run_engine", fake)
    envs = {v: _env(tmp_path, v, fixed_kv=True) for v in ("9.9.9", "0.22.0")}
    results = _run(tmp_path, _plan(("9.9.9", "0.22.0")), Capacity(jobs=2, gpus=("0",), per_gpu=2), envs)
    by_version = {(c.cell.version, c.outcome) for c in results.cells if c.cell.executor == "mp"}
    assert by_version == {("9.9.9", Outcome.ERROR), ("0.22.0", Outcome.OK)}


def test_an_interrupt_stops_the_running_engines_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C lands in the main thread while engines run in worker threads: they must be stopped (their process
    # groups killed by run_engine), not waited for, and their unfinished cells get no result.
    started, stopped = threading.Event(), []

    def engine(env: VllmEnv, key: Any, cells: Any, cfg: Any, cancel: Any = None, **kw: Any) -> Any:
        started.set()
        if not cancel.wait(timeout=30):
            pytest.fail("the engine was not told to stop")
        stopped.append(key.id)
        raise Cancelled("stopped")

    def interrupting_wait(fs: Any, timeout: float, return_when: Any) -> Any:
        started.wait(timeout=30)
        raise KeyboardInterrupt  # as Ctrl-C in the main thread while the engine runs

    monkeypatch.setattr(local, "run_engine", engine)
    monkeypatch.setattr(local, "wait", interrupting_wait)
    envs = {"0.21.0": _env(tmp_path, "0.21.0", fixed_kv=True)}
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, _plan(("0.21.0",)), Capacity(jobs=1), envs)
    assert len(stopped) == 1
    logged = read_results(tmp_path / "results.jsonl").cells
    assert all(c.outcome is Outcome.UNSUPPORTED for c in logged)  # nothing of the stopped engine


def test_an_engine_that_runs_alone_takes_a_whole_unused_gpu() -> None:
    s = Slots(Capacity(jobs=4, gpus=("0", "1"), per_gpu=3))
    assert s.take(1) == ("0",)
    assert s.take(1, alone=True) == ("1",)  # GPU 0 has an engine: the one alone goes where none is
    assert s.take(1) == ("0",)  # GPU 1 is all taken by it; the others stack on GPU 0
    assert s.take(1, alone=True) is None  # no GPU is unused now
    s.give(("1",), alone=True)
    assert s.free == {"0": 1, "1": 3}
    assert s.take(1, alone=True) == ("1",)


def test_the_sleep_profile_runs_alone_and_starts_as_if_alone(tmp_path: Path) -> None:
    from harness.core.cell import EngineKey
    from harness.run.slots import runs_alone

    sleep = EngineKey("0.21.0", "mp", True, profile="sleep")
    assert runs_alone(sleep)
    assert not runs_alone(EngineKey("0.21.0", "mp", True))
    assert not runs_alone(EngineKey("0.21.0", "mp", True, profile="tiny-kv"))
    shared = Capacity(jobs=8, gpus=("0",), per_gpu=8)
    env = VllmEnv(tmp_path, EnvRecipe("vllm", "0.21.0", "cuda", "3.12"), {"valid": True})
    # Its GPU is its own: vLLM's memory profiling, no fixed KV cache, no start-up lock to wait on.
    assert engine_start(shared, ("0",), env, alone=True) == EngineStart()


def test_every_engine_tier_engine_stops_once_judged() -> None:
    from harness.core.cell import EngineKey
    from harness.run.runner import stops_when_judged

    # Ray's too: its daemons and workers are in the engine's session, which kill_group ends (test_engine_kill.py).
    for executor in ("mp", "uni", "ray-v1", "ray-v2"):
        assert stops_when_judged(EngineKey("0.21.0", executor, True))
    assert not stops_when_judged(EngineKey("0.21.0", "mp", True, tier="scheduler"))


# --------------------------------------------------------------------------- each pipelined CPU engine's cores


def test_core_sets_split_the_cpus_and_omp_bind_spells_vllms_format() -> None:
    assert core_sets([1, 0], 2) == ((0,), (1,))
    assert core_sets(range(16), 3) == (tuple(range(5)), tuple(range(5, 10)), tuple(range(10, 16)))
    assert core_sets([0], 2) == ()  # fewer CPUs than engines: vLLM's auto
    assert core_sets([0, 1], 1) == ()  # one engine at a time: vLLM's auto, the run of before
    assert omp_bind((3,), 1) == "3"
    assert omp_bind((0, 1, 2, 3, 4), 2) == "0,1|2,3,4"  # one list per local rank (TP), '|'-separated
    assert omp_bind((1,), 2) is None


def _cpu_run(tmp_path: Path, cap: Capacity, **cfg: Any) -> None:
    run = RunConfig(platform="cpu", work_dir=tmp_path / "w", model_cache=tmp_path / "m", **cfg)
    envs = {v: _env(tmp_path, v, fixed_kv=True) for v in ("0.21.0", "0.22.0")}
    ctx = RunContext(run, IndexConfig(), tmp_path / "cache", ResultsLog(tmp_path / "results.jsonl"),
                     prebuilt=envs, capacity=cap)
    execute_plan(_plan(("0.21.0", "0.22.0")), ctx)


def test_pipelined_cpu_engines_starting_together_get_cores_of_their_own(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngines(threading.Barrier(2))  # two engines in start-up at once
    monkeypatch.setattr(local, "run_engine", fake)
    monkeypatch.setattr(cores, "allowed_cpus", lambda: [0, 1])
    monkeypatch.delenv(cores.BIND_VAR, raising=False)
    _cpu_run(tmp_path, Capacity(jobs=2, scenarios=1))
    binds = [env[cores.BIND_VAR] for _, env, _ in fake.calls]
    assert len(binds) == 4 and set(binds) == {"0", "1"}
    assert binds[0] != binds[1]  # the first two ran side by side
    # One engine at a time: vLLM's own binding, as before; and the shell's variable wins.
    for i, (cap, env) in enumerate(((Capacity(jobs=1, scenarios=1), {}),
                                    (Capacity(jobs=2, scenarios=1), {cores.BIND_VAR: "0-1"}))):
        fake = FakeEngines(threading.Barrier(int(cap.jobs)))
        monkeypatch.setattr(local, "run_engine", fake)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        _cpu_run(tmp_path / str(i), cap)
        assert not any(extra_env for _, extra_env, _ in fake.calls)
