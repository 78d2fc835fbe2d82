"""Trace vLLM's request state around every schedule / update_from_output / update_draft_token_ids / add_request of one
variant (variants.json in the current folder):  PYTHONPATH=REPO ENV/bin/python trace.py NAME"""
import json, sys
from pathlib import Path
from repro.models.deterministic import BigramCycleSpec, build_checkpoint, load_perm
from repro.sched.adapter import Adapter
from repro.sched.executor import Executor
from repro.sched.upstream import build_any_script
V = json.load(open('variants.json'))
name = sys.argv[1]
# The checkpoint is built (cached by its hash) under $VLLM_REPRO_MODELS, else a folder of the system's temp dir,
# never the user's cache.
import os, tempfile
md = build_checkpoint(BigramCycleSpec.from_dict({}),
                      Path(os.environ.get("VLLM_REPRO_MODELS", Path(tempfile.gettempdir()) / "vllm-repro-trace-models")))
perm = load_perm(md)
ad = Adapter()
script = build_any_script('ops', V[name], len(perm), 0)
sched = ad.scheduler(md, script.setup)
hasher = ad.block_hasher(script.setup.block_size) if script.setup.enable_prefix_caching else None
ex = Executor(script, sched, ad, perm, hasher)
def st(r):
    return (f"{r.request_id}:{r.status.name} ntok={r.num_tokens} nprompt={r.num_prompt_tokens} ncomp={r.num_computed_tokens} "
            f"out={list(r.output_token_ids)} spec={r.spec_token_ids} ph={r.num_output_placeholders} "
            f"stale={getattr(r,'num_stale_output_tokens',None)} prefill_chunk={r.is_prefill_chunk} q={list(r.streaming_queue or []) and len(r.streaming_queue)}")
for meth in ('schedule', 'update_from_output', 'update_draft_token_ids', 'add_request'):
    orig = getattr(sched, meth)
    def wrap(*a, _o=orig, _m=meth, **k):
        print(f"-- {_m} before: " + " | ".join(st(r) for r in sched.requests.values()))
        out = _o(*a, **k)
        if _m == 'schedule':
            print(f"   scheduled {dict(out.num_scheduled_tokens)} spec={dict(out.scheduled_spec_decode_tokens)} new={[r.req_id for r in out.scheduled_new_reqs]}")
        if _m == 'update_draft_token_ids':
            print(f"   drafts {a[0].req_ids} {a[0].draft_token_ids}")
        return out
    setattr(sched, meth, wrap)
for op in script.ops:
    print(f"== op {op.to_dict()}")
    try:
        ex.apply(op)
    except Exception as e:
        print("RAISED", type(e).__name__, e); break
