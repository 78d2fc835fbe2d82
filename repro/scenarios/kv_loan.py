"""vLLM 0.34.0's KV loan: a weight update mid-generation that borrows (or must not borrow) the KV cache's memory.

The weight-sync flow (``repro.scenarios.rlhf_weight_sync``: keep pause, reload weights B in place, resume, every
token against the A-then-B reference) on an engine whose KV cache is *extensible* (the ``extensible-kv`` profile,
alone on its GPU: asked for with ``kv_cache_memory_bytes`` or ``num_gpu_blocks_override``, vLLM refuses it,
vllm/config/vllm.py:3203-3212, 3262-3263), with the update forced short of memory (``repro.probes.kv_loan``):

* ``clear_cache=True``: the pause resets the prefix cache with the kept requests preempted and marks the KV
  memory reclaimable (``_finish_pause``, vllm/v1/engine/core.py:1005-1007), so ``reload_weights`` lends the KV
  cache's pages to the update and maps fresh zeroed ones after it (``kv_cache_lent_for_weight_update``,
  vllm/v1/worker/extensible_kv_cache.py:717-801; ``Worker.reload_weights``, vllm/v1/worker/gpu_worker.py:645-665).
  Every kept request must be recomputed into the new pages and continue with B exactly.
* ``clear_cache=False``: the kept requests hold their KV blocks, nothing is reclaimable, so the update must lend
  nothing (vLLM warns and updates in place) and the kept requests continue on their KV.

Evidence, from the workers' own counters (the precondition; a cell whose event did not happen is UNSUPPORTED):
the reclaimable flag at the moment of the update, the ``release_physical`` / ``recommit`` calls it made, and the
flag again after the resume (``resume_scheduler`` clears it, core.py:1070).  A loan with kept requests holding KV
(``clear_cache=False``) would hand their pages to the update: that is reported as a finding, not hidden.

Before 0.34.0 there is no extensible KV cache: vLLM refuses the profile's ``enable_extensible_kv_cache`` at
start-up (UNSUPPORTED with its message); on CPU vLLM refuses it too ("only supported on CUDA and ROCm").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.scenarios._profile import precondition
from repro.scenarios.rlhf_weight_sync import run as weight_sync_run
from repro.scenarios.vocab import EngineContext, ScenarioFailed, ScenarioUnsupported, params_from_dict

MODES = ("keep",)


@dataclass(frozen=True)
class KvLoanParams:
    mode: str = "keep"
    clear_cache: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"kv_loan mode {self.mode!r}: the weight update pauses in {'/'.join(MODES)} mode only")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KvLoanParams:
        known = {k: v for k, v in data.items() if k in ("mode", "clear_cache")}
        return params_from_dict(cls, known, "kv_loan parameters")


async def loan_state(llm: Any, force: bool | None = None) -> dict[str, Any]:
    """The first worker's ``repro_kv_loan`` answer (every worker is asked; TP ranks answer alike)."""
    try:
        got = list(await llm.collective_rpc("repro_kv_loan", kwargs={"force": force}))
    except Exception as exc:
        raise ScenarioUnsupported(f"the workers cannot report their KV loan: {exc!r}") from exc
    return dict(got[0]) if got else {"available": False, "why": "no worker answered"}


def loan_problem(state: dict[str, Any]) -> str | None:
    """Why this engine cannot show a KV loan, or None."""
    if not state.get("available"):
        return str(state.get("why") or "no KV-loan probe in the workers")
    if not state.get("extensible"):
        return ("the engine's KV cache is not extensible (vLLM turned enable_extensible_kv_cache off: no VMM, a fixed "
                "kv_cache_memory_bytes or num_gpu_blocks_override, or a connector that cannot): no loan is possible")
    return None


class LoanWatch:
    """The transfer, with the workers' loan state read around each load (the first load is the swap to B)."""

    def __init__(self, llm: Any, inner: Any) -> None:
        self.llm, self.inner, self.name = llm, inner, inner.name
        self.loads: list[dict[str, Any]] = []

    async def open(self) -> dict[str, Any]:
        return dict(await self.inner.open())

    async def load(self, checkpoint: Path) -> dict[str, Any]:
        before = await loan_state(self.llm)
        info = dict(await self.inner.load(checkpoint))
        after = await loan_state(self.llm)
        self.loads.append({
            "checkpoint": str(checkpoint),
            "reclaimable": before.get("reclaimable"),
            "released": int(after.get("release_physical_calls", 0)) - int(before.get("release_physical_calls", 0)),
            "recommitted": int(after.get("recommit_calls", 0)) - int(before.get("recommit_calls", 0)),
            "physical_bytes_after": after.get("physical_bytes"),
        })
        return info

    async def close(self) -> None:
        await self.inner.close()


def judge(clear_cache: bool, swap: dict[str, Any], resumed: dict[str, Any]) -> dict[str, Any]:
    """The precondition of a kv-loan cell from the swap's loan record and the state after the run."""
    evidence = {"swap": swap, "reclaimable_after_resume": resumed.get("reclaimable"), "factor": resumed.get("factor")}
    if not clear_cache and swap["released"]:
        raise ScenarioFailed(f"the weight update borrowed the KV cache's memory ({swap['released']} release(s)) while "
                             "kept requests held their KV blocks (pause without clear_cache): their KV was handed "
                             "to the update")
    if clear_cache:
        met = bool(swap["reclaimable"]) and swap["released"] >= 1 and swap["recommitted"] >= 1
        what = (f"the weight update borrowed the KV cache's memory after the clear_cache pause (released "
                f"{swap['released']}, recommitted {swap['recommitted']}) and the kept requests were recomputed")
        why = (f"precondition not met: no KV loan (reclaimable at the update: {swap['reclaimable']}, released "
               f"{swap['released']}, recommitted {swap['recommitted']})")
    else:
        met = swap["reclaimable"] is False
        what = "the weight update ran short of memory without a loan: the kept requests' KV stayed in place"
        why = f"precondition not met: the KV cache was reclaimable ({swap['reclaimable']}) at the update"
    return precondition(met, what, why, evidence)


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """The weight-sync run under a forced KV loan; its result carries the loan as the precondition."""
    params = KvLoanParams.from_dict(sc.get("params", {}))
    problem = loan_problem(await loan_state(llm))
    if problem:
        raise ScenarioUnsupported(problem)
    watches: list[LoanWatch] = []

    def watch(transfer: Any) -> LoanWatch:
        watches.append(LoanWatch(llm, transfer))
        return watches[-1]

    await loan_state(llm, force=True)
    try:
        ws = {**sc, "params": {**sc.get("params", {}), "weight_transfer": "reload"}}
        result = await weight_sync_run(llm, ws, ctx, timeout, watch=watch)
    finally:
        resumed = await loan_state(llm, force=False)
    if not watches or not watches[0].loads:
        raise ScenarioFailed("the weights were never swapped: no load to judge the KV loan by")
    result["precondition"] = judge(params.clear_cache, watches[0].loads[0], resumed)
    result["precondition"]["evidence"]["loads"] = watches[0].loads  # the swap to B, then A restored after the resume
    return result
