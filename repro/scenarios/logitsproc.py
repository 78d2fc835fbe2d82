"""What a stateful logits processor installed as a plugin is shown as each request's output tokens (vllm#52461).

vLLM hands every logits processor a live reference to each request's output-token list.  Under async scheduling
the worker appends a ``-1`` placeholder for the token still being sampled and writes the real id back only when
``InputBatch.logitsprocs_need_output_token_ids`` is set, which ``GPUModelRunner`` (and the ``CPUModelRunner``
subclassing it) sets to ``bool(custom_logitsprocs)``: processors passed as ``logits_processors=`` count,
processors installed as ``vllm.logits_processors`` entry-point plugins (the report's case) do not.  (A fix
PR said in the thread to make every processor declare whether it reads the ids was not checked in vLLM's source.)

Runs on the ``logitsproc-plugin`` engine profile (``harness.core.profiles.PROFILES``), whose engine alone gets a
dist-info declaring ``repro.probes.logitsprocs:RecordingProcessor`` as such a plugin: it changes no logit and
is not argmax-invariant (so vLLM calls it for greedy requests), and it appends, at every step, the output ids it
is shown for every request to ``repro-logitsproc-steps.jsonl`` in the engine's work dir.

Every request runs to the end at once; then each request's record is judged on *what the processor was shown*:
its ``observed`` stream is the first snapshot that differs from the tokens vLLM returned (else the last one), its
``reference`` the tokens vLLM returned, so a ``-1`` shown where a real token was is ``DIVERGED`` at that index.
The returned tokens must follow the bigram cycle (the processor changes nothing), as every profile scenario's
reference must.  A run in which the processor saw no request states a failed precondition (UNSUPPORTED).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.probes.logitsprocs import DEFAULT_LOG, prompt_key
from repro.scenarios._profile import attach_references, precondition
from repro.scenarios.runs import run_plan
from repro.scenarios.vocab import EngineContext, Plan, RequestSpec, make_prompts, params_from_dict


@dataclass(frozen=True)
class LogitsprocParams:
    num_requests: int = 4  # all submitted at once
    prompt_len: int = 8
    max_tokens: int = 16

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LogitsprocParams:
        return params_from_dict(cls, data, "logitsproc parameters")


def build(sid: str, params: dict[str, Any], vocab_size: int, seed: int) -> Plan:
    p = LogitsprocParams.from_dict(params)
    prompts = make_prompts(p.num_requests, p.prompt_len, vocab_size, seed)
    return Plan([RequestSpec(f"{sid}-r{i:02d}", prompts[i], p.max_tokens) for i in range(p.num_requests)], [])


def read_snapshots(path: Path) -> dict[str, list[list[int]]]:
    """Every snapshot the processor logged, per request key, in step order."""
    out: dict[str, list[list[int]]] = {}
    for line in path.read_text().splitlines() if path.is_file() else ():
        for key, ids in json.loads(line)["rows"].items():
            out.setdefault(key, []).append(ids)
    return out


def judge_record(rec: dict[str, Any], snaps: list[list[int]]) -> dict[str, Any]:
    """``rec`` (a driver record) judged on what the processor was shown: observed = the first wrong snapshot, else
    the last; reference = what vLLM returned; the counts go beside them."""
    returned = list(rec["observed"])
    wrong = [s for s in snaps if s != returned[:len(s)]]
    shown = wrong[0] if wrong else (snaps[-1] if snaps else [])
    return {**rec, "observed": shown, "max_tokens": len(shown), "returned": returned,
            "snapshots": len(snaps), "snapshots_wrong": len(wrong),
            "snapshots_with_minus_one": sum(-1 in s for s in snaps)}


async def run(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float) -> dict[str, Any]:
    """Every request at once; then what the processor was shown, per request, against what vLLM returned."""
    t0 = time.monotonic()
    plan = build(sc["id"], sc.get("params", {}), len(ctx.perm), int(sc.get("seed", 0)))
    log = Path.cwd() / DEFAULT_LOG
    log.unlink(missing_ok=True)  # an earlier scenario on this engine
    records, events = await run_plan(llm, plan, timeout)
    snaps = read_snapshots(log)
    judged = [judge_record(rec, snaps.get(prompt_key(rec["prompt"]), [])) for rec in records]
    refs = {rec["rid"]: rec["returned"] for rec in judged}
    attach_references(judged, refs, ctx.perm)
    seen = sum(1 for rec in judged if rec["snapshots"])
    facts = {"event": "logitsproc", "snapshots": sum(r["snapshots"] for r in judged),
             "snapshots_wrong": sum(r["snapshots_wrong"] for r in judged),
             "snapshots_with_minus_one": sum(r["snapshots_with_minus_one"] for r in judged),
             "requests_seen": seen}
    cond = precondition(seen == len(judged), f"the plugin processor saw {seen}/{len(judged)} requests "
                        f"({facts['snapshots']} snapshots)",
                        f"precondition not met: the plugin processor saw {seen}/{len(judged)} requests "
                        f"(no {DEFAULT_LOG} entry for the rest): vLLM did not load or call it", facts)
    return {"records": judged, "events": [*events, facts], "duration_s": round(time.monotonic() - t0, 3),
            "precondition": cond}
