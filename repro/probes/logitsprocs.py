"""vllm#52461 probe: what a stateful logits processor is shown as a request's output token ids.

vLLM's worker hands each logits processor a live reference to every request's output-token list
(``BatchUpdate.added``: ``(index, params, prompt_ids, output_ids)``).  Under async scheduling the worker
appends a ``-1`` placeholder for the token still being sampled and writes the real id back only when
``InputBatch.logitsprocs_need_output_token_ids`` is set, which is ``bool(custom_logitsprocs)``: the
processors passed as ``logits_processors=`` (the CLI/engine argument), not those installed as
``vllm.logits_processors`` entry-point plugins (the report's case) nor the builtins.

Usage (inside a vLLM env; ``repro`` on PYTHONPATH)::

    python -m repro.probes.logitsprocs MODEL_DIR OUT.json --via cli|plugin --async on|off

``--via plugin`` needs a dist-info on PYTHONPATH declaring ``[vllm.logits_processors]
repro_probe = repro.probes.logitsprocs:RecordingProcessor`` (``write_plugin_dist_info`` makes one; run
``python -m repro.probes.logitsprocs --write-dist-info DIR``), and ``--async on`` on vLLM's CPU platform the
repro shim (``VLLM_REPRO_CPU_ASYNC=1``, its dist-info staged by ``harness.run.staging.stage_repro``).

The processor records, at each ``apply`` (one per engine step), every tracked request's output ids as
shown, to the JSON-lines file ``$REPRO_LOGITSPROC_LOG``; the probe then compares them with the tokens
vLLM returned.  It never changes the logits, and it is not argmax-invariant, so vLLM calls it for greedy
requests too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ENV_LOG = "REPRO_LOGITSPROC_LOG"
DEFAULT_LOG = "repro-logitsproc-steps.jsonl"
FQCN = "repro.probes.logitsprocs:RecordingProcessor"
ENTRY_POINT = f"repro_probe = {FQCN}"

try:  # only inside a vLLM env
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
except ImportError:  # pragma: no cover - the harness side imports nothing of this module
    LogitsProcessor = object  # type: ignore[misc,assignment]
    BatchUpdate = Any  # type: ignore[misc,assignment]


def prompt_key(prompt_ids: Any) -> str:
    """A request's key when it names none (``extra_args``): its prompt, which the scenarios keep distinct."""
    return "prompt:" + ",".join(str(t) for t in (prompt_ids or ()))


