"""Per-engine port blocks (harness.run.ports): where they lie, and that a lease is exclusive until released."""

from __future__ import annotations

import itertools
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.run.ports import (
    BLOCK,
    POOL_START,
    PortLease,
    PortLeaseError,
    blocks,
    ephemeral_range,
    lease_ports,
    lock_dir,
)

pytestmark = pytest.mark.unit


def test_blocks_lie_outside_the_ephemeral_range_and_clear_of_reserved_ports() -> None:
    got = blocks((32768, 60999), environ={})
    assert got[0] == range(POOL_START, POOL_START + BLOCK)
    assert all(b.stop <= 32768 or b.start > 60999 for b in got)
    assert not any(29500 in b for b in got)  # torch's MASTER_PORT default, vLLM's data_parallel_master_port
    assert any(b.start > 60999 for b in got)  # above the ephemeral range too
    assert all(len(b) == BLOCK for b in got)


def test_a_data_parallel_master_port_in_the_env_is_avoided() -> None:
    assert not any(21010 in b or 21019 in b for b in blocks((32768, 60999), environ={"VLLM_DP_MASTER_PORT": "21010"}))


def test_an_ephemeral_range_over_everything_still_gives_disjoint_blocks() -> None:
    got = blocks((1024, 65535), environ={})
    assert len(got) > 100
    assert all(a.stop <= b.start for a, b in itertools.pairwise(got))


def test_ephemeral_range_falls_back_to_linux_default(tmp_path: Path) -> None:
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
    (tmp_path / "r").write_text("40000\t50000\n")
    assert ephemeral_range(tmp_path / "r") == (40000, 50000)


def test_lock_dir_is_machine_wide_unless_overridden(tmp_path: Path) -> None:
    assert lock_dir({}).name == "vllm-repro-ports"
    assert lock_dir({"VLLM_REPRO_PORT_LOCKS": str(tmp_path)}) == tmp_path


def test_threads_leasing_at_once_get_disjoint_blocks_until_released(tmp_path: Path) -> None:
    barrier = threading.Barrier(8)

    def lease(_: int) -> PortLease:
        barrier.wait()
        return lease_ports(tmp_path)

    with ThreadPoolExecutor(8) as pool:
        leases = list(pool.map(lease, range(8)))
    assert len({lz.lo for lz in leases}) == 8
    first = min(leases, key=lambda lz: lz.lo)
    first.release()
    first.release()  # idempotent: no second close of a reused fd
    again = lease_ports(tmp_path)
    assert again.lo == first.lo
    assert again.env == {"VLLM_PORT": str(again.lo), "VLLM_REPRO_PORT_RANGE": f"{again.lo}-{again.lo + BLOCK}"}
    for lz in [again, *leases]:
        lz.release()


def test_a_block_with_a_port_in_use_is_skipped(tmp_path: Path) -> None:
    probe = lease_ports(tmp_path)
    probe.release()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", probe.lo + BLOCK - 1))  # someone else's listener at the end of the first free block
        s.listen()
        lease = lease_ports(tmp_path)
        lease.release()
    assert lease.lo >= probe.hi


def test_no_block_left_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.run.ports.blocks", lambda *a, **k: [range(POOL_START, POOL_START + BLOCK)])
    # The one block is free as far as the test knows, whatever an engine of a suite running beside it holds.
    monkeypatch.setattr("harness.run.ports._bindable", lambda port: True)
    held = lease_ports(tmp_path)
    try:
        with pytest.raises(PortLeaseError, match="no free block of 32 ports"):
            lease_ports(tmp_path)
    finally:
        held.release()


def test_the_weight_sync_trainer_port_is_the_top_free_one_of_the_engines_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.scenarios.weight_transfer import _free_port

    lease = lease_ports(tmp_path)
    try:
        monkeypatch.setenv("VLLM_REPRO_PORT_RANGE", f"{lease.lo}-{lease.hi}")
        assert _free_port() == lease.hi - 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", lease.hi - 1))
            assert _free_port() == lease.hi - 2
        monkeypatch.delenv("VLLM_REPRO_PORT_RANGE")
        assert _free_port() > 0  # no block: the kernel's pick
    finally:
        lease.release()
