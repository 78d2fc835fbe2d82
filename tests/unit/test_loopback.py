"""Loopback only (issue 35): the socket checker sees a listener on every interface, and repro.patches.bind narrows a
master TCPStore to the bind address."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.run.sockets import Listener, exposed, group_pids, listeners, tree_pids
from repro.patches import bind

pytestmark = pytest.mark.unit


@pytest.fixture
def open_sockets() -> Iterator[list[socket.socket]]:
    made: list[socket.socket] = []
    yield made
    for s in made:
        s.close()


def _listen(made: list[socket.socket], family: int, addr: str, kind: int = socket.SOCK_STREAM) -> int:
    s = socket.socket(family, kind)
    made.append(s)
    s.bind((addr, 0))
    if kind == socket.SOCK_STREAM:
        s.listen()
    return int(s.getsockname()[1])


def test_the_checker_fails_on_a_listener_on_every_interface(open_sockets: list[socket.socket]) -> None:
    wild = _listen(open_sockets, socket.AF_INET, "0.0.0.0")
    local = _listen(open_sockets, socket.AF_INET, "127.0.0.1")
    found = listeners([os.getpid()])
    assert {(s.address, s.port) for s in found} >= {("0.0.0.0", wild), ("127.0.0.1", local)}
    bad = exposed(found)
    assert [(s.address, s.port) for s in bad if s.port in (wild, local)] == [("0.0.0.0", wild)]
    assert "tcp 0.0.0.0:" in str(bad[0]) and f"pid {os.getpid()}" in str(bad[0])


def test_the_checker_reads_ipv6_and_udp(open_sockets: list[socket.socket]) -> None:
    if not socket.has_ipv6 or not Path("/proc/net/tcp6").exists():
        pytest.skip("no IPv6 on this machine")
    v6 = _listen(open_sockets, socket.AF_INET6, "::")
    v6_local = _listen(open_sockets, socket.AF_INET6, "::1")
    udp = _listen(open_sockets, socket.AF_INET, "0.0.0.0", socket.SOCK_DGRAM)
    bad = {(s.proto, s.port) for s in exposed(listeners([os.getpid()]))}
    assert ("tcp6", v6) in bad and ("udp", udp) in bad
    assert ("tcp6", v6_local) not in bad


def test_an_empty_run_has_nothing_exposed_and_mapped_loopback_counts() -> None:
    assert exposed([]) == []
    assert Listener(1, "tcp6", "::ffff:127.0.0.1", 80, "x").loopback
    assert not Listener(1, "tcp6", "::ffff:10.0.0.1", 80, "x").loopback


def test_process_lookups_find_this_process() -> None:
    assert os.getpid() in group_pids(os.getpgid(0))
    assert tree_pids(os.getppid())[:1] == [os.getppid()] and os.getpid() in tree_pids(os.getppid())


class FakeStore:
    """Stands in for torch's TCPStore: records its arguments and, as the real one, owns the listen fd."""

    def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                 **kwargs: Any) -> None:
        self.host_name, self.port, self.is_master, self.kwargs = host_name, port, is_master, kwargs
        fd = kwargs.get("master_listen_fd")
        self.sock = socket.socket(fileno=fd) if fd is not None else None


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state: dict[str, Any] = {"address": None, "env": {}, "kept": {}, "prebound": [], "left": [], "problems": []}
    monkeypatch.setattr(bind, "STATE", state)
    monkeypatch.delenv(bind.ENV_BIND, raising=False)
    return state


def test_a_master_store_listens_on_the_bind_address_only(fresh_state: dict[str, Any]) -> None:
    make = bind._wrap(FakeStore, "torch.distributed.rendezvous")
    store = make("127.0.0.1", 0, 1, True, multi_tenant=True)  # positional, as torch's rendezvous mixes them
    try:
        assert store.sock is not None and store.sock.getsockname()[0] == "127.0.0.1"
        assert store.port == store.sock.getsockname()[1]  # port 0 (Ray v2): the real one is passed on
        assert store.kwargs["use_libuv"] is False and store.kwargs["multi_tenant"] is True
        assert fresh_state["prebound"] == [{"where": "torch.distributed.rendezvous", "address": "127.0.0.1",
                                            "port": store.port}]
    finally:
        store.sock.close()


def test_clients_stores_other_hosts_and_a_wildcard_bind_are_left_alone(
        fresh_state: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    make = bind._wrap(FakeStore, "vllm.v1.executor.ray_executor_v2")
    assert make("127.0.0.1", 1234, 2, False).sock is None  # a client binds nothing
    assert make(host_name="10.1.2.3", port=0, is_master=True).sock is None  # Ray's node IP: clients go there
    assert fresh_state["left"][0]["host"] == "10.1.2.3"
    monkeypatch.setenv(bind.ENV_BIND, "0.0.0.0")
    assert make("127.0.0.1", 0, 1, True).sock is None  # the user asked for every interface


def test_patch_module_wraps_once(fresh_state: dict[str, Any]) -> None:
    class Module:
        __name__ = "torch.distributed.rendezvous"
        TCPStore = FakeStore

    bind.patch_module(Module)
    wrapped = Module.TCPStore
    bind.patch_module(Module)
    assert Module.TCPStore is wrapped and wrapped is not FakeStore


def test_bind_env_points_vllm_gloo_and_nccl_at_loopback_and_keeps_the_users_choice(tmp_path: Path) -> None:
    env, kept = bind.bind_env("127.0.0.1", {"NCCL_SOCKET_IFNAME": "ib0"})
    lo = bind.loopback_interface()
    assert env == {"VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": lo}
    assert kept == {"NCCL_SOCKET_IFNAME": "ib0"}
    assert bind.bind_env("0.0.0.0", {}) == ({}, {})
    assert bind.bind_env("10.0.0.5", {}) == ({"VLLM_HOST_IP": "10.0.0.5", "VLLM_LOOPBACK_IP": "10.0.0.5"}, {})
    (tmp_path / "eth0").mkdir()
    (tmp_path / "eth0" / "flags").write_text("0x1003\n")
    (tmp_path / "lo9").mkdir()
    (tmp_path / "lo9" / "flags").write_text("0x9\n")
    assert bind.loopback_interface(tmp_path) == "lo9"


def test_a_ray_executor_keeps_its_own_node_address(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's Ray executors find the driver's node by comparing get_ip() (VLLM_HOST_IP) with Ray's node IP.
    from repro.patches import bind

    for var in bind.BIND_VARS:
        monkeypatch.delenv(var, raising=False)
    bind.apply_env("ray-v2")
    assert all(var not in os.environ for var in bind.BIND_VARS) and "Ray" in bind.STATE["env_skipped"]
    bind.apply_env("mp")
    assert os.environ.get("VLLM_HOST_IP") == bind.address()
