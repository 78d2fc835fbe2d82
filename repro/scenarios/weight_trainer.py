"""The trainer side of the NCCL weight-sync scenario: ``python -m repro.scenarios.weight_trainer``.

Plays the ``TrainModel`` actor of upstream's ``examples/rl/rlhf_async_new_apis.py``
(vLLM 0.21/0.22) without Ray: a separate process pinned by its parent to a GPU
of its own (``CUDA_VISIBLE_DEVICES``), rank 0 of a two-rank NCCL group whose
rank 1 is the engine's worker.  Instead of a trained model it broadcasts the
tensors of a bigram-cycle checkpoint, in the order its parent names them.

Commands arrive as JSON lines on stdin; each gets one reply line on stdout,
prefixed with ``@@repro-trainer `` because vLLM may log to stdout too:

* ``{"op": "init", "master_address", "master_port", "world_size"}``:
  ``NCCLWeightTransferEngine.trainer_init`` (returns once the engine joined);
* ``{"op": "send", "checkpoint": DIR, "names": [...], "packed": bool}``:
  ``NCCLWeightTransferEngine.trainer_send_weights`` of DIR's tensors;
* ``{"op": "stop"}``.

A failed command replies ``{"ok": false, "error": ...}`` and ends the process.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

TAG = "@@repro-trainer "  # must match repro.scenarios.weight_transfer.TRAINER_TAG


def _reply(**data: Any) -> None:
    sys.stdout.write(TAG + json.dumps(data) + "\n")
    sys.stdout.flush()


def _send(group: Any, checkpoint: Path, names: list[str], packed: bool) -> dict[str, Any]:
    import numpy as np
    import torch
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerSendWeightsArgs, NCCLWeightTransferEngine

    from repro.models.deterministic import read_safetensors

    arrays = read_safetensors(checkpoint / "model.safetensors")
    missing = sorted(set(names) - set(arrays))
    if missing:
        raise ValueError(f"{checkpoint} has no tensors {missing}")
    tensors = [(n, torch.from_numpy(np.ascontiguousarray(arrays[n])).to("cuda")) for n in names]
    NCCLWeightTransferEngine.trainer_send_weights(
        iterator=iter(tensors), trainer_args=NCCLTrainerSendWeightsArgs(group=group, packed=packed))
    torch.cuda.synchronize()
    return {"tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for _, t in tensors)}


def main() -> int:
    group: Any = None
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.get("op")
        try:
            if op == "init":
                import torch
                from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

                group = NCCLWeightTransferEngine.trainer_init({
                    "master_address": cmd["master_address"], "master_port": int(cmd["master_port"]),
                    "world_size": int(cmd["world_size"])})
                _reply(ok=True, device=torch.cuda.get_device_name(0))
            elif op == "send":
                if group is None:
                    raise RuntimeError("send before init")
                _reply(ok=True, **_send(group, Path(cmd["checkpoint"]), list(cmd["names"]), bool(cmd["packed"])))
            elif op == "stop":
                _reply(ok=True)
                return 0
            else:
                raise ValueError(f"unknown op {op!r}; valid: init, send, stop")
        except Exception as exc:
            _reply(ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
