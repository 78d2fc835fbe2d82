"""Is a config built with the reused ModelConfig the one create_engine_config builds afresh? (one-off check)"""
import os, sys, time, itertools, enum
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
from repro.sched.adapter import Adapter
from repro.sched.opmodel import setup_for, Knobs
from repro.sched.runner import model_dir_of
md = model_dir_of({"model_cache": os.path.expanduser("~/.cache/vllm-repro-tests/vllm-repro/models")})
a = Adapter(); print("reusable:", a.model_config_reused)
reused = {"model": 0, "spec": 0}

def norm(x, depth=0, seen=None):
    seen = set() if seen is None else seen
    if isinstance(x, (str, int, float, bool, type(None), enum.Enum, bytes)):
        return x
    if depth > 6 or id(x) in seen:
        return f"<{type(x).__name__}>"
    seen = seen | {id(x)}
    if isinstance(x, dict):
        return {str(k): norm(v, depth + 1, seen) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        items = [norm(v, depth + 1, seen) for v in x]
        return sorted(map(repr, items)) if isinstance(x, (set, frozenset)) else items
    if hasattr(x, "to_dict") and "transformers" in type(x).__module__:
        return norm(x.to_dict(), depth + 1, seen)
    if hasattr(x, "__dict__"):
        return {k: norm(v, depth + 1, seen) for k, v in vars(x).items() if k != "instance_id"}
    return repr(x)

n = diff = 0
for nb, seqs, budget, pol, lp, nopc, depth, k in itertools.product((3, 7, 64), (16, 2), (256, 16), ("fcfs", "priority"), (0, 24), (False, True), (1, 2), (0, 2)):
    if depth == 1 and k: continue
    s = setup_for(depth, nb, k, 0, seqs, Knobs(budget, pol, lp, False, nopc))
    a.model_config_reused = True; a._configs.clear(); fast = a.vllm_config(md, s)
    a.model_config_reused = False; a._configs.clear(); slow = a.vllm_config(md, s)
    n += 1
    if fast.speculative_config is not None:  # the reused SpeculativeConfig targets this config's own objects
        assert fast.speculative_config.target_model_config is fast.model_config
        assert fast.speculative_config.target_parallel_config is fast.parallel_config
        assert (slow.speculative_config.target_model_config is slow.model_config)
    if norm(fast) != norm(slow):
        diff += 1
        f, sl = norm(fast), norm(slow)
        print("DIFF", s, [k2 for k2 in f if f[k2] != sl.get(k2)])
print(f"{n} setups compared, {diff} differ; memo holds {len(a._model_configs)} ModelConfigs, {len(a._spec_configs)} SpeculativeConfigs")
