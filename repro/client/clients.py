"""The framework clients the client door runs, and every stand-in they need: pure data, standard library only
(the harness reads it to build the side environment and write the docs; ``repro.client.side`` to import the
client; ``repro.client.door`` to map the scenario's calls onto the client's methods).

A stand-in replaces a module the client's import pulls in but the calls the door makes never use, so the side
environment needs neither torch nor transformers: :data:`STANDINS` is the one table of them, each with its reason
and the framework lines that still run unchanged (cited in the released wheel the door installs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StandIn:
    """A module the side process puts in ``sys.modules`` before the framework's client is imported."""

    framework: str
    module: str
    kind: str  # "package-init": the package's real folder, its __init__ not run; "module": a small replacement
    provides: tuple[str, ...]  # the names the replacement defines (kind "module")
    reason: str
    unchanged: str  # the framework's lines that still run as released


@dataclass(frozen=True)
class Client:
    """A framework's released client: its distribution, the module and class the door imports, the light
    requirements installed beside it (``--no-deps``), and the client method the door calls for each engine call."""

    framework: str
    package: str
    module: str
    cls: str
    requirements: tuple[str, ...]
    calls: tuple[tuple[str, str], ...]  # engine call (AsyncLLM's name) -> the client's method
    # The pause the client sends, as the cell axes spell it: the door plays only cells that ask for it.
    pause_mode: str
    pause_clear_cache: bool  # None in the request: the route's default (true on 0.12-0.33, read)
    pause_sent: str  # the request as the server's access log shows it
    resume_sent: str
    requires_python: str = ">=3.11"
    probes: tuple[str, ...] = ()  # client methods called once at start-up, their outcome recorded (not judged)
    swap: str = ""  # how a weight-sync cell swaps weights on this door, and why not the framework's own way
    # The constructor's keyword arguments as JSON, "$URL" standing for the server's URL; empty: ``cls(url)``.
    init: str = ""
    # Keyword arguments the door passes with an engine call the client makes (its own defaults otherwise).
    call_kwargs: tuple[tuple[str, str], ...] = ()  # engine call -> JSON object

    def method(self, call: str) -> str | None:
        return dict(self.calls).get(call)

    def kwargs(self, call: str) -> dict[str, Any]:
        return dict(json.loads(dict(self.call_kwargs).get(call, "{}")))

    def construct(self, cls: Any, url: str) -> Any:
        """The client object for the server at ``url``, built as the framework's own code builds it."""
        return cls(**json.loads(self.init.replace("$URL", url))) if self.init else cls(url)


# trl 1.16.0, trl/experimental/async_grpo/vllm_client.py: VLLMClient.pause (:133-137) posts /pause with
# params={"mode": "keep"} and no clear_cache, so vLLM's route applies its default clear_cache=True (0.21.0
# vllm/entrypoints/serve/rlhf/api_router.py; repro.server.endpoints' spans); VLLMClient.resume (:139-143) posts
# /resume.  Its weight update (start_weight_update/update_weights/finish_weight_update, :153-173) drives an NCCL
# receive beside a trainer's broadcast (CUDA only), so the weight-sync cell swaps with the harness's reload.
CLIENTS: dict[str, Client] = {
    "trl": Client(
        framework="trl", package="trl", module="trl.experimental.async_grpo.vllm_client", cls="VLLMClient",
        requirements=("requests", "urllib3", "idna", "certifi", "charset-normalizer", "packaging"),
        calls=(("pause_generation", "pause"), ("resume_generation", "resume")),
        pause_mode="keep", pause_clear_cache=True,
        pause_sent='"POST /pause?mode=keep HTTP/1.1" 200', resume_sent='"POST /resume HTTP/1.1" 200',
        # async_grpo_trainer.py:1411: a PEFT model's start-up reads /server_info through get_server_info().
        probes=("get_server_info",),
        swap="the harness's reload (POST /collective_rpc reload_weights, from disk): TRL's own swap "
             "(start_weight_update, update_weights, finish_weight_update beside an NCCL broadcast, "
             "vllm_client.py:153-173) needs CUDA"),
}

