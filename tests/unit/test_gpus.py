"""GPU visibility and disjoint GPU leases (harness.gpus) — no GPU needed: the locks are plain files."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from harness.gpus import GpuLeaseError, lease_gpus, visible_gpus

# Marked per test: `unit` ones are pure and fast, `integration` ones fork processes.


@pytest.mark.unit
def test_cuda_visible_devices_wins() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []


@pytest.mark.unit
def test_leases_are_disjoint_and_tp2_takes_two(tmp_path: Path) -> None:
    a = lease_gpus(1, tmp_path, ["0", "1", "2"], timeout=1)
    b = lease_gpus(2, tmp_path, ["0", "1", "2"], timeout=1)
    assert set(a.gpus).isdisjoint(b.gpus) and len(b.gpus) == 2
    assert b.env == {"CUDA_VISIBLE_DEVICES": ",".join(b.gpus)}
    with pytest.raises(GpuLeaseError, match="no 1 free GPU"):
        lease_gpus(1, tmp_path, ["0", "1", "2"], timeout=0.6)
    a.release()
    assert lease_gpus(1, tmp_path, ["0", "1", "2"], timeout=1).gpus == a.gpus


def _hold(lock_dir: str, q: mp.Queue, go: mp.Event) -> None:  # type: ignore[type-arg]
    lease = lease_gpus(1, Path(lock_dir), ["0", "1"], timeout=5)
    q.put(lease.gpus)
    go.wait(10)
    lease.release()


@pytest.mark.integration
def test_leases_are_disjoint_across_processes(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    q, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_hold, args=(str(tmp_path), q, go)) for _ in range(2)]
    for p in procs:
        p.start()
    got = {q.get(timeout=10), q.get(timeout=10)}
    assert got == {("0",), ("1",)}
    with pytest.raises(GpuLeaseError):
        lease_gpus(1, tmp_path, ["0", "1"], timeout=0.6)
    go.set()
    for p in procs:
        p.join(10)


@pytest.mark.unit
def test_more_gpus_than_visible_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(GpuLeaseError, match="needs 2 GPUs but only 1 are visible"):
        lease_gpus(2, tmp_path, ["0"], timeout=100)
