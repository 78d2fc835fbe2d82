"""The shape sweeps behind docs/upstream-bugs.md: write a ``python -m repro.sched`` spec, or summarise its output.

    python sweep.py spec chunked|deferred SPEC.json            # the scenarios (no vLLM needed)
    ENV/bin/python -m repro.sched SPEC.json OUT.jsonl            # from the worktree root (repro on sys.path)
    python sweep.py summary OUT.jsonl > SUMMARY.json             # counts per status / outcome, and totals

chunked (vllm#57562): chunked_burst over waves x per_wave x step budget x prompt lengths x depth x prefix
caching x seeds.  deferred (vllm#49674): deferred_free_pressure over requests x KV blocks x max_tokens x depth,
each with the null consumer connector and without it (kv_consumer false, the control).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import Counter
from pathlib import Path

MODEL_CACHE = "/root/.cache/vllm-repro/models"


def chunked() -> list[dict]:
    out = []
    for waves, per_wave, budget, (lo, hi), depth, apc, seed in itertools.product(
            (2, 3, 4), (4, 8, 12), (16, 32, 64), ((20, 60), (40, 120), (100, 250)), (2, 3), (True, False),
            (0, 1, 2)):
        params = {"waves": waves, "per_wave": per_wave, "max_num_batched_tokens": budget, "max_num_seqs": 16,
                  "prompt_min": lo, "prompt_max": hi, "depth": depth, "enable_prefix_caching": apc,
                  "gap": 2 + seed}
        out.append({"id": f"cb-w{waves}x{per_wave}-b{budget}-p{lo}_{hi}-d{depth}-apc{int(apc)}-s{seed}",
                    "scenario": "chunked_burst", "params": params, "seed": seed})
    return out


def deferred() -> list[dict]:
    out = []
    for n, blocks, max_tokens, depth, consumer in itertools.product(
            (4, 6, 8), (5, 7, 9, 12), (40, 80), (2, 3), (True, False)):
        params = {"n_requests": n, "num_blocks": blocks, "max_tokens": max_tokens, "depth": depth,
                  "kv_consumer": consumer, "max_model_len": 256}
        out.append({"id": f"dfp-n{n}-b{blocks}-t{max_tokens}-d{depth}-kv{int(consumer)}",
                    "scenario": "deferred_free_pressure", "params": params, "seed": 0})
    return out


def summary(path: str) -> dict:
    status: Counter[str] = Counter()
    rows = []
    version = None
    for line in Path(path).read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "sched":
            version = e.get("vllm_version")
        if e["event"] != "scenario":
            continue
        recs = e.get("records") or []
        ok = sum(r["observed"] == r["reference"][:r["max_tokens"]] and r["finish_reason"] is not None for r in recs)
        kind = e["status"] if e["status"] != "ran" else ("stalled" if e.get("stalled") else
                                                          ("ok" if ok == len(recs) else "wrong-stream"))
        status[kind] += 1
        rows.append({"id": e["id"], "status": kind, "reason": e.get("reason"), "stalled": e.get("stalled"),
                     "requests": len(recs), "ok": ok, "iterations": e.get("iterations"),
                     "empty_frames": e.get("empty_frames"),
                     "preemptions": sum(r.get("num_preemptions") or 0 for r in recs)})
    return {"vllm_version": version, "scenarios": len(rows), "by_status": dict(status), "rows": rows}


if __name__ == "__main__":
    if sys.argv[1] == "spec":
        scen = {"chunked": chunked, "deferred": deferred}[sys.argv[2]]()
        spec = {"schema_version": 2, "version_label": sys.argv[2], "model_cache": MODEL_CACHE, "scenarios": scen,
                "fsync": False}
        Path(sys.argv[3]).write_text(json.dumps(spec) + "\n")
        print(len(scen), "scenarios")
    else:
        print(json.dumps(summary(sys.argv[2]), indent=1))
