"""The client door for SkyRL (issue 36): its SkyrlWeightSyncClient built as SkyRL builds it, its reset made by its
own client with its own arguments, its Python found (>= 3.12) or its cells UNSUPPORTED saying why."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.core.oracle import Outcome
from harness.envbuild import client_python as cp
from repro.client.clients import CLIENTS, Client
from repro.client.door import ClientLLM, precondition
from repro.scenarios.vocab import ScenarioUnsupported

pytestmark = pytest.mark.unit

SKYRL = CLIENTS["skyrl"]
TRL = CLIENTS["trl"]
CORE_ASYNC = {"core": {"async_scheduling": True,
                       "scheduler_class": "vllm.v1.core.sched.async_scheduler.AsyncScheduler"}}
HELD = [{"rid": "r0", "pauses": [{"k": 0, "frozen": True, "engine_tokens": 6}]}]
CALLS = [{"ok": True, "method": "pause_generation"}, {"ok": True, "method": "reset_prefix_cache"},
         {"ok": True, "method": "resume_generation"}]
LOG = ('INFO:     127.0.0.1:4002 - "POST /pause?mode=keep&clear_cache=false HTTP/1.1" 200 OK\n'
       'INFO:     127.0.0.1:4003 - "POST /reset_prefix_cache HTTP/1.1" 200 OK\n'
       'INFO:     127.0.0.1:4004 - "POST /resume HTTP/1.1" 200 OK\n')


class _Side:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def call(self, method: str, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        self.sent.append((method, dict(kwargs or {})))
        return {"ok": True, "method": method}


class _Http:
    def __init__(self) -> None:
        self.resets: list[bool] = []

    def require(self, *_: Any) -> None:
        pass

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.resets.append(reset_running_requests)
        return True


class _Built:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


def test_skyrl_client_is_built_as_skyrl_builds_it() -> None:
    built = SKYRL.construct(_Built, "http://127.0.0.1:8000")
    assert built.kwargs == {"server_urls": ["http://127.0.0.1:8000"], "data_parallel_size": 1} and not built.args
    assert TRL.construct(_Built, "http://x").args == ("http://x",)  # no template: cls(url)
    assert SKYRL.kwargs("reset_prefix_cache") == {"reset_running_requests": True} and SKYRL.kwargs("x") == {}
    assert SKYRL.requires_python == ">=3.12"


def test_the_reset_is_skyrls_own_call_with_its_own_arguments(tmp_path: Path) -> None:
    side, http = _Side(), _Http()
    llm = ClientLLM(http, SKYRL, side, {"version": "0.4.0"}, tmp_path / "server.log")  # type: ignore[arg-type]
    asyncio.run(llm.pause_generation(mode="keep", clear_cache=False))
    assert asyncio.run(llm.reset_prefix_cache(reset_running_requests=True)) is True
    asyncio.run(llm.resume_generation())
    assert side.sent == [("pause_generation", {}), ("reset_prefix_cache", {"reset_running_requests": True}),
                         ("resume_generation", {})] and not http.resets
    with pytest.raises(ScenarioUnsupported, match="reset_running_requests=True; this cell asks False"):
        asyncio.run(llm.reset_prefix_cache(reset_running_requests=False))
    with pytest.raises(ScenarioUnsupported, match="clear_cache=true"):  # SkyRL never clears at the pause
        asyncio.run(llm.pause_generation(mode="keep", clear_cache=True))
    trl = ClientLLM(http, TRL, _Side(), {}, tmp_path / "server.log")  # type: ignore[arg-type]
    assert asyncio.run(trl.reset_prefix_cache(reset_running_requests=True)) and http.resets == [True]


def test_skyrl_precondition_reads_its_pause_in_the_access_log() -> None:
    met = precondition(SKYRL, HELD, CALLS, LOG, CORE_ASYNC)
    assert met["met"], met
    doubled = LOG + 'INFO:     127.0.0.1:4005 - "POST /pause?mode=keep&clear_cache=true HTTP/1.1" 200 OK\n'
    unmet = precondition(SKYRL, HELD, CALLS, doubled, CORE_ASYNC)
    assert not unmet["met"] and "the client did not make" in unmet["what"]


def test_side_process_passes_the_kwargs_and_builds_from_the_template(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.client import side

    made: list[Any] = []

    class Fw:
        def __init__(self, **kwargs: Any) -> None:
            made.append(kwargs)

        def reset_prefix_cache(self, reset_running_requests: bool = False) -> None:
            made.append(reset_running_requests)
    fake = Client("fw", "fwpkg", "m", "Fw", (), (("reset_prefix_cache", "reset_prefix_cache"),), "keep", False,
                  "", "", init='{"server_urls": ["$URL"]}')
    monkeypatch.setattr(side, "CLIENTS", {"fw": fake})
    monkeypatch.setattr(side, "load", lambda c: (Fw, {"framework": "fw"}))
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(
        {"method": "reset_prefix_cache", "kwargs": {"reset_running_requests": True}}) + "\n"))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    assert side.main(["fw", "http://u"]) == 0
    ready, answer = (json.loads(ln) for ln in out.getvalue().splitlines())
    assert ready["ready"] and answer["ok"] and made == [{"server_urls": ["http://u"]}, True]


def test_find_python_takes_the_first_that_fits_and_passes_over_what_does_not_run() -> None:
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = cp.find_python(f">={here}", "", tried=["/nonexistent/python", sys.executable])
    assert found is not None and found.version.startswith(here)
    assert cp.find_python(">=99", "", tried=["/nonexistent/python", sys.executable]) is None


def test_pyenv_versions_are_tried_oldest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for v in ("3.13.0", "3.12.1", "3.9.18"):
        (tmp_path / "versions" / v / "bin").mkdir(parents=True)
        (tmp_path / "versions" / v / "bin" / "python3").write_text("")
    monkeypatch.setattr(cp.shutil, "which", lambda name: "/bin/pyenv" if name == "pyenv" else None)
    monkeypatch.setattr(cp, "_run", lambda cmd: str(tmp_path) if cmd[-1] == "root" else "")
    got = [Path(p).parent.parent.name for p in cp._pyenv_pythons()]
    assert got == ["3.9.18", "3.12.1", "3.13.0"]


def test_no_fitting_python_leaves_the_cells_unsupported_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from harness.core.cell import Cell
    from harness.frontends.commands.fwclient import error_results, install_client, matrix_client

    monkeypatch.setattr(cp, "find_python", lambda *_: None)
    ctx = SimpleNamespace(python="3.11", index=None, cache=Path("/nonexistent"))
    setup = install_client(ctx, SKYRL, None)  # type: ignore[arg-type]
    assert setup.env is None and setup.unsupported and "skyrl needs Python >=3.12" in setup.error
    (res,) = error_results(setup, [Cell(version="0.21.0", door="client"), Cell(version="0.21.0")])
    assert res.outcome is Outcome.UNSUPPORTED and "no such interpreter found" in res.reason
    assert setup.lines()[0].startswith("client door: skyrl: UNSUPPORTED: skyrl needs Python >=3.12")
    spec = matrix_client(ctx, "skyrl")  # type: ignore[arg-type]
    assert spec["unsupported"] == "true" and "no such interpreter" in spec["error"]


def test_an_unsupported_spec_client_is_unsupported_in_the_engine_process(tmp_path: Path) -> None:
    from repro.client.door import ClientUnavailable, open_client

    with pytest.raises(ClientUnavailable) as exc:
        open_client(_Http(), {"framework": "skyrl", "error": "skyrl needs Python >=3.12", "unsupported": "true"},  # type: ignore[arg-type]
                    "http://x", tmp_path)
    assert exc.value.unsupported
