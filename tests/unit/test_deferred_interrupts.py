"""Ctrl-C in the Ray driver is acted on between bounded waits, never lost, never stuck behind a Ray call.

No cluster and no process: a fake ``ray`` whose calls are scripted, and signals the test sends to itself.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from harness.core.cell import Cell, EngineKey
from harness.core.oracle import Outcome
from harness.envbuild.envs import IndexConfig
from harness.run.cluster import _collect, _RayRun, _shutdown
from harness.run.context import RunContext
from harness.run.deferred import DeferredInterrupts, call_bounded
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, ResultsLog, infra_result

pytestmark = pytest.mark.unit


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_is_noted_and_raised_only_at_check() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), DeferredInterrupts() as intr:
        _ctrl_c()
        assert intr.pending
        intr.check()
        pytest.fail("check() did not run the original handler")
    assert signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_during_the_cleanup_of_a_good_run_still_interrupts_it() -> None:
    with pytest.raises(KeyboardInterrupt), DeferredInterrupts():
        _ctrl_c()


def test_a_ctrl_c_while_another_error_propagates_does_not_replace_it() -> None:
    with pytest.raises(ValueError), DeferredInterrupts():
        _ctrl_c()
        raise ValueError("the run's own error")


def test_a_call_that_never_returns_is_abandoned_on_a_ctrl_c_during_it() -> None:
    never = threading.Event()
    with pytest.raises(KeyboardInterrupt), DeferredInterrupts() as intr:
        # The limit is far beyond any test: only the Ctrl-C, sent once the call runs, can end the wait.
        started = threading.Event()
        threading.Thread(target=lambda: (started.wait(), _ctrl_c()), daemon=True).start()

        def stuck() -> None:
            started.set()
            never.wait()

        assert call_bounded(stuck, 3600, intr, "stuck").is_alive()
    never.set()
    assert not call_bounded(lambda: None, 3600, DeferredInterrupts(), "quick").is_alive()


class _FakeRay(ModuleType):
    """Two engine tasks that run until cancelled; a mailbox whose first drain answers only after a Ctrl-C."""

    def __init__(self, items: list[tuple[str, str, Any]]) -> None:
        super().__init__("ray")
        self.items = items
        self.cancels: list[tuple[str, bool]] = []
        self.drains: list[str] = []
        self.ended: set[str] = set()
        self.slow_waits = 0
        self.exceptions = SimpleNamespace(RayError=RuntimeError)
        self.mailbox = SimpleNamespace(drain=SimpleNamespace(remote=self._drain))

    def _drain(self) -> str:
        self.drains.append(f"drain{len(self.drains)}")
        return self.drains[-1]

    def wait(self, refs: list[str], num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        if refs == ["drain0"] and not self.cancels:
            self.slow_waits += 1
            if self.slow_waits > 100:
                pytest.fail("the driver went on waiting for the mailbox after the Ctrl-C")
            _ctrl_c()  # the user presses Ctrl-C while the mailbox is slow to answer
            return [], refs
        ready = [r for r in refs if r.startswith("drain") or r in self.ended][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: str) -> Any:
        out, self.items = (self.items, []) if ref == "drain0" else ([], [])
        return out

    def cancel(self, ref: str, force: bool = False) -> None:
        self.cancels.append((ref, force))
        self.ended.add(ref)  # the task's own cleanup ran: it ends within the grace period


def test_ctrl_c_while_the_mailbox_is_slow_cancels_every_task_and_keeps_what_was_reported(tmp_path: Path) -> None:
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path)
    keys = [EngineKey("9.9.1", "mp", False), EngineKey("9.9.2", "mp", False)]
    cells = {k.id: (Cell(k.version, "mp", False, "keep", True),) for k in keys}
    finished = infra_result(cells[keys[0].id][0], Outcome.OK, "reported before the Ctrl-C")
    ray = _FakeRay([(keys[0].id, "result", finished.to_dict())])
    recorded: list[CellResult] = []
    ctx = RunContext(cfg, IndexConfig(), tmp_path / "cache", ResultsLog(tmp_path / "results.jsonl"))
    run = _RayRun(ctx, recorded.append, {"tasks": {}}, by_id={k.id: k for k in keys}, driver_node="node-a")
    pending = {f"task-{k.id}": (k, cells[k.id]) for k in keys}

    with pytest.raises(KeyboardInterrupt), run.interrupts:
        _collect(ray, run, (ray.mailbox, pending))

    assert sorted(ray.cancels) == sorted((f"task-{k.id}", False) for k in keys), "cancelled politely, once each"
    # The drain in flight at the Ctrl-C was waited for: the result it carried is recorded, not lost.
    assert [r.id for r in recorded] == [finished.id]


def test_a_shutdown_that_hangs_is_abandoned_and_the_local_cluster_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    never = threading.Event()
    killed: list[str] = []
    node = SimpleNamespace(all_processes={"gcs": [SimpleNamespace(process=SimpleNamespace(
        kill=lambda: killed.append("gcs")))], "raylet": [SimpleNamespace(process=SimpleNamespace(
            kill=lambda: killed.append("raylet")))]})
    ray = SimpleNamespace(shutdown=never.wait, _private=SimpleNamespace(worker=SimpleNamespace(_global_node=node)))
    # Once the cluster is killed, the stuck call returns (as a gRPC call to a dead GCS fails) and is waited for.
    monkeypatch.setattr(node.all_processes["gcs"][0].process, "kill", lambda: (killed.append("gcs"), never.set()))
    intr = DeferredInterrupts()
    # A Ctrl-C while the shutdown runs (the limit alone would keep a test waiting a minute).
    ray.shutdown = lambda: (intr.received.append(signal.SIGINT), never.wait())
    _shutdown(ray, intr)  # type: ignore[arg-type]
    assert sorted(killed) == ["gcs", "raylet"]
    assert not [t for t in threading.enumerate() if t.name == "vllm-repro-ray-shutdown"], "its shutdown was left"
