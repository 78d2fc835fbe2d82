"""vLLM's cache directory per environment, for every process the harness starts in one (engines, the scheduler
tier, the fuzzer)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.envbuild.envs import VllmEnv
    from harness.run.spec import RunConfig


# A folder under which each environment gets its own ``VLLM_CACHE_ROOT`` (default: ``vllm-cache`` beside the
# models).  Wins over an inherited ``VLLM_CACHE_ROOT``: the test sandbox (tests/cache_sandbox.py) sets both, the
# latter only for processes the harness does not start, so that its engines keep one vLLM cache per env.
PER_ENV_ROOT_VAR = "VLLM_REPRO_VLLM_CACHE_ROOT"


def vllm_cache_env(env: VllmEnv, cfg: RunConfig) -> dict[str, str]:
    """A ``VLLM_CACHE_ROOT`` of the environment's own (under ``$VLLM_REPRO_VLLM_CACHE_ROOT`` when set), unless the
    run's ``cfg.extra_env`` or the caller's shell set one (the shell's is ignored where the former variable is set).

    vLLM caches what it learns by importing a model's module in a subprocess (``_LazyRegisteredModel.
    inspect_model_cls``, vllm/model_executor/models/registry.py in 0.21.0 and 0.32.0) as one file per model class
    under ``$VLLM_CACHE_ROOT/modelinfos``, stamped with that release's module hash: releases sharing
    ``~/.cache/vllm`` overwrite each other's entry, so a run over several versions paid the subprocess for each
    version's first process, every run: 10-12 s for a fuzz run's setups, 7 s (0.21.0) and 13 s (0.32.0) before the
    first engine of each version of the default CPU matrix (docs/performance.md).  vLLM writes the entry with its
    ``atomic_writer`` (weight_utils.py), so engines of one version starting side by side may share the directory.
    Engines that compile (torch.compile on a GPU) keep that cache here too, per environment."""
    if "VLLM_CACHE_ROOT" in cfg.extra_env:
        return {}
    if os.environ.get(PER_ENV_ROOT_VAR):
        return {"VLLM_CACHE_ROOT": str((Path(os.environ[PER_ENV_ROOT_VAR]) / env.path.name).resolve())}
    if "VLLM_CACHE_ROOT" in os.environ:
        return {}
    return {"VLLM_CACHE_ROOT": str((cfg.model_cache.parent / "vllm-cache" / env.path.name).resolve())}