class RecordingProcessor(LogitsProcessor):  # type: ignore[misc,valid-type]
    """Tracks each request's live output-id list and logs a snapshot of all of them per step."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[str, list[int]]] = {}  # batch index -> (request key, live output ids)
        self.step = 0
        # The engine tier's logitsproc scenario sets no variable: its engine (and so every worker) runs in the
        # cell's work dir, where the scenario reads the file back.
        self.path = os.environ.get(ENV_LOG) or str(Path.cwd() / DEFAULT_LOG)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        return None

    def is_argmax_invariant(self) -> bool:
        return False  # else vLLM skips apply() for greedy requests

    def update_state(self, batch_update: Any) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for added in batch_update.added:
            index, params, output_ids = added[0], added[1], added[-1]
            key = str((getattr(params, "extra_args", None) or {}).get("probe_key") or prompt_key(added[2]))
            self.rows[index] = (key, output_ids)
        for a, b, direction in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if rb is not None and "SWAP" in str(direction).upper():
                self.rows[a] = rb

    def apply(self, logits: Any) -> Any:
        self.step += 1
        snap = {key: list(ids) for key, ids in self.rows.values()}
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": self.step, "pid": os.getpid(), "rows": snap}) + "\n")
        return logits


def write_plugin_dist_info(dst: Path) -> Path:
    """A dist-info under ``dst`` declaring RecordingProcessor as a ``vllm.logits_processors`` plugin."""
    info = dst / "repro_logitsproc_probe-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: repro-logitsproc-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[vllm.logits_processors]\n{ENTRY_POINT}\n")
    return info


def summarize(log: Path, outputs: dict[str, list[int]]) -> dict[str, Any]:
    """Per request: snapshots shown, how many held -1, and how many differ from the returned prefix."""
    per: dict[str, dict[str, int]] = {k: {"snapshots": 0, "with_minus_one": 0, "wrong_prefix": 0}
                                      for k in outputs}
    first_bad: dict[str, Any] = {}
    for line in log.read_text().splitlines() if log.exists() else ():
        for key, ids in json.loads(line)["rows"].items():
            if key not in per:
                continue
            s = per[key]
            s["snapshots"] += 1
            s["with_minus_one"] += -1 in ids
            bad = ids != outputs[key][:len(ids)]
            s["wrong_prefix"] += bad
            if bad and key not in first_bad:
                first_bad[key] = {"shown": ids, "returned_prefix": outputs[key][:len(ids)]}
    total = {f: sum(s[f] for s in per.values()) for f in ("snapshots", "with_minus_one", "wrong_prefix")}
    return {"total": total, "per_request": per, "first_wrong": first_bad}


def worker_async(llm: Any) -> list[Any] | str:
    """What each worker's model runner really ran: ``use_async_scheduling`` as the repro shim's worker probe reads
    it (the front-end's config says what was asked; on vLLM's CPU platform only the shim makes it true)."""
    try:
        return [r.get("use_async_scheduling") for r in llm.collective_rpc("repro_worker_probe")]
    except Exception as exc:  # the shim not staged, or a vLLM without collective_rpc
        return f"unknown ({type(exc).__name__}: {exc})"


def run(model_dir: str, out: Path, via: str, async_on: bool, n: int, max_tokens: int) -> dict[str, Any]:
    import vllm
    from vllm import LLM, SamplingParams

    log = out.with_suffix(".steps.jsonl")
    log.unlink(missing_ok=True)
    os.environ[ENV_LOG] = str(log)
    kwargs: dict[str, Any] = {"model": model_dir, "skip_tokenizer_init": True, "dtype": "float32",
                              "enforce_eager": True, "max_model_len": 256, "max_num_seqs": 8,
                              "async_scheduling": async_on, "seed": 0}
    if via == "cli":
        # By its FQCN, not the class: run as ``python -m``, the class would pickle as ``__main__``'s.
        kwargs["logits_processors"] = [FQCN]
    t0 = time.monotonic()
    llm = LLM(**kwargs)
    started = time.monotonic() - t0
    prompts = [{"prompt_token_ids": [2 + i, 3 + i, 4 + i, 5 + 2 * i]} for i in range(n)]
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                             extra_args={"probe_key": f"p{i}"}) for i in range(n)]
    results = llm.generate(prompts, params)
    outputs = {f"p{i}": list(r.outputs[0].token_ids) for i, r in enumerate(results)}
    summary = {"vllm_version": vllm.__version__, "via": via, "async_requested": async_on,
               "async_effective": worker_async(llm), "requests": n, "max_tokens": max_tokens,
               "engine_start_s": round(started, 1), **summarize(log, outputs)}
    out.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.probes.logitsprocs")
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--via", choices=("cli", "plugin"), default="plugin")
    ap.add_argument("--async", dest="async_on", choices=("on", "off"), default="on")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--write-dist-info", type=Path)
    a = ap.parse_args(argv)
    if a.write_dist_info:
        print(write_plugin_dist_info(a.write_dist_info))
        return 0
    if not a.model_dir or not a.out:
        ap.error("MODEL_DIR and OUT are required")
    s = run(a.model_dir, a.out, a.via, a.async_on == "on", a.requests, a.max_tokens)
    print(json.dumps({k: s[k] for k in ("vllm_version", "via", "async_requested", "async_effective", "total")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
