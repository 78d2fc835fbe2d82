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
    kind: str  # "package-init": the package's real folder, its __init__ not run; "module": a small replacement;
    # "not-imported": the package is never imported (its file runs by path); "environment": an environment
    # variable the door sets around the framework's call (``module`` names it)
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
    pause_clear_cache: bool  # TRL: None in the request, the route's default (true on 0.12-0.33, read)
    pause_sent: str  # the request as the server's access log shows it
    resume_sent: str
    requires_python: str = ">=3.11"
    probes: tuple[str, ...] = ()  # client methods called once at start-up, their outcome recorded (not judged)
    swap: str = ""  # how a weight-sync cell swaps weights on this door, and why not the framework's own way
    # The constructor's keyword arguments as JSON, "$URL" standing for the server's URL; empty: ``cls(url)``.
    init: str = ""
    # Keyword arguments the door passes with an engine call the client makes (its own defaults otherwise).
    call_kwargs: tuple[tuple[str, str], ...] = ()  # engine call -> JSON object
    # A framework whose own code driving vLLM is its server (AReaL): ``server_main`` is that entry point's file in
    # the released package, run by the vLLM environment's interpreter as the server (``python FILE flags``);
    # ``calls`` then name the routes it adds (POSTed with ``route_body``, as the framework's client builds them),
    # and ``marks`` a line the server's log shows once per call when the handler reached the engine.
    server_main: str = ""
    route_body: tuple[tuple[str, str], ...] = ()
    marks: tuple[tuple[str, str], ...] = ()  # client method (a route) -> a line its handler leaves in the log
    # A framework whose own wrapper class builds AsyncLLM and drives it in-process (OpenRLHF's rollout actor):
    # the engine process imports ``module`` from the side environment's site-packages, builds ``cls`` from the
    # cell's engine arguments (``init``: the wrapper's other keyword arguments) and calls its methods
    # (``repro.client.actor``); ``caller`` is the framework's file the engine calls must come from.
    in_process: bool = False
    caller: str = ""

    def method(self, call: str) -> str | None:
        return dict(self.calls).get(call)

    def kwargs(self, call: str) -> dict[str, Any]:
        return dict(json.loads(dict(self.call_kwargs).get(call, "{}")))

    def construct(self, cls: Any, url: str) -> Any:
        """The client object for the server at ``url``, built as the framework's own code builds it."""
        return cls(**json.loads(self.init.replace("$URL", url))) if self.init else cls(url)

    @property
    def routes(self) -> bool:
        """The calls are routes of the framework's own server, not methods of a client class in a side process."""
        return bool(self.server_main)

    def call_name(self, method: str) -> str:
        """How a call reads in a reason: ``VLLMClient.pause()``, or ``POST /areal_pause_generation``."""
        return f"POST {method}" if self.routes else f"{self.cls}.{method}()"

    def mark(self, method: str) -> str:
        return dict(self.marks).get(method, "")


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

# areal 1.0.4: AReaL drives vLLM from its own server, areal/engine/vllm_ext/areal_vllm_server.py (vLLM's run_server
# with build_app wrapped: its /v1/completions waits while paused, :339-359; /areal_pause_generation calls
# pause_generation(wait_for_inflight_requests=False, clear_cache=True) -- the deprecated spelling of mode="abort"
# (0.21.0 vllm/v1/engine/async_llm.py:750-756) -- and reset_mm_cache(), :309-321; /areal_continue_generation calls
# resume_generation(), :324-330).  Its client, RemoteInfEngine.pause_generation/continue_generation
# (areal/infra/remote_inf_engine.py:1267-1280), POSTs VLLMBackend.get_pause_request()/get_resume_request()
# (areal/engine/vllm_remote.py:257-263: those endpoints, payload {}) to every server; that module imports torch,
# ray and torchdata, so the door POSTs the same requests itself.  Its launcher runs the file as
# ``python3 -m areal.engine.vllm_ext.areal_vllm_server`` (areal/api/cli_args.py:1672,1784), which imports
# areal/__init__.py (ray, torch.distributed); the file itself imports only vllm, fastapi and uvloop, so the door runs
# it by path with the vLLM environment's interpreter, nothing replaced.
CLIENTS["areal"] = Client(
    framework="areal", package="areal", module="areal.engine.vllm_ext.areal_vllm_server", cls="router",
    requirements=(),
    calls=(("pause_generation", "/areal_pause_generation"), ("resume_generation", "/areal_continue_generation")),
    pause_mode="abort", pause_clear_cache=True,
    pause_sent='"POST /areal_pause_generation HTTP/1.1" 200',
    resume_sent='"POST /areal_continue_generation HTTP/1.1" 200',
    swap="none: its cell is the abort pause with no swap (no harness scenario swaps weights in abort mode); its disk "
         "path, /areal_update_weights, calls collective_rpc('areal_update_weights') in its worker extension "
         "(vllm_worker_extension.py:39-56), which imports areal's package (areal.engine.core.distributed, "
         "areal.infra.platforms) inside vLLM's workers: not run",
    server_main="areal/engine/vllm_ext/areal_vllm_server.py",
    # AReaL's own logger lines ("API server starts areal_pause_generation ...", :311) never reach the log: vLLM's
    # init_logger configures the "vllm" logger only, and "areal_vllm_server" has no handler (measured on 0.21.0).
    # EngineCore's line for its clear_cache=True is the engine's own record of the call (0.21.0
    # vllm/v1/core/block_pool.py:471, 0.22.0 :482; nothing else in the scenario resets the cache).
    marks=(("/areal_pause_generation", "Successfully reset prefix cache"),))

