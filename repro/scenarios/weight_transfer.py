"""Weight transfer for the weight-sync scenario (``repro.scenarios.rlhf_weight_sync``): whether this vLLM can
swap an engine's weights, and the two ways it does.

* ``reload``: in place through vLLM's weight-update API,
  ``collective_rpc("reload_weights", kwargs={"weights_path": B})``; runs on
  CPU and on one GPU, through either door (the server door's ``collective_rpc``
  is ``POST /collective_rpc``, ``repro.server.http_llm``).
* ``nccl``: the example's NCCL path: a trainer process (``repro.scenarios.weight_trainer``)
  on the next visible GPU broadcasts B's tensors while the engine receives them
  with ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``
  (the API shape of vLLM 0.21/0.22); CUDA, TP=1, two visible GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from repro.models.deterministic import safetensors_manifest
from repro.patches import bind
from repro.scenarios.vocab import ScenarioFailed, ScenarioUnsupported

# --------------------------------------------------------------------------- transfer: detection


def _import_qualname(qualname: str) -> Any:
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _takes(fn: Any, name: str) -> bool | None:
    """Whether ``fn`` takes keyword ``name``: True/False, None when it only forwards ``**kwargs``."""
    params = inspect.signature(fn).parameters
    if name in params:
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return False


def _params(fn: Any) -> str:
    return ", ".join(n for n in inspect.signature(fn).parameters if n != "self")


def reload_unsupported(worker_probes: list[dict[str, Any]]) -> str | None:
    """Why the engine's workers cannot reload weights from another checkpoint in place, or None.

    Decided from the classes the workers really run (their probe reports them):
    the worker's ``reload_weights`` forwards to its model runner's, which must
    take ``weights_path`` (vLLM 0.14/0.15 only reload the original checkpoint).
    """
    if not worker_probes:
        return "the workers did not report their classes (worker probe unavailable); cannot tell if reload works"
    for probe in worker_probes:
        chain = [probe.get("worker_class"), probe.get("model_runner_class")]
        if not all(chain):
            return f"a worker did not report its worker/model-runner classes: {probe}"
        for qualname in chain:
            try:
                cls = _import_qualname(str(qualname))
            except (ImportError, AttributeError) as exc:
                return f"cannot import {qualname} to inspect reload_weights: {exc!r}"
            fn = getattr(cls, "reload_weights", None)
            if fn is None:
                return f"{qualname} has no reload_weights(): this vLLM cannot update weights in place"
            takes = _takes(fn, "weights_path")
            if takes is True:
                break
            if takes is False:
                return (f"{qualname}.reload_weights({_params(fn)}) takes no weights_path=: this vLLM "
                        "reloads only the checkpoint it started with (weights_path arrived in vLLM 0.16)")
        else:
            # Both only forward **kwargs: vLLM 0.22-0.25's v2 runner forwards
            # to the v1 GPUModelRunner.reload_weights; judge that one.
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner

            if not _takes(GPUModelRunner.reload_weights, "weights_path"):
                return (f"{chain[-1]}.reload_weights forwards to GPUModelRunner.reload_weights, "
                        "which takes no weights_path=")
    return None


def nccl_unsupported(llm: Any, tp: int) -> str | None:
    """Why the NCCL weight-transfer path of vLLM 0.21/0.22 cannot run on this engine, or None."""
    import torch

    if not torch.cuda.is_available():
        return ("NCCL weight transfer needs CUDA GPUs (a trainer process on a second GPU); this engine has none: "
                "use weight_transfer=reload")
    if tp != 1:
        return f"NCCL weight transfer is implemented for tensor_parallel_size=1 (one receiving worker); got {tp}"
    gpus = trainer_gpu_candidates(tp)
    if not gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return (f"NCCL weight transfer needs a GPU for the trainer besides the engine's {tp}: "
                f"{torch.cuda.device_count()} visible (CUDA_VISIBLE_DEVICES={visible!r})")
    cls = type(llm)
    for name in ("init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update"):
        if not hasattr(cls, name):
            return (f"AsyncLLM has no {name}(): this vLLM's weight-transfer API differs from the 0.21/0.22 shape "
                    "(init/start/update/finish) this scenario implements")
    if not _takes(cls.start_weight_update, "is_checkpoint_format"):
        return (f"AsyncLLM.start_weight_update({_params(cls.start_weight_update)}) takes no "
                "is_checkpoint_format=: a weight-transfer API newer than the 0.21/0.22 shape this scenario implements")
    try:
        from vllm.distributed.weight_transfer import nccl_engine as ne
    except ImportError as exc:
        return f"vllm.distributed.weight_transfer.nccl_engine does not import: {exc!r}"
    wanted = {
        "NCCLWeightTransferInitInfo": {"master_address", "master_port", "rank_offset", "world_size"},
        "NCCLWeightTransferUpdateInfo": {"names", "dtype_names", "shapes", "packed"},
        "NCCLTrainerSendWeightsArgs": {"group", "packed"},
    }
    for name, need in wanted.items():
        dc = getattr(ne, name, None)
        have = {f.name for f in dataclasses.fields(dc)} if dc is not None and dataclasses.is_dataclass(dc) else set()
        if not need <= have:
            return f"nccl_engine.{name} lacks {sorted(need - have)}: not the 0.21/0.22 weight-transfer API"
    engine_cls = getattr(ne, "NCCLWeightTransferEngine", None)
    if not (hasattr(engine_cls, "trainer_init") and hasattr(engine_cls, "trainer_send_weights")):
        return "NCCLWeightTransferEngine has no trainer_init/trainer_send_weights: not the 0.21/0.22 API"
    cfg = getattr(llm.vllm_config, "weight_transfer_config", None)
    if cfg is None or getattr(cfg, "backend", None) != "nccl":
        return (f"the engine was started with weight_transfer_config={cfg!r}; the NCCL path needs "
                "WeightTransferConfig(backend='nccl') at start (repro.engine.main sets it when the spec lists an nccl "
                "weight_sync scenario)")
    return None


def trainer_gpu_candidates(tp: int) -> list[str]:
    """Visible GPU ids after the engine's first ``tp`` (the engine's workers use ``cuda:0..tp-1``)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is not None:
        ids = [g.strip() for g in raw.split(",") if g.strip() and g.strip() != "-1"]
    else:
        import torch

        ids = [str(i) for i in range(torch.cuda.device_count())]
    return ids[tp:]