# skyrl 0.4.0, skyrl/backends/skyrl_train/weight_sync/control_plane.py: SkyrlWeightSyncClient, the blocking HTTP
# client its checkpoint-delta engine drives one weight sync with (weight_sync/delta/trainer.py:177-192:
# pause_generation(), reset_prefix_cache(reset_running_requests=True) when the prefix cache is on and the trainer
# is synchronous or clears the KV cache on sync (workers/worker.py:593-603), start_weight_update(),
# update_weights(), finish_weight_update(), resume_generation() in a finally).  pause_generation (:150-154) posts
# /pause?mode=keep&clear_cache=false; reset_prefix_cache (:147-148) posts a JSON body {reset_running_requests:
# true}, which vLLM's own route reads as no parameters (Query() only: 0.21.0 and 0.22.0
# vllm/entrypoints/serve/cache/api_router.py:21-26; trap T1); resume_generation (:156-157) posts /resume.  Its
# /start_weight_update, /update_weights, /finish_weight_update (:102-112) exist in vLLM 0.21.0, 0.22.0
# (entrypoints/serve/rlhf/api_router.py:131-166) and 0.32.0 (entrypoints/rl/online/api_router.py:178-204) but move
# the weights over a transport engine set up by /init_weight_transfer_engine (NCCL or CUDA IPC), and its delta
# path's /fetch_weights is SkyRL's own route (vllm_server_actor.py), absent from vLLM's server.
CLIENTS["skyrl"] = Client(
    framework="skyrl", package="skyrl", module="skyrl.backends.skyrl_train.weight_sync.control_plane",
    cls="SkyrlWeightSyncClient",
    requirements=("requests", "urllib3", "idna", "certifi", "charset-normalizer"),
    calls=(("pause_generation", "pause_generation"), ("resume_generation", "resume_generation"),
           ("reset_prefix_cache", "reset_prefix_cache")),
    pause_mode="keep", pause_clear_cache=False,
    pause_sent='"POST /pause?mode=keep&clear_cache=false HTTP/1.1" 200', resume_sent='"POST /resume HTTP/1.1" 200',
    requires_python=">=3.12",  # skyrl 0.4.0's Requires-Python: <3.15,>=3.12
    swap="the harness's reload (POST /collective_rpc reload_weights, from disk): SkyRL's own swap "
         "(start_weight_update, update_weights, finish_weight_update, control_plane.py:102-112) moves the weights "
         "over an NCCL or CUDA-IPC transport set up by /init_weight_transfer_engine (CUDA only), and its delta "
         "path's /fetch_weights is a route of SkyRL's own server, not vLLM's",
    init='{"server_urls": ["$URL"], "data_parallel_size": 1}',
    call_kwargs=(("reset_prefix_cache", '{"reset_running_requests": true}'),))

# The frameworks whose own client does not run on the client door yet, and why: they stay on their recipes.
NO_CLIENT: dict[str, str] = {
    "areal": "AReaL's entry point is a patched vLLM server (areal_vllm_server.py wraps build_app): it installs into "
             "the vLLM environment, not beside it; not built yet",
    "openrlhf": "its rollout actor is a Ray actor around AsyncLLMEngine: stand-ins for ray are not built yet",
    "verl": "its vLLM HTTP server needs ray and tensordict stand-ins, not built yet",
    "prime-rl": "no usable release on the package index (the framework ships from its repository)",
    "pipelinerl": "no usable release on the package index (the framework ships from its repository)",
    "nemo-rl": "no usable release on the package index (the framework ships from its repository)",
}

STANDINS: tuple[StandIn, ...] = (
    StandIn("trl", "trl.experimental.async_grpo", "package-init", (),
            "the package's __init__ imports AsyncGRPOTrainer and AsyncGRPOConfig (torch, transformers, datasets, "
            "accelerate); the door needs only vllm_client.py beside it",
            "trl/experimental/async_grpo/vllm_client.py whole (imported from the installed wheel's file), and "
            "trl/__init__.py, trl/_compat.py, trl/import_utils.py, trl/experimental/__init__.py as released"),
    StandIn("trl", "accelerate.logging", "module", ("get_logger",),
            "accelerate imports torch; vllm_client.py takes only get_logger from it (vllm_client.py:17,26) for "
            "logger.info in wait_for_server_ready; the stand-in returns logging.getLogger(name)",
            "VLLMClient.__init__, get_server_info, pause, resume (vllm_client.py:45-50,93-97,133-143): every line "
            "the door calls"),
    StandIn("skyrl", "skyrl.backends", "package-init", (),
            "skyrl/backends/__init__.py imports AbstractBackend (backends/backend.py: cloudpathlib, and through it "
            "the training stack); the door needs only weight_sync/control_plane.py below it",
            "skyrl/__init__.py, skyrl/backends/skyrl_train/__init__.py, skyrl/backends/skyrl_train/weight_sync/"
            "__init__.py and base.py, and control_plane.py whole (SkyrlWeightSyncClient.__init__, pause_generation, "
            "reset_prefix_cache, resume_generation, _fanout, _post), imported from the installed wheel's files"),
)


def standins(framework: str) -> tuple[StandIn, ...]:
    return tuple(s for s in STANDINS if s.framework == framework)
