"""The weight-sync scenario through the server door's HTTP adapter, without vLLM or a process (issue 22).

The scenario's own code drives ``repro.server.http_llm.HttpLLM``; a fake HTTP client answers each request the
way ``vllm serve`` routes it (``/v1/completions`` as an SSE stream, ``/pause``, ``/resume``, ``/collective_rpc``,
the harness's ``/repro/utility/*``) by calling the weight-sync tests' fake AsyncLLM.  So what is checked is what
goes over the wire: the swap is ``POST /collective_rpc`` with ``reload_weights`` and B's folder, sent between
the keep pause and the resume, A's folder after; #42043 on the fake shows as the same LOSS(1) the engine door
sees.  Plus the server door's per-release and per-parameter data, and ``auto`` transfer on the server door.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_weight_sync_scenario import _SP, FakeLLM, _ctx, checkpoints  # noqa: F401 - checkpoints is a fixture

import repro.scenarios.runs as runs
from harness.core.cell import Cell
from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from harness.run.spec import RunConfig, weight_transfer
from repro.scenarios import rlhf_weight_sync
from repro.server import endpoints as ep
from repro.server.http_llm import HttpLLM, ServerError

pytestmark = pytest.mark.unit
URL = "http://127.0.0.1:9"


class _Resp:
    def __init__(self, doc: Any, status: int = 200) -> None:
        self.status_code, self.doc = status, doc
        self.text = "" if doc is None else json.dumps(doc)

    def json(self) -> Any:
        if self.doc is None:
            raise ValueError("no body")
        return self.doc


class _Stream:
    """A completion stream: the fake engine's DELTA outputs as ``vllm serve``'s SSE chunks."""

    def __init__(self, outs: AsyncIterator[Any]) -> None:
        self.status_code, self.outs = 200, outs

    async def aiter_lines(self) -> AsyncIterator[str]:
        async for out in self.outs:
            c = out.outputs[0]
            yield "data: " + json.dumps({"choices": [{"text": "", "token_ids": c.token_ids,
                                                      "finish_reason": c.finish_reason}]})
            yield ""
        yield "data: [DONE]"

    async def aread(self) -> bytes:
        return b""

    async def aclose(self) -> None:
        return None


class FakeServer:
    """The routes of a ``vllm serve`` in dev mode over ``engine`` (an AsyncLLM-like fake); logs every POST."""

    def __init__(self, engine: FakeLLM) -> None:
        self.engine = engine
        self.calls: list[tuple[str, Any, Any]] = []

    async def post(self, url: str, params: Any = None, json: Any = None, timeout: Any = None) -> _Resp:
        path = url.removeprefix(URL)
        self.calls.append((path, params, json))
        e = self.engine
        if path == "/pause":
            await e.pause_generation(mode=params["mode"], clear_cache=params["clear_cache"] == "true")
            return _Resp({})
        if path == "/resume":
            await e.resume_generation()
            return _Resp(None)
        if path == "/collective_rpc":
            return _Resp({"results": await e.collective_rpc(json["method"], kwargs=json["kwargs"])})
        if path.startswith("/repro/utility/"):
            got = await e.call_utility_async(path.rsplit("/", 1)[1])
            return _Resp({"result": {f"cmpl-{k}": v for k, v in got.items()}})  # the engine core's names
        return _Resp({"detail": "Not Found"}, 404)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, json: Any = None, timeout: Any = None) -> AsyncIterator[_Stream]:
        assert (method, url.removeprefix(URL)) == ("POST", "/v1/completions") and json["return_token_ids"]
        sp = _SP(json["temperature"], json["max_tokens"], json["ignore_eos"], "DELTA", False)
        yield _Stream(self.engine.generate({"prompt_token_ids": json["prompt"]}, sp, json["request_id"]))


def _play_over_http(engine: FakeLLM, ck: dict[str, Any], tmp_path: Path, params: dict[str, Any],
                    monkeypatch: pytest.MonkeyPatch) -> tuple[FakeServer, dict[str, Any]]:
    monkeypatch.setattr(runs, "_vllm_api", lambda: (_SP, "DELTA"))
    # httpx is in every vLLM env, not in the harness's: the adapter only names its error class.
    monkeypatch.setitem(sys.modules, "httpx", types.SimpleNamespace(HTTPError=type("HTTPError", (Exception,), {})))
    server = FakeServer(engine)
    llm = HttpLLM(server, URL, "0.21.0", "/m")  # type: ignore[arg-type]
    sc = {"id": "weight_sync-keep-clear-server", "scenario": "weight_sync", "params": params, "seed": 17}
    assert ep.scenario_problem("weight_sync", llm.version, params) is None
    return server, asyncio.run(rlhf_weight_sync.run(llm, sc, _ctx(ck, tmp_path), timeout=30))


def test_the_swap_is_reload_weights_over_collective_rpc_inside_the_keep_pause(
    checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    engine = FakeLLM(checkpoints["a"], bug=True)
    server, out = _play_over_http(engine, checkpoints, tmp_path, {"clear_cache": True, "max_tokens": 24},
                                  monkeypatch)
    verdict = cell_verdict(stream_records(out["records"]))
    assert verdict.summary == "LOSS(1) in 8/10 requests (8/8 running at pause)"
    control = [(p, q, j) for p, q, j in server.calls if p in ("/pause", "/resume", "/collective_rpc")]
    reload = [(p, q, j) for p, q, j in control if j and j["method"] == "reload_weights"]
    assert reload == [("/collective_rpc", None, {"method": "reload_weights", "args": [],
                                                 "kwargs": {"weights_path": str(checkpoints[k])}}) for k in "ba"]
    i = control.index(reload[0])
    assert control[i - 1] == ("/pause", {"mode": "keep", "clear_cache": "true"}, None)
    assert control[i + 1] == ("/resume", None, None)
    assert engine.loads == [checkpoints["b"], checkpoints["a"]]
    (action,) = [e for e in out["events"] if e["event"] == "pause_action"]
    assert action["via"] == "POST /collective_rpc" and action["checkpoint"] == str(checkpoints["b"])
    assert out["weight_sync"]["restore"]["verified"] is True


def test_a_fixed_engine_is_ok_over_http_and_the_explicit_reset_is_a_query_parameter(
    checkpoints: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    engine = FakeLLM(checkpoints["a"], bug=False)
    calls: list[Any] = []

    async def reset_prefix_cache(reset_running_requests: bool) -> bool:
        calls.append(reset_running_requests)
        return True

    engine.reset_prefix_cache = reset_prefix_cache  # type: ignore[attr-defined]
    real_post = FakeServer.post

    async def post(self: FakeServer, url: str, params: Any = None, json: Any = None, timeout: Any = None) -> _Resp:
        if url.endswith("/reset_prefix_cache"):
            self.calls.append(("/reset_prefix_cache", params, json))
            await reset_prefix_cache(params["reset_running_requests"] == "true")
            return _Resp(None)
        return await real_post(self, url, params, json, timeout)

    monkeypatch.setattr(FakeServer, "post", post)
    params = {"clear_cache": False, "explicit_reset": True, "max_tokens": 24}
    server, out = _play_over_http(engine, checkpoints, tmp_path, params, monkeypatch)
    assert cell_verdict(stream_records(out["records"])).outcome is Outcome.OK
    assert calls == [True]
    paths = [p for p, _, _ in server.calls if not p.startswith("/repro/")]
    swap = paths.index("/collective_rpc", paths.index("/pause"))
    assert paths[swap - 1:swap + 3] == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"]


def test_weight_sync_on_the_server_door_is_data_per_release_and_per_parameter() -> None:
    assert ep.scenario_problem("weight_sync", "0.21.0", {"weight_transfer": "reload"}) is None
    assert ep.scenario_problem("weight_sync", "0.32.0", {"explicit_reset": True}) is None
    nccl = ep.scenario_problem("weight_sync", "0.22.0", {"weight_transfer": "nccl"}) or ""
    assert nccl.startswith("door=server: the NCCL weight transfer") and "POST /collective_rpc" in nccl
    assert "second engine" in (ep.scenario_problem("weight_sync", "0.22.0", {"fresh_engine_check": True}) or "")
    # Before 0.16.0 /pause has no mode: the keep pause, hence the scenario, cannot be played over HTTP.
    assert "takes no mode parameter" in (ep.scenario_problem("weight_sync", "0.15.0") or "")
    # A parameter value that is no table key (a list) adds nothing.
    assert ep.scenario_problem("weight_sync", "0.22.0", {"weight_transfer": ["x"]}) is None


def test_auto_transfer_is_reload_on_the_server_door_even_with_a_spare_gpu(tmp_path: Path) -> None:
    cfg = RunConfig(platform="cuda", work_dir=tmp_path, model_cache=tmp_path, n_gpus=2, weight_transfer="auto")
    assert weight_transfer(Cell("0.22.0", scenario="weight-sync"), cfg) == "nccl"
    assert weight_transfer(Cell("0.22.0", scenario="weight-sync", door="server"), cfg) == "reload"
    explicit = RunConfig(platform="cuda", work_dir=tmp_path, model_cache=tmp_path, n_gpus=2, weight_transfer="nccl")
    assert weight_transfer(Cell("0.22.0", scenario="weight-sync", door="server"), explicit) == "nccl"


def test_collective_rpc_reads_the_routes_answers() -> None:
    class Client:
        def __init__(self, doc: Any) -> None:
            self.doc = doc

        async def post(self, url: str, params: Any = None, json: Any = None, timeout: Any = None) -> _Resp:
            return _Resp(self.doc)

    def rpc(doc: Any) -> list[Any]:
        return asyncio.run(HttpLLM(Client(doc), URL, "0.22.0", "/m").collective_rpc("m"))  # type: ignore[arg-type]

    assert rpc({"results": [None, {"a": 1}]}) == [None, {"a": 1}]
    assert rpc(None) == []  # the route's empty 200 when the engine returned None
    with pytest.raises(ServerError, match="unexpected answer"):
        rpc([1, 2])