# --------------------------------------------------------------------------- transfer: the two paths


async def reload_transfer(llm: Any) -> ReloadTransfer:
    """The in-place transfer, once the workers said they can reload; else ScenarioUnsupported with why not."""
    try:
        probes = await llm.collective_rpc("repro_worker_probe")
    except Exception as exc:
        raise ScenarioUnsupported(f"cannot ask the workers for their classes: {exc!r}") from exc
    reason = reload_unsupported(list(probes or []))
    if reason:
        raise ScenarioUnsupported(reason)
    return ReloadTransfer(llm)


class ReloadTransfer:
    """In place: every worker reloads its weights from a checkpoint folder (vLLM's reload_weights)."""

    name = "reload"

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    async def open(self) -> dict[str, Any]:
        return {}

    async def load(self, checkpoint: Path) -> dict[str, Any]:
        t0 = time.monotonic()
        await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(checkpoint)})
        # The server door's HttpLLM says how the call travelled (POST /collective_rpc); AsyncLLM calls in-process.
        via = getattr(self.llm, "rpc_via", "AsyncLLM.collective_rpc")
        return {"transfer": self.name, "via": via, "checkpoint": str(checkpoint),
                "seconds": round(time.monotonic() - t0, 3)}

    async def close(self) -> None:
        return None


TRAINER_TAG = "@@repro-trainer "


