"""Tests of AReaL's client door (issue 36): its own server entry point runs as vLLM's server, the door POSTs its
routes, and the cell is judged only when an abort pause ended requests in flight, the access log shows exactly its
routes, and EngineCore logged the prefix-cache reset its pause asks (never the network, no engine)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.envbuild import client_env as ce
from repro.client.clients import CLIENTS, standins
from repro.client.door import ClientLLM, ClientUnavailable, open_client, precondition
from repro.scenarios.vocab import ScenarioUnsupported
from repro.server.http_llm import ServerError

pytestmark = pytest.mark.unit

AREAL = CLIENTS["areal"]
CORE_ASYNC = {"core": {"async_scheduling": True,
                       "scheduler_class": "vllm.v1.core.sched.async_scheduler.AsyncScheduler"}}
ABORTED = [{"rid": "r0", "finish_reason": "abort", "pauses": [{"k": 0, "mode": "abort", "frozen": False}]},
           {"rid": "r1", "finish_reason": "length", "pauses": []}]
CALLS = [{"ok": True, "method": "/areal_pause_generation"}, {"ok": True, "method": "/areal_continue_generation"}]
RESET = "(EngineCore pid=1) INFO 12-04 17:55:06 [block_pool.py:471] Successfully reset prefix cache\n"
LOG = ('INFO:     127.0.0.1:4001 - "POST /v1/completions HTTP/1.1" 200 OK\n' + RESET
       + 'INFO:     127.0.0.1:4002 - "POST /areal_pause_generation HTTP/1.1" 200 OK\n'
       'INFO:     127.0.0.1:4003 - "POST /areal_continue_generation HTTP/1.1" 200 OK\n')
ROUTES = ("INFO [launcher.py:46] Route: /areal_pause_generation, Methods: POST\n"
          "INFO [launcher.py:46] Route: /areal_continue_generation, Methods: POST\n")


def test_an_abort_pause_that_ended_requests_in_flight_is_judged() -> None:
    pre = precondition(AREAL, ABORTED, CALLS, LOG, CORE_ASYNC, "areal 1.0.4")
    assert pre["met"], pre["what"]
    assert "1 request(s) in flight" in pre["what"] and "1x 'Successfully reset prefix cache'" in pre["what"]


@pytest.mark.parametrize(("records", "log", "says"), [
    # Nothing was aborted by the pause: the pause met no request in flight.
    ([{**ABORTED[0], "finish_reason": "length"}], LOG, "no request was in flight"),
    # EngineCore never reset the cache: AReaL's clear_cache=True did not reach the engine.
    (ABORTED, LOG.replace(RESET, ""), "0x 'Successfully reset prefix cache'"),
    # A reset nobody asked for beside it: one per pause, no more.
    (ABORTED, LOG + RESET, "2x 'Successfully reset prefix cache'"),
    # vLLM's own /pause reached the server besides AReaL's route.
    (ABORTED, LOG + 'INFO: - "POST /pause?mode=abort&clear_cache=true HTTP/1.1" 200 OK\n',
     "requests the client did not make: {'pause': 1, 'resume': 0}"),
    # AReaL's route answered but the access log does not show it (another server's log).
    (ABORTED, LOG.replace("/areal_continue_generation", "/resume"), "the access log shows 1x"),
])
def test_the_areal_precondition_unmet(records: list[dict[str, Any]], log: str, says: str) -> None:
    pre = precondition(AREAL, records, CALLS, log, CORE_ASYNC)
    assert not pre["met"] and pre["strict"] and says in pre["what"], pre["what"]


class _Http:
    def __init__(self, fail: str = "") -> None:
        self.posted: list[tuple[str, Any]] = []
        self.fail = fail

    def require(self, *_: Any) -> None:
        raise AssertionError("AReaL's routes are its own, not vLLM's /pause: nothing to require")

    async def post(self, path: str, params: Any = None, body: Any = None) -> Any:
        self.posted.append((path, body))
        if path == self.fail:
            raise ServerError(f"POST {path}: HTTP 500: boom")
        return {"success": True}


def test_the_door_posts_areals_routes_with_its_clients_body(tmp_path: Path) -> None:
    (tmp_path / "server.log").write_text(ROUTES)
    http = _Http(fail="/areal_continue_generation")
    llm = open_client(http, {"framework": "areal", "version": "1.0.4", "python": "py",  # type: ignore[arg-type]
                             "server_main": "/e/areal_vllm_server.py"}, "http://x", tmp_path)
    assert isinstance(llm, ClientLLM) and llm.side is None
    assert llm.facts["routes_registered"] == ["/areal_pause_generation", "/areal_continue_generation"]
    asyncio.run(llm.pause_generation(mode="abort", clear_cache=True))
    assert http.posted == [("/areal_pause_generation", {})] and llm.calls[0]["ok"]
    with pytest.raises(ScenarioUnsupported, match=r"sends .*areal_pause_generation.*asks mode=keep"):
        asyncio.run(llm.pause_generation(mode="keep", clear_cache=True))
    with pytest.raises(RuntimeError, match=r"POST /areal_continue_generation raised: .*HTTP 500"):
        asyncio.run(llm.resume_generation())


def test_a_server_without_areals_routes_is_no_areal_door(tmp_path: Path) -> None:
    (tmp_path / "server.log").write_text(ROUTES.splitlines()[0] + "\n")
    with pytest.raises(ClientUnavailable, match="route table has no /areal_continue_generation") as exc:
        open_client(_Http(), {"framework": "areal", "version": "1.0.4", "python": "py"},  # type: ignore[arg-type]
                    "http://x", tmp_path)
    assert not exc.value.unsupported


def test_the_server_runs_the_frameworks_file_by_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import repro.server.serve_process as sp

    argv: list[list[str]] = []

    def popen(cmd: list[str], **_: Any) -> Any:
        argv.append(cmd)
        return object()
    monkeypatch.setattr(sp.subprocess, "Popen", popen)
    sp.Server.start("vllm.entrypoints.openai.api_server", ["--port", "9"], 9, tmp_path / "a.log", script="/e/s.py")
    sp.Server.start("vllm.entrypoints.openai.api_server", ["--port", "9"], 9, tmp_path / "b.log")
    assert argv[0][1:] == ["/e/s.py", "--port", "9"]
    assert argv[1][1:] == ["-m", "vllm.entrypoints.openai.api_server", "--port", "9"]


def test_the_side_env_carries_the_server_entry_point_or_refuses(tmp_path: Path) -> None:
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    assert ce.server_main(CLIENTS["trl"], tmp_path) == ""
    with pytest.raises(ce.ClientEnvError, match=r"has no areal/engine/vllm_ext/areal_vllm_server.py"):
        ce.server_main(AREAL, tmp_path)
    (site / AREAL.server_main).parent.mkdir(parents=True)
    (site / AREAL.server_main).write_text("")
    assert ce.server_main(AREAL, tmp_path) == str(site / AREAL.server_main)
    env = ce.ClientEnv("areal", "1.0.4", "py", tmp_path, str(site / AREAL.server_main))
    assert env.to_spec()["server_main"].endswith("areal_vllm_server.py")
    assert "server_main" not in ce.ClientEnv("trl", "1.16.0", "py", tmp_path).to_spec()


def test_an_areal_that_fails_to_install_makes_its_cells_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.core.cell import Cell
    from harness.core.oracle import Outcome
    from harness.frontends.commands.fwclient import ClientSetup, error_results

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        failed = "install" in cmd
        return subprocess.CompletedProcess(cmd, int(failed), "", "  x No solution: areal==1.0.4" if failed else "")
    monkeypatch.setattr(ce.subprocess, "run", run)
    monkeypatch.setattr(ce, "uv_bin", lambda: "uv")
    with pytest.raises(ce.ClientEnvError, match=r"installing areal==1.0.4 failed: x No solution") as exc:
        ce.ensure_client_env(AREAL, "1.0.4", tmp_path, "3.11", ce.IndexConfig(), "3.11.7")
    setup = ClientSetup(AREAL, None, (str(exc.value),))
    (res,) = error_results(setup, [Cell(version="0.21.0", door="client", mode="abort"), Cell(version="0.21.0")])
    assert res.outcome is Outcome.ERROR and "installing areal==1.0.4 failed: x No solution" in res.reason


def test_areals_standin_is_the_package_never_imported() -> None:
    (s,) = standins("areal")
    assert s.kind == "not-imported" and "areal_vllm_server.py whole" in s.unchanged
