"""vLLM 0.34.0's engine checkpoint through the server door's HTTP adapter (issue 33 item 4: "through the server door
too where the HTTP API exposes them"), without vLLM: a fake server answers the checkpoint routes as
``vllm/entrypoints/serve/checkpoint/api_router.py`` (0.34.0 wheel) does, over the checkpoint tests' fake engine.
What is checked is what goes over the wire: prepare with the mode as a query parameter, status polled until 200,
the refused POST /resume (500), the reload through POST /collective_rpc, restore; and releases before 0.34.0 have no
such route (UNSUPPORTED before anything runs)."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from fake_engine import SP
from test_checkpoint_scenario import CheckpointLLM
from test_profile_scenarios import _ctx, model  # noqa: F401 -- the module-scoped checkpoint fixture
from test_server_weight_sync import URL, FakeServer, _Resp

import repro.scenarios.runs as runs
from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from repro.scenarios import RUNNERS
from repro.server import endpoints as ep
from repro.server.http_llm import HttpLLM

pytestmark = pytest.mark.unit


class CheckpointServer(FakeServer):
    """The 0.34.0 checkpoint routes (state in every body; status 200 prepared / 503 before / 500 failed), and
    POST /resume answering 500 when the engine refuses, as ``rl/online/api_router.py`` does."""

    async def post(self, url: str, params: Any = None, json: Any = None, timeout: Any = None) -> _Resp:
        path, e = url.removeprefix(URL), self.engine
        if path == "/checkpoint/prepare":
            self.calls.append((path, params, json))
            refusal = await e.checkpoint_prepare(params["mode"])
            state, _ = await e.checkpoint_state()
            return _Resp({"state": state, "error": refusal}, 400) if refusal else _Resp({"state": state})
        if path == "/checkpoint/restore":
            self.calls.append((path, params, json))
            await e.checkpoint_restore()
            return _Resp({"state": (await e.checkpoint_state())[0]})
        if path == "/resume":
            try:
                return await super().post(url, params, json, timeout)
            except Exception as exc:
                return _Resp({"error": f"Failed to resume generation: {exc}"}, 500)
        return await super().post(url, params, json, timeout)

    async def get(self, url: str, timeout: Any = None) -> _Resp:
        assert url.removeprefix(URL) == "/checkpoint/status"
        state, err = await self.engine.checkpoint_state()
        return _Resp({"state": state, **({"error": err} if err else {})},
                     200 if state == "prepared" else 500 if state == "failed" else 503)


def _play(version: str, model: dict[str, Any], tmp_path: Path,  # noqa: F811
          monkeypatch: pytest.MonkeyPatch) -> tuple[CheckpointServer, dict[str, Any], HttpLLM]:
    monkeypatch.setattr(runs, "_vllm_api", lambda: (SP, "DELTA"))
    monkeypatch.setitem(sys.modules, "httpx", types.SimpleNamespace(HTTPError=type("HTTPError", (Exception,), {})))
    server = CheckpointServer(CheckpointLLM(model["perm"]))  # type: ignore[arg-type]
    llm = HttpLLM(server, URL, version, "/m")  # type: ignore[arg-type]
    sc = {"id": "checkpoint-keep-clear-server", "scenario": "checkpoint", "seed": 7,
          "params": {"mode": "keep", "clear_cache": True, "max_tokens": 24, "pause_after": 6}}
    return server, asyncio.run(RUNNERS["checkpoint"](llm, sc, _ctx(model, tmp_path), 30)), llm


def test_the_checkpoint_runs_over_its_http_routes(model: dict[str, Any], tmp_path: Path,  # noqa: F811
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert ep.scenario_problem("checkpoint", "0.34.0", {"mode": "keep"}) is None
    server, out, _ = _play("0.34.0", model, tmp_path, monkeypatch)
    posts = [(p, q, (b or {}).get("method")) for p, q, b in server.calls if not p.startswith(("/repro/", "/v1/"))]
    assert posts == [("/collective_rpc", None, "repro_worker_probe"),  # can its workers reload in place
                     ("/checkpoint/prepare", {"mode": "keep"}, None), ("/resume", None, None),
                     ("/collective_rpc", None, "reload_weights"), ("/checkpoint/restore", None, None)]
    (enter,) = [e for e in out["events"] if e["event"] == "pause_enter"]
    assert "Cannot resume scheduling" in enter["resume_refused"]  # the 500 of POST /resume
    assert cell_verdict(stream_records(out["records"])).outcome is Outcome.OK


def test_before_0_34_0_the_server_has_no_checkpoint_route() -> None:
    why = ep.scenario_problem("checkpoint", "0.33.0", {"mode": "keep"})
    assert why is not None and "checkpoint" in why
