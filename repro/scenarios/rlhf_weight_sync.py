"""RLHF weight sync: the flow of upstream's ``examples/rl/rlhf_async_new_apis.py``.

Generate with weights A, pause in keep mode once every running request has
``pause_after`` tokens, swap the engine's weights to B, resume, and check every
token.  A and B are bigram-cycle checkpoints of the same shape whose cycles
differ at every token (``repro.models.swap_partner``), so the stream a request
must produce is known exactly: A's cycle up to the pause, then B's cycle from
the last pre-pause token (``repro.models.swapped_continuation``).  The first
post-resume token must be ``perm_B[last pre-pause token]``; vLLM #42043 (keep
+ clear_cache + async scheduling, fixed by PR #42117 in 0.22.0) drops it.

Weight transfer (``weight_transfer`` parameter):

* ``reload``: in place through vLLM's weight-update API,
  ``collective_rpc("reload_weights", kwargs={"weights_path": B})``; runs on
  CPU and on one GPU.
* ``nccl``: the example's NCCL path: a trainer process (``repro.weight_trainer``)
  on the next visible GPU broadcasts B's tensors while the engine receives them
  with ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``
  (the API shape of vLLM 0.21/0.22); CUDA, TP=1, two visible GPUs.

The computed reference is cross-checked against vLLM, as upstream does: after
the run, while the engine still holds B, prompt + pre-pause tokens go in as new
requests and must continue exactly like the reference (and, with
``fresh_engine_check``, the same on a fresh engine loaded with B).  A
disagreement is an ERROR carrying both sequences, never a verdict.  Weights A
are restored (and checked) afterwards: later scenarios of the engine assume A.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.models import (
    build_checkpoint,
    expected_continuation,
    load_perm,
    safetensors_manifest,
    swap_partner,
    swapped_continuation,
)
from repro.scenarios._common import SinglePauseParams, single_pause_plan
from repro.scenarios.base import (
    REFERENCE_MARGIN,
    EngineContext,
    PauseAction,
    PauseSpec,
    Plan,
    RequestSpec,
    ScenarioFailed,
    ScenarioUnsupported,
    check_pause_api,
    check_reset_api,
    params_from_dict,
    reset_action,
    run_plan,
    run_reference,
    run_unpaused,
)

TRANSFERS = ("reload", "nccl")
MODES = ("keep",)
# Tokens generated after restoring A to check the engine really holds A again.
RESTORE_CHECK_TOKENS = 4


@dataclass(frozen=True)
class WeightSyncParams:
    mode: str = "keep"
    clear_cache: bool = True
    weight_transfer: str = "reload"
    # Also cross-check on a fresh engine loaded with B (an engine start: ~30 s
    # on a small CPU; meant for GPUs, where the same-engine check always runs too).
    fresh_engine_check: bool = False
    # The manual-reset-reload variant: pause with clear_cache=False, swap, then the client's own
    # reset_prefix_cache(reset_running_requests=True), as RL frameworks write it (repro.scenarios.manual_reset).
    explicit_reset: bool = False
    num_requests: int = 8
    extra_requests: int = 2
    prompt_len: int = 6
    max_tokens: int = 48
    pause_after: int = 8

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"weight_sync mode {self.mode!r}: the RLHF flow pauses in {'/'.join(MODES)} mode only")
        if self.weight_transfer not in TRANSFERS:
            raise ValueError(f"unknown weight_transfer {self.weight_transfer!r}; valid: {', '.join(TRANSFERS)}")
        if self.explicit_reset and self.clear_cache:
            raise ValueError("explicit_reset pauses with clear_cache=False: the reset is the client's explicit call")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WeightSyncParams:
        return params_from_dict(cls, data, "weight_sync parameters")

    def pause_params(self) -> SinglePauseParams:
        return SinglePauseParams(
            clear_cache=self.clear_cache, num_requests=self.num_requests, extra_requests=self.extra_requests,
            prompt_len=self.prompt_len, max_tokens=self.max_tokens, pause_after=self.pause_after,
        )


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    """The requests and the pause; the swap is attached by :func:`run`."""
    p = WeightSyncParams.from_dict(params)
    # Requests submitted during the pause start after resume, i.e. under B.
    return single_pause_plan(sid, p.mode, p.pause_params(), vocab_size, seed, "during")


# --------------------------------------------------------------------------- reference


def swap_index(record: dict[str, Any]) -> int:
    """How many of the record's tokens were generated with weights A.

    A request running at the pause holds exactly its pre-pause tokens when the
    weights change (keep mode freezes it and the client has caught up with the
    engine before the swap); one submitted during or after the pause starts
    under B; one that ended before the pause ran under A throughout.
    """
    pauses = record.get("pauses") or []
    if pauses:
        return int(pauses[0]["client_tokens"])
    submit = record.get("submit")
    if submit in ("start", None):
        return int(record["max_tokens"]) + REFERENCE_MARGIN
    return 0


def computed_reference(record: dict[str, Any], perm_a: list[int], perm_b: list[int]) -> list[int]:
    """The stream ``record`` must show: A's cycle for its pre-swap tokens, B's after (plus a margin)."""
    n = int(record["max_tokens"]) + REFERENCE_MARGIN
    return swapped_continuation(perm_a, perm_b, record["prompt"][-1], swap_index(record), n)


def cross_check_request(rid: str, record: dict[str, Any], reference: list[int]) -> tuple[RequestSpec, list[int]] | None:
    """Prompt + pre-swap tokens as a new request, and what an engine holding B must answer.

    Built from the *computed* reference (not the observed stream), so a
    scheduler fault before the pause stays a verdict of the oracle and the
    check tests the reference itself.  None when nothing was generated under B.
    """
    n_a = swap_index(record)
    if n_a >= len(reference):
        return None
    return RequestSpec(rid, list(record["prompt"]) + reference[:n_a], len(reference) - n_a), reference[n_a:]


def disagreements(checked: list[tuple[str, list[int], list[int]]]) -> list[str]:
    """One line per (rid, computed, engine) triple whose engine stream differs from the computed one."""
    out = []
    for rid, expected, got in checked:
        if got != expected:
            diff = [i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b]
            at = diff[0] if diff else min(len(expected), len(got))
            out.append(f"{rid}: computed {expected} but the engine holding B gave {got} (first difference at {at})")
    return out


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
                "WeightTransferConfig(backend='nccl') at start (repro.engine sets it when the spec lists an nccl "
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
        return {"transfer": self.name, "checkpoint": str(checkpoint), "seconds": round(time.monotonic() - t0, 3)}

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
            sys.executable, "-m", "repro.weight_trainer",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self._log, env=env,
        )
        port = _free_port()
        init = NCCLWeightTransferInitInfo(master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2)
        t0 = time.monotonic()
        trainer, _ = await asyncio.gather(
            self._ask({"op": "init", "master_address": "127.0.0.1", "master_port": port, "world_size": 2}),
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
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError("no free port for the trainer's rendezvous")


async def _transfer_for(params: WeightSyncParams, llm: Any, ctx: EngineContext, timeout: float) -> Any:
    """The transfer path asked for, or ScenarioUnsupported with the reason it cannot run here."""
    if params.weight_transfer == "reload":
        try:
            probes = await llm.collective_rpc("repro_worker_probe")
        except Exception as exc:
            raise ScenarioUnsupported(f"cannot ask the workers for their classes: {exc!r}") from exc
        reason = reload_unsupported(list(probes or []))
        if reason:
            raise ScenarioUnsupported(reason)
        return ReloadTransfer(llm)
    reason = nccl_unsupported(llm, ctx.tensor_parallel_size)
    if reason:
        raise ScenarioUnsupported(reason)
    return NcclTransfer(llm, ctx.tensor_parallel_size, timeout, ctx.work_dir)


# --------------------------------------------------------------------------- the scenario


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Play the weight-sync scenario ``sc`` on ``llm`` (holding A); return the scenario event's data."""
    t0 = time.monotonic()
    params = WeightSyncParams.from_dict(sc.get("params", {}))
    if ctx.perm is None:
        raise ScenarioUnsupported(
            f"the weight-sync scenario computes every post-swap token from two bigram-cycle checkpoints A and B; "
            f"with the {ctx.model_kind} model there is no checkpoint B whose stream is known (run it with "
            "--model bigram-cycle, the default)")
    sid = sc["id"]
    plan = build(sid, sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    check_pause_api(llm)
    if params.explicit_reset:
        check_reset_api(llm)
    transfer = await _transfer_for(params, llm, ctx, timeout)

    spec_b = swap_partner(ctx.model_spec)
    dir_b = build_checkpoint(spec_b, ctx.model_cache)
    perm_a, perm_b = ctx.perm, load_perm(dir_b)

    # The engine's own no-pause streams under A: it must hold A when we start.
    engine_a = await run_reference(llm, plan, timeout, sid)
    summary: dict[str, Any] = {
        "transfer": transfer.name,
        "checkpoint_a": {"key": ctx.model_spec.key(), "seed": ctx.model_spec.seed, "path": str(ctx.model_dir)},
        "checkpoint_b": {"key": spec_b.key(), "seed": spec_b.seed, "path": str(dir_b)},
    }
    try:
        summary["open"] = await transfer.open()
    except BaseException:
        await transfer.close()
        raise
    try:
        swap = PauseSpec(plan.pauses[0].mode, plan.pauses[0].clear_cache, plan.pauses[0].after_tokens,
                         action=_swap_action(llm, transfer, dir_b, params.explicit_reset))
        records, events = await run_plan(llm, Plan(plan.requests, [swap]), timeout)
        if not any(e.get("event") == "pause_action" for e in events):
            raise ScenarioFailed("the weights were never swapped (the pause did not happen)")
        refs = {r["rid"]: computed_reference(r, perm_a, perm_b) for r in records}
        # Cross-check on this engine while it still holds B.
        checks = [(r["rid"], c) for r in records if (c := cross_check_request(f"{sid}-xchk-{r['rid']}", r,
                                                                               refs[r["rid"]])) is not None]
        got = await run_unpaused(llm, [c[0] for _, c in checks], timeout, "cross-check")
        engine_check = [(rid, c[1], g) for (rid, c), g in zip(checks, got, strict=True)]
    finally:
        summary["restore"] = await _restore_a(llm, transfer, ctx, plan, timeout)
    fresh_check: list[tuple[str, list[int], list[int]]] | None = None
    if params.fresh_engine_check:
        fresh_check = await _fresh_engine_check(ctx, dir_b, checks, timeout)

    bad = disagreements(engine_check) + [f"fresh engine: {d}" for d in disagreements(fresh_check or [])]
    if bad:
        raise ScenarioFailed(
            f"cross-check against vLLM disagrees with the computed A-then-B reference in {len(bad)} request(s); "
            "the reference (not the scheduler) is in doubt: " + "; ".join(bad)
        )
    by_engine = {rid: g for rid, _, g in engine_check}
    by_fresh = {rid: g for rid, _, g in fresh_check or []}
    for rec in records:
        rid = rec["rid"]
        ref = refs[rid]
        n_a = swap_index(rec)
        a_stream = engine_a[rid]
        a_ok = a_stream == expected_continuation(perm_a, rec["prompt"][-1], len(a_stream))
        rec["reference"] = ref
        # The oracle's model check: the engine followed A's cycle without a
        # pause, and B's from the swap point on (checked above, or ERROR).
        rec["reference_matches_model"] = a_ok
        last = ref[n_a - 1] if 0 < n_a <= len(ref) else rec["prompt"][-1]
        rec["weight_sync"] = {
            "transfer": summary.get("transfer"),  # kept per request: the harness stores records, not the summary
            "swap_index": n_a,
            "last_pre_swap_token": last,
            "expected_first_post_swap": ref[n_a] if n_a < len(ref) else None,
            "observed_first_post_swap": rec["observed"][n_a] if n_a < len(rec["observed"]) else None,
            "engine_a_stream_matches": a_ok,
            "cross_check_engine": rid in by_engine,
            "cross_check_fresh_engine": rid in by_fresh if fresh_check is not None else None,
        }
    summary["cross_check"] = {"same_engine": len(engine_check),
                              "fresh_engine": None if fresh_check is None else len(fresh_check), "agree": True}
    return {"records": records, "events": events, "duration_s": round(time.monotonic() - t0, 3),
            "weight_sync": summary}


def _swap_action(llm: Any, transfer: Any, checkpoint: Path, explicit_reset: bool) -> PauseAction:
    """Load ``checkpoint``; then, for the manual-reset variant, reset the prefix cache with the requests frozen."""
    reset = reset_action(llm) if explicit_reset else None

    async def act() -> dict[str, Any]:
        info = await transfer.load(checkpoint)
        return {**info, **(await reset())} if reset is not None else info

    return act


async def _restore_a(llm: Any, transfer: Any, ctx: EngineContext, plan: Plan, timeout: float) -> dict[str, Any]:
    """Load A again, shut the transfer down, and check the engine follows A's cycle."""
    try:
        info = await asyncio.wait_for(transfer.load(ctx.model_dir), timeout)
    finally:
        await transfer.close()
    probe = plan.requests[0]
    (got,) = await run_unpaused(
        llm, [RequestSpec(f"{probe.rid}-restore-check", probe.prompt, RESTORE_CHECK_TOKENS)], timeout, "restore check")
    want = expected_continuation(ctx.perm, probe.prompt[-1], RESTORE_CHECK_TOKENS)
    if got != want:
        raise ScenarioFailed(f"weights A were not restored: after reloading A the engine gave {got}, A gives {want}")
    return {**info, "verified": True}


async def _fresh_engine_check(
    ctx: EngineContext, dir_b: Path, checks: list[tuple[str, tuple[RequestSpec, list[int]]]], timeout: float,
) -> list[tuple[str, list[int], list[int]]]:
    """Upstream's validation: the same cross-check requests on a new engine started with B."""
    fresh = ctx.start_engine(dir_b)
    try:
        got = await run_unpaused(fresh, [c[0] for _, c in checks], timeout, "fresh-engine cross-check")
    finally:
        fresh.shutdown()
    return [(rid, c[1], g) for (rid, c), g in zip(checks, got, strict=True)]
