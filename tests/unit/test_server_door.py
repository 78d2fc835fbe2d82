"""The server door's pure parts: engine arguments as serve flags, the endpoint table, the stream parsing and
the adapter's explicit parameters (issue 22)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from repro.scenarios import SCENARIOS
from repro.scenarios.vocab import ScenarioUnsupported
from repro.server import endpoints as ep
from repro.server.args import ArgMappingError, Option, flags, options_of
from repro.server.http_llm import DONE, HttpLLM, ServerError, chunk_delta, parse_sse, stream_outputs, strip_ids
from repro.server.serve_process import server_env, server_port

pytestmark = pytest.mark.unit

OPTS = {
    "async_scheduling": Option("--async-scheduling", True, "--no-async-scheduling"),
    "enforce_eager": Option("--enforce-eager", True, None),
    "max_model_len": Option("--max-model-len"),
    "speculative_config": Option("--speculative-config"),
    "model": Option("--model"),
}


def test_flags_spell_every_field_with_the_parsers_option() -> None:
    got = flags({"model": "/m", "async_scheduling": False, "enforce_eager": True, "max_model_len": 256,
                 "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, OPTS)
    assert got == ["--model", "/m", "--no-async-scheduling", "--enforce-eager", "--max-model-len", "256",
                   "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}']


def test_flags_leave_none_and_a_false_store_true_to_the_default() -> None:
    assert flags({"enforce_eager": False, "max_model_len": None}, OPTS) == []


def test_flags_refuse_a_field_the_cli_cannot_carry() -> None:
    with pytest.raises(ArgMappingError, match="no command-line option for engine argument 'nope'"):
        flags({"nope": 1}, OPTS)
    with pytest.raises(ArgMappingError, match="has no command-line form"):
        flags({"max_model_len": object()}, OPTS)
    with pytest.raises(ArgMappingError, match="boolean flag"):
        flags({"enforce_eager": "yes"}, OPTS)


def test_options_of_reads_the_parsers_actions() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--max-model-len", "-l", type=int)
    got = options_of(parser)
    assert got["async_scheduling"] == Option("--async-scheduling", True, "--no-async-scheduling")
    assert got["enforce_eager"] == Option("--enforce-eager", True, None)
    assert got["max_model_len"] == Option("--max-model-len")
    assert "help" in got  # every destination, even those the door never asks for


@pytest.mark.parametrize(("version", "key"), [("0.22.0+cpu", (0, 22, 0)), ("0.22.1rc1.dev3", (0, 22, 1)),
                                              ("1.0", (1, 0, 0))])
def test_release_key(version: str, key: tuple[int, ...]) -> None:
    assert ep.version_tuple(version) == key


def test_pause_modes_exist_from_0_16_0() -> None:
    assert ep.endpoint_problem("pause", ("mode", "clear_cache"), "0.21.0") is None
    assert ep.endpoint_problem("pause", ("mode", "clear_cache"), "0.22.0+cpu") is None
    problem = ep.endpoint_problem("pause", ("mode",), "0.15.0")
    assert problem is not None and "takes no mode parameter" in problem


def test_an_endpoint_before_its_first_release_is_missing() -> None:
    problem = ep.endpoint_problem("start_weight_update", (), "0.20.0")
    assert problem == "vLLM 0.20.0 has no POST /start_weight_update endpoint (it exists from 0.21.0, 0.25.0)"
    assert ep.endpoint_problem("start_weight_update", ("is_checkpoint_format",), "0.25.0") is not None
    assert ep.endpoint_problem("finish_weight_update", (), "0.32.0") is None


def test_every_scenario_has_a_server_door_entry() -> None:
    assert set(ep.SCENARIOS) == set(SCENARIOS)
    assert ep.scenario_problem("keep", "0.21.0") is None
    assert ep.scenario_problem("keep", "0.15.0") is not None
    assert ep.scenario_problem("weight_sync", "0.22.0") is None  # the swap over POST /collective_rpc
    assert (ep.scenario_problem("sleep", "0.22.0") or "").startswith("door=server: the sleep")
    assert "no server-door entry" in (ep.scenario_problem("unknown", "0.22.0") or "")


def test_parse_sse_lines() -> None:
    assert parse_sse("") is None
    assert parse_sse(": ping") is None
    assert parse_sse("data: [DONE]") == DONE
    assert parse_sse('data: {"choices": []}') == {"choices": []}
    with pytest.raises(ServerError):
        parse_sse("data: [1, 2]")


def test_chunk_delta() -> None:
    assert chunk_delta({"choices": [{"token_ids": [5, 6], "finish_reason": None, "text": ""}]}) == ([5, 6], None)
    assert chunk_delta({"choices": [{"token_ids": [], "finish_reason": "length"}]}) == ([], "length")
    assert chunk_delta({"choices": [], "usage": {}}) == ([], None)
    with pytest.raises(ServerError, match="no token_ids"):
        chunk_delta({"choices": [{"text": "ab", "finish_reason": None}]})
    with pytest.raises(ServerError, match="server error") as info:
        chunk_delta({"error": {"message": "boom"}})
    assert type(info.value) is ServerError  # not retried: only a paused engine's 503 is
    # vLLM 0.34.0's OpenAI server during a wait pause (measured on an H200): the driver retries it after the resume.
    paused = {"message": "Generation is paused. Please retry after it resumes.", "type": "ServiceUnavailableError",
              "param": None, "code": 503}
    with pytest.raises(ServerError) as info:
        chunk_delta({"error": paused})
    assert type(info.value).__name__ == "RetryableRequestError"


async def _lines(*lines: str) -> AsyncIterator[str]:
    for line in lines:
        yield line


def test_stream_outputs_stop_at_done() -> None:
    async def collect() -> list[tuple[list[int], str | None]]:
        outs = stream_outputs(_lines('data: {"choices": [{"token_ids": [1], "finish_reason": null}]}', "",
                                     'data: {"choices": [{"token_ids": [2, 3], "finish_reason": "length"}]}',
                                     "data: [DONE]", 'data: {"choices": [{"token_ids": [9]}]}'))
        return [(o.outputs[0].token_ids, o.outputs[0].finish_reason) async for o in outs]

    assert asyncio.run(collect()) == [([1], None), ([2, 3], "length")]


def test_strip_ids_renames_the_engine_cores_request_ids() -> None:
    raw = {"cmpl-keep-r00-0-ab12": {"n": 1}, "other": [{"cmpl-x-0": 2}]}
    assert strip_ids(raw) == {"keep-r00-0-ab12": {"n": 1}, "other": [{"x-0": 2}]}


class _Resp:
    def __init__(self, doc: Any) -> None:
        self.status_code, self.doc, self.text = 200, doc, ""

    def json(self) -> Any:
        return self.doc


class _Client:
    """Records every request; answers each with ``doc``."""

    def __init__(self, doc: Any = None) -> None:
        self.calls: list[tuple[str, Any, Any]] = []
        self.doc = doc

    async def post(self, url: str, params: Any = None, json: Any = None, timeout: Any = None) -> _Resp:
        self.calls.append((url, params, json))
        return _Resp(self.doc)


def test_the_adapter_always_sends_explicit_parameters() -> None:
    client = _Client()
    llm = HttpLLM(client, "http://127.0.0.1:9", "0.22.0", "/m")  # type: ignore[arg-type]

    async def go() -> None:
        await llm.pause_generation(mode="keep", clear_cache=False)
        await llm.resume_generation()
        await llm.reset_prefix_cache(reset_running_requests=True)

    asyncio.run(go())
    assert client.calls == [("http://127.0.0.1:9/pause", {"mode": "keep", "clear_cache": "false"}, None),
                            ("http://127.0.0.1:9/resume", None, None),
                            ("http://127.0.0.1:9/reset_prefix_cache", {"reset_running_requests": "true"}, None)]


def test_the_adapter_refuses_an_endpoint_the_release_lacks() -> None:
    llm = HttpLLM(_Client(), "http://127.0.0.1:9", "0.15.0", "/m")  # type: ignore[arg-type]
    with pytest.raises(ScenarioUnsupported, match="takes no mode parameter"):
        asyncio.run(llm.pause_generation(mode="keep", clear_cache=False))


def test_utilities_go_through_the_probe_route_with_request_ids_stripped() -> None:
    client = _Client({"result": {"cmpl-keep-r00-0": {"num_output_tokens": 3}}})
    llm = HttpLLM(client, "http://127.0.0.1:9", "0.22.0", "/m")  # type: ignore[arg-type]
    got = asyncio.run(llm.engine_core.call_utility_async("repro_request_progress"))
    assert got == {"keep-r00-0": {"num_output_tokens": 3}}
    assert client.calls == [("http://127.0.0.1:9/repro/utility/repro_request_progress", None, None)]


def test_server_port_and_env() -> None:
    assert server_port({"VLLM_REPRO_PORT_RANGE": "20000-20032"}) == 20030
    assert 0 < server_port({}) < 65536
    env = server_env({"PYTHONPATH": "/staged"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["PYTHONPATH"] == "/staged"
    assert env["VLLM_REPRO_SERVER_PROBE"] == "1"


def test_descendants_walk_the_process_tree(tmp_path: Any) -> None:
    from repro.server.serve_process import descendants

    # pid (comm) state ppid ...: 10 -> 11 -> 12, 10 -> 13; 20 is another tree; a comm with spaces and ")".
    for pid, ppid, comm in [(10, 1, "python"), (11, 10, "VLLM::EngineCore"), (12, 11, "VLLM::Worker"),
                            (13, 10, "a) b"), (20, 1, "other")]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} 0 0\n")
    (tmp_path / "self").mkdir()
    assert sorted(descendants(10, tmp_path)) == [11, 12, 13]
    assert descendants(12, tmp_path) == []


def test_a_sampled_chunk_keeps_each_childs_index_tokens_and_logprobs() -> None:
    from repro.scenarios.sampling import token_logprob
    from repro.server.http_llm import chunk_outputs

    chunk = {"choices": [
        {"index": 2, "token_ids": [7, 9], "finish_reason": None, "text": "",
         "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.25, -1.5],
                      "top_logprobs": [{"a": -0.25}, {"c": -0.1}]}},
        {"index": 0, "token_ids": [4], "finish_reason": "length", "text": "", "logprobs": None}]}
    out = chunk_outputs(chunk)
    (c2, c0) = out.outputs
    assert (c2.index, c2.token_ids, c0.index, c0.finish_reason, c0.logprobs) == (2, [7, 9], 0, "length", None)
    # the sampled token's own logprob, not the top-1 alternative's
    assert [token_logprob(e, t) for e, t in zip(c2.logprobs, c2.token_ids, strict=True)] == [-0.25, -1.5]
    with pytest.raises(ServerError, match="do not match"):
        chunk_outputs({"choices": [{"index": 0, "token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}}]})


def test_a_gated_server_door_waits_for_go_and_reports_its_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline for servers (harness.run.turns): the scenarios start only after GO on stdin; a server that died
    meanwhile is the engine's error, not a scenario's."""
    import io
    import json
    import sys

    from repro.core.wire import GO
    from repro.server import door

    class FakeServer:
        def __init__(self, alive: bool) -> None:
            self.alive = alive

        def death(self) -> str:
            return "vllm serve exited with status -9"

    events: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n" + json.dumps(GO) + "\n"))
    asyncio.run(door._wait_turn(FakeServer(True), lambda kind, **f: events.append((kind, f))))  # type: ignore[arg-type]
    assert [k for k, _ in events] == ["turn"] and events[0][1]["waited_s"] >= 0
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(GO) + "\n"))
    with pytest.raises(RuntimeError, match="died while it waited for its turn: vllm serve exited"):
        asyncio.run(door._wait_turn(FakeServer(False), lambda kind, **f: None))  # type: ignore[arg-type]


def test_every_engine_tier_door_is_gated_and_the_scheduler_tier_is_not() -> None:
    from harness.core.cell import EngineKey
    from harness.run.runner import gated

    key = EngineKey("0.21.0", "mp", True)
    assert all(gated(replace(key, door=d)) for d in ("engine", "server", "client"))
    assert not gated(replace(key, tier="scheduler"))