# openrlhf 0.11.2, openrlhf/trainer/ray/vllm_engine.py: RolloutRayActor (:33-206), the @ray.remote class OpenRLHF's
# trainer drives every vLLM engine through (create_vllm_engines, :209-311; batch_vllm_engine_call, :314-327), builds
# its own engine in its async __init__ (vllm.AsyncEngineArgs(*args, **kwargs), AsyncLLMEngine.from_engine_args:
# :63-64; AsyncLLMEngine is AsyncLLM, 0.21.0 vllm/engine/async_llm_engine.py:6) and drives it in-process, no HTTP:
# pause_generation() awaits self.llm.pause_generation(mode="keep") (:130-131: clear_cache left at AsyncLLM's
# default, True, 0.21.0 and 0.22.0 vllm/v1/engine/async_llm.py:750-756), resume_generation() awaits
# self.llm.resume_generation() (:133-134); its partial-rollout trainer calls them around the weight broadcast
# (ppo_trainer_async.py:255-265).  The broadcast (update_weight -> collective_rpc, :115-119, into its
# WorkerWrap's NCCL group, vllm_worker_wrap.py) needs CUDA: the weight-sync cell swaps with the harness's reload.
# The wheel is cp311 only (openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl): its side environment's Python is the
# vLLM environment's minor, whose interpreter imports it.
CLIENTS["openrlhf"] = Client(
    framework="openrlhf", package="openrlhf", module="openrlhf.trainer.ray.vllm_engine", cls="RolloutRayActor",
    requirements=(),  # vllm_engine.py's other imports (vllm, packaging, aiohttp) are the vLLM environment's
    calls=(("pause_generation", "pause_generation"), ("resume_generation", "resume_generation")),
    pause_mode="keep", pause_clear_cache=True,
    pause_sent="AsyncLLM.pause_generation(mode='keep')", resume_sent="AsyncLLM.resume_generation()",
    requires_python=">=3.11,<3.12",
    swap="the harness's reload (collective_rpc reload_weights on the actor's own AsyncLLM, from disk): OpenRLHF's "
         "own swap (init_process_group, update_weight: collective_rpc into its WorkerWrap, vllm_engine.py:107-125, "
         "an NCCL broadcast from the trainer) needs CUDA and a trainer process",
    # create_vllm_engines' actor kwargs besides the engine's (vllm_engine.py:264-288): one engine, TP 1, no
    # placement-group bundle, no agent, no reward URL, no multimodal pads; num_gpus and full_determinism are popped
    # by __init__ (:49-51) before the engine arguments.
    init='{"bundle_indices": null, "num_gpus": 1, "full_determinism": false, "agent_func_path": null, '
         '"remote_rm_url": null, "mm_pad_token_ids": []}',
    in_process=True, caller="openrlhf/trainer/ray/vllm_engine.py")