class NcclTransfer:
    """The example's NCCL path: a trainer process on another GPU broadcasts, the engine receives.

    The trainer is rank 0 of a two-rank group, the engine's single worker rank
    1 (``rank_offset=1``).  Per update: ``start_weight_update(is_checkpoint_format=True)``,
    then ``update_weights`` and the trainer's broadcast together, then
    ``finish_weight_update`` (vLLM 0.21/0.22).
    """

    name = "nccl"

    def __init__(self, llm: Any, tp: int, timeout: float, log_dir: Path) -> None:
        self.llm = llm
        self.timeout = timeout
        self.gpu = trainer_gpu_candidates(tp)[0]
        self.log_path = log_dir / "weight-trainer.log"
        self.proc: asyncio.subprocess.Process | None = None
        self._log: Any = None

    async def _ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise ScenarioFailed("the weight trainer is not running")
        proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await proc.stdin.drain()
        while True:
            raw = await asyncio.wait_for(proc.stdout.readline(), self.timeout)
            if not raw:
                raise ScenarioFailed(f"the weight trainer exited during {cmd['op']!r} (log: {self.log_path})")
            line = raw.decode(errors="replace")
            if not line.startswith(TRAINER_TAG):
                self._log.write(line)  # vLLM's own logging on the trainer's stdout
                self._log.flush()
                continue
            reply = json.loads(line[len(TRAINER_TAG):])
            if not reply.get("ok"):
                raise ScenarioFailed(f"weight trainer {cmd['op']!r} failed: {reply.get('error')}")
            return dict(reply)

    async def open(self) -> dict[str, Any]:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferInitInfo

        env = {**os.environ, "CUDA_VISIBLE_DEVICES": self.gpu}
        # The trainer is a plain process on a GPU of its own: no plugin of ours
        # needs to act in it, and NVLink multicast stays off on shared hosts.
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "repro.scenarios.weight_trainer",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self._log, env=env,
        )
        port = _free_port()
        # The trainer is rank 0: vLLM's StatelessProcessGroup binds its store to exactly this address
        # (vllm/distributed/utils.py 461-466 in 0.21.0), the run's bind address (repro.patches.bind, --bind).
        master = bind.connect_host(bind.address())
        init = NCCLWeightTransferInitInfo(master_address=master, master_port=port, rank_offset=1, world_size=2)
        t0 = time.monotonic()
        trainer, _ = await asyncio.gather(
            self._ask({"op": "init", "master_address": master, "master_port": port, "world_size": 2}),
            asyncio.wait_for(self.llm.init_weight_transfer_engine(
                WeightTransferInitRequest(init_info=dataclasses.asdict(init))), self.timeout),
        )
        return {"trainer_gpu": self.gpu, "trainer_device": trainer.get("device"), "master_port": port,
                "init_seconds": round(time.monotonic() - t0, 3)}

    async def load(self, checkpoint: Path) -> dict[str, Any]:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

        manifest = safetensors_manifest(checkpoint / "model.safetensors")
        info = NCCLWeightTransferUpdateInfo(
            names=[m[0] for m in manifest], dtype_names=[m[1] for m in manifest],
            shapes=[list(m[2]) for m in manifest], packed=True,
        )
        t0 = time.monotonic()
        await self.llm.start_weight_update(is_checkpoint_format=True)
        sent, _ = await asyncio.gather(
            self._ask({"op": "send", "checkpoint": str(checkpoint), "names": info.names, "packed": True}),
            asyncio.wait_for(self.llm.update_weights(
                WeightTransferUpdateRequest(update_info=dataclasses.asdict(info))), self.timeout),
        )
        await self.llm.finish_weight_update()
        return {"transfer": self.name, "checkpoint": str(checkpoint), "tensors": sent.get("tensors"),
                "bytes": sent.get("bytes"), "seconds": round(time.monotonic() - t0, 3)}

    async def close(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(Exception):
                await self._ask({"op": "stop"})
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._log is not None:
            self._log.close()


def _free_port() -> int:
    """The trainer's NCCL rendezvous port: the highest free one of this engine's block (``harness.run.ports``
    leases it; vLLM scans up from its bottom), so no engine started beside this one can pick it between this
    probe and the bind (issue 21).  Without a block, one the kernel gives, as before."""
    lo, _, hi = os.environ.get("VLLM_REPRO_PORT_RANGE", "").partition("-")
    candidates = range(int(hi) - 1, int(lo) - 1, -1) if lo.isdigit() and hi.isdigit() else range(0)
    for port in [*candidates, 0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((bind.connect_host(bind.address()), port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError("no free port for the trainer's rendezvous")
