import sys, json
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[3]))  # the checkout
from pathlib import Path
from repro.sched.adapter import Adapter
from repro.sched.executor import Executor
from repro.sched.script import Script
from repro.models.deterministic import load_perm
from repro.sched.upstream import build_any_script
plan = json.load(open(sys.argv[1]))
# The default bigram-cycle checkpoint (bigram-cycle-9d4ca46760388d9e), built and cached by its hash under
# $VLLM_REPRO_MODELS, else a folder of the system's temp dir, never the user's cache.
import os, tempfile
from repro.models.deterministic import BigramCycleSpec, build_checkpoint
model_dir = build_checkpoint(BigramCycleSpec.from_dict({}),
                             Path(os.environ.get("VLLM_REPRO_MODELS", Path(tempfile.gettempdir()) / "vllm-repro-trace-models")))
perm = load_perm(model_dir)
import repro.sched.script as S
script = build_any_script("ops", plan["script"], len(perm), 0)
ad = Adapter()
sched = ad.scheduler(model_dir, script.setup)
hasher = ad.block_hasher(script.setup.block_size) if script.setup.enable_prefix_caching else None
ex = Executor(script, sched, ad, perm, hasher)
def st(rid):
    r = sched.requests.get(rid)
    if r is None: return f"{rid}:gone"
    return (f"{rid}:{r.status.name} nct={r.num_computed_tokens} ntok={r.num_tokens} out={list(r.output_token_ids)} "
            f"ph={getattr(r,'num_output_placeholders','-')} npre={r.num_preemptions} "
            f"ncached={getattr(r,'num_cached_tokens','-')}")
orig_s, orig_p = ex._schedule, ex._process
def sch():
    f = orig_s()
    so = f.scheduler_output
    new = [(r.req_id, r.num_computed_tokens) for r in so.scheduled_new_reqs]
    c = so.scheduled_cached_reqs
    res = getattr(c,'resumed_from_preemption',None)
    print(f"SCHEDULE frame {f.index}: tokens={dict(so.num_scheduled_tokens)} new={new} cached={list(c.req_ids)} "
          f"resumed={res} nct={list(c.num_computed_tokens)} preempted={getattr(so,'preempted_req_ids',None)} positions={f.positions} "
          f"free_blocks={sched.kv_cache_manager.block_pool.get_num_free_blocks()}")
    print("   state:", st('r3'))
    return f
def proc():
    f = ex.queue[0]
    orig_p()
    print(f"PROCESS frame {f.index}: sampled={[list(x) for x in f.runner_output.sampled_token_ids]} ids={f.runner_output.req_ids}"
          f" -> r3 delivered so far {ex.streams['r3'].observed}")
    print("   state:", st('r3'))
ex._schedule, ex._process = sch, proc
ex.play()
for s in ex.streams.values(): print(s.rid, s.observed, s.reference[:s.max_tokens], s.finish_reason)
