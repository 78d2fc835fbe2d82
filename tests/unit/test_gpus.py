"""GPU visibility, GPU slot leases and start-up locks (harness.run.gpus) — no GPU needed: the locks are plain files.

flock locks belong to an open file, so two lease calls in one process (threads, or one after the other with the
first still held) contend exactly as two pytest-xdist workers do.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from pathlib import Path

import pytest

from harness.run.gpus import GpuLeaseError, hold_startup, lease_slots, visible_gpus
from harness.run.slots import Capacity

# Marked per test: `unit` ones are pure and fast, `integration` ones fork processes.

WHOLE = Capacity(jobs=3, gpus=("0", "1", "2"), per_gpu=1)  # one engine per GPU (a run without GPU sharing)


@pytest.mark.unit
def test_cuda_visible_devices_wins() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []


@pytest.mark.unit
def test_whole_gpu_leases_are_disjoint_and_tp2_takes_two(tmp_path: Path) -> None:
    a = lease_slots(1, tmp_path, WHOLE, timeout=1)
    b = lease_slots(2, tmp_path, WHOLE, timeout=1)
    assert set(a.gpus).isdisjoint(b.gpus) and len(b.gpus) == 2
    assert b.env == {"CUDA_VISIBLE_DEVICES": ",".join(b.gpus)}
    with pytest.raises(GpuLeaseError, match="no slot on 1 GPU"):
        lease_slots(1, tmp_path, WHOLE, timeout=0)
    a.release()
    assert lease_slots(1, tmp_path, WHOLE, timeout=1).gpus == a.gpus


@pytest.mark.unit
def test_workers_share_each_gpu_up_to_its_slots(tmp_path: Path) -> None:
    # Four "workers" (threads, each with its own lock files) lease at once on two GPUs with two slots each:
    # all four hold a slot together, two per GPU, and a fifth engine finds none.
    cap = Capacity(jobs=5, gpus=("0", "1"), per_gpu=2)
    holding, done = threading.Barrier(5), threading.Event()
    got: list[tuple[str, ...]] = []

    def worker() -> None:
        lease = lease_slots(1, tmp_path, cap, timeout=30)
        got.append(lease.gpus)
        holding.wait(timeout=30)
        done.wait(timeout=30)
        lease.release()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    holding.wait(timeout=30)
    assert sorted(got) == [("0",), ("0",), ("1",), ("1",)]
    with pytest.raises(GpuLeaseError, match=r"no slot on 1 GPU\(s\) among 0,1 \(2 engine\(s\) per GPU, 5 at once\)"):
        lease_slots(1, tmp_path, cap, timeout=0)
    done.set()
    for t in threads:
        t.join(timeout=30)
    assert lease_slots(2, tmp_path, cap, timeout=0).gpus == ("0", "1")  # all released


@pytest.mark.unit
def test_tp2_takes_a_slot_on_two_gpus_and_the_least_loaded_go_first(tmp_path: Path) -> None:
    cap = Capacity(jobs=4, gpus=("0", "1"), per_gpu=2)
    a = lease_slots(1, tmp_path, cap, timeout=0)
    tp2 = lease_slots(2, tmp_path, cap, timeout=0)
    c = lease_slots(1, tmp_path, cap, timeout=0)
    assert (a.gpus, tp2.gpus, c.gpus) == (("0",), ("0", "1"), ("1",))  # spread before stacking
    with pytest.raises(GpuLeaseError):
        lease_slots(2, tmp_path, cap, timeout=0)  # both GPUs full; a job is still free
    a.release()
    with pytest.raises(GpuLeaseError):
        lease_slots(2, tmp_path, cap, timeout=0)  # GPU 1 is still full: a TP=2 engine needs a slot on each
    assert lease_slots(1, tmp_path, cap, timeout=0).gpus == ("0",)


@pytest.mark.unit
def test_jobs_bound_the_engines_whatever_the_free_gpu_slots(tmp_path: Path) -> None:
    cap = Capacity(jobs=2, gpus=("0", "1"), per_gpu=4)
    held = [lease_slots(1, tmp_path, cap, timeout=0) for _ in range(2)]
    with pytest.raises(GpuLeaseError, match="2 at once"):
        lease_slots(1, tmp_path, cap, timeout=0)
    held[0].release()
    assert lease_slots(1, tmp_path, cap, timeout=0).gpus == ("0",)


@pytest.mark.unit
def test_startup_locks_make_start_ups_on_a_gpu_take_turns(tmp_path: Path) -> None:
    first = hold_startup(tmp_path, ("0", "1"), timeout=0)  # a TP=2 engine starting on GPUs 0 and 1
    with pytest.raises(GpuLeaseError, match="GPU 1's start-up lock was not free"):
        hold_startup(tmp_path, ("1",), timeout=0)
    assert hold_startup(tmp_path, ("2",), timeout=0).gpus == ("2",)  # another GPU starts meanwhile
    first.release()  # ready
    assert hold_startup(tmp_path, ("1",), timeout=0).gpus == ("1",)
    assert hold_startup(tmp_path / "unused", (), timeout=0).gpus == ()
    assert not (tmp_path / "unused").exists()  # nothing to lock: no folder


def _hold(lock_dir: str, q: mp.Queue, go: mp.Event) -> None:  # type: ignore[type-arg]
    lease = lease_slots(1, Path(lock_dir), Capacity(jobs=2, gpus=("0", "1"), per_gpu=1), timeout=5)
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
        lease_slots(1, tmp_path, Capacity(jobs=2, gpus=("0", "1"), per_gpu=1), timeout=0.6)
    go.set()
    for p in procs:
        p.join(10)


@pytest.mark.unit
def test_more_gpus_than_visible_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(GpuLeaseError, match="needs 2 GPUs but only 1 are visible"):
        lease_slots(2, tmp_path, Capacity(jobs=1, gpus=("0",), per_gpu=1), timeout=100)


@pytest.mark.unit
def test_a_lease_alone_holds_every_slot_of_an_unused_gpu(tmp_path: Path) -> None:
    cap = Capacity(jobs=5, gpus=("0", "1"), per_gpu=2)
    a = lease_slots(1, tmp_path, cap, timeout=1)
    alone = lease_slots(1, tmp_path, cap, timeout=1, alone=True)
    assert alone.gpus != a.gpus  # a's GPU has an engine on it
    assert lease_slots(1, tmp_path, cap, timeout=1).gpus == a.gpus  # nothing else goes on the lone engine's GPU
    with pytest.raises(GpuLeaseError, match="no free GPU on 1 GPU"):
        lease_slots(1, tmp_path, cap, timeout=0, alone=True)
    alone.release()
    assert lease_slots(1, tmp_path, cap, timeout=1, alone=True).gpus == alone.gpus