# The frameworks whose own client does not run on the client door yet, and why: they stay on their recipes.
NO_CLIENT: dict[str, str] = {
    "verl": "verl 0.9.1's vLLMHttpServer (verl/workers/rollout/vllm_rollout/vllm_async_server.py:87) imports ray, "
            "omegaconf-backed verl.utils.config, verl.workers.config, verl.utils.profiler and verl.utils.tracking "
            "(:26-66) besides vllm, and builds AsyncLLM inside a Ray actor (vLLMReplica: ray.remote(vLLMHttpServer), "
            ":1334); its HTTP server (build_app, :520) serves only the completions, while its pause "
            "(abort_all_requests -> AsyncLLM.pause_generation, :931-1004), sleep and wake_up (:832-864) are actor "
            "methods called over Ray: the same in-process shape as OpenRLHF's client door with far more stand-ins; "
            "not built",
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
    StandIn("areal", "areal", "not-imported", (),
            "AReaL's launcher runs its server as python3 -m areal.engine.vllm_ext.areal_vllm_server "
            "(areal/api/cli_args.py:1672,1784), which runs areal/__init__.py (RolloutController, ray, "
            "torch.distributed); the door runs the same file by path with the vLLM environment's interpreter, so "
            "the package's __init__ is never imported; --worker-extension-cls (its VLLMWorkerExtension, which "
            "imports the package) is not passed: only its update routes, which the door does not call, use it",
            "areal/engine/vllm_ext/areal_vllm_server.py whole, as the server's __main__: its build_app wrapper "
            "(:362-400), its /v1/completions (:339-359, every completion of the cell), /areal_pause_generation and "
            "/areal_continue_generation (:309-336)"),
    StandIn("openrlhf", "ray", "module", ("remote",),
            "vllm_engine.py imports ray (:6) and decorates RolloutRayActor with @ray.remote (:33); ray is not "
            "installed (openrlhf requires ray[default]==2.55.0, a cluster runtime). The stand-in's remote returns "
            "the class unchanged and the door builds it as Ray builds an async actor (the instance, then its async "
            "__init__ awaited, here in the engine process's event loop); it leaves sys.modules once the module is "
            "imported, so vLLM's own `import ray` checks still find no ray",
            "RolloutRayActor.__init__ whole (vllm_engine.py:37-65: _configure_device_env, _configure_vllm_env but "
            "its RAY_ADDRESS branch, SingleTurnAgentExecutor, vllm.AsyncEngineArgs, AsyncLLMEngine.from_engine_args, "
            "is_sleeping), pause_generation and resume_generation (:130-134): every line the door calls"),
    StandIn("openrlhf", "ray.util.placement_group", "module", ("placement_group",),
            "imported by vllm_engine.py (:9) for create_vllm_engines (:250), which places actors on GPUs of a Ray "
            "cluster and is not called (the door builds one actor itself); the stand-in raises if called",
            "nothing of create_vllm_engines runs; its actor kwargs are the door's (Client.init)"),
    StandIn("openrlhf", "ray.util.scheduling_strategies", "module", ("PlacementGroupSchedulingStrategy",),
            "imported by vllm_engine.py (:10) for create_vllm_engines (:258), not called; the stand-in raises if "
            "called",
            "as above"),
    StandIn("openrlhf", "openrlhf.utils", "package-init", (),
            "openrlhf/utils/__init__.py imports math_utils (pylatexenc, sympy) and utils.py (torch, transformers) "
            "for the trainer; vllm_engine.py needs only utils/agent.py (SingleTurnAgentExecutor, :14,59)",
            "openrlhf/__init__.py, openrlhf/trainer/__init__.py, openrlhf/trainer/ray/__init__.py, trainer/ray/"
            "utils.py, utils/agent.py, utils/logging_utils.py and trainer/ray/vllm_engine.py whole, imported from "
            "the installed wheel's files"),
    StandIn("openrlhf", "RAY_ADDRESS", "environment", (),
            "_configure_vllm_env reads the Ray cluster's address into RAY_ADDRESS when it is unset (vllm_engine.py:"
            "102-105), for vLLM's Ray executor; there is no cluster and the cell's executor is not Ray's, so the door "
            "sets RAY_ADDRESS (to a value naming the door) while the actor's __init__ runs and that branch is skipped",
            "the rest of _configure_vllm_env (:91-100: its vLLM version assert and "
            "VLLM_ALLOW_INSECURE_SERIALIZATION=1)"),
)


def standins(framework: str) -> tuple[StandIn, ...]:
    return tuple(s for s in STANDINS if s.framework == framework)
