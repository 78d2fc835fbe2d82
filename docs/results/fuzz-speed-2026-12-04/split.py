"""CPU split of one in-process fuzz run: python split.py EXAMPLES SEED REACH SPEC_TOKENS(e.g. 0 or 0,2)"""
import os, sys, time, json, functools
ex, seed, reach, ks = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", [int(k) for k in sys.argv[4].split(",")]
spec = {"schema_version": 2, "version_label": os.environ.get("VL", "0.32.0"),
        "model_cache": os.path.expanduser("~/.cache/vllm-repro-tests/vllm-repro/models"),
        "model": {"kind": "bigram-cycle", "params": {}}, "scenarios": [],
        "fuzz": {"examples": ex, "steps": 25, "seed": seed, "depths": [1, 2, 3], "spec_tokens": ks,
                 "max_requests": 8, "reach": reach}, "fsync": False}
pt = time.process_time
acc = {"traced": 0.0, "construct": 0.0, "vllm": 0.0}
depth = [0]
import repro.sched.fuzzrun as fr, repro.sched.adapter as ad
orig_traced = fr.FuzzRun.traced
def traced(self, fn):
    if self.tracing: return orig_traced(self, fn)
    t = pt()
    try: return orig_traced(self, fn)
    finally: acc["traced"] += pt() - t
fr.FuzzRun.traced = traced
def timed(key, f):
    @functools.wraps(f)
    def w(*a, **k):
        if depth[0]: return f(*a, **k)
        depth[0] += 1; t = pt()
        try: return f(*a, **k)
        finally: depth[0] -= 1; acc[key] += pt() - t
    return w
ad_sched = ad.SchedulerAdapter.scheduler if hasattr(ad, "SchedulerAdapter") else None
import repro.sched.fuzz as fz
orig_rf = fz.run_fuzz
def run_fuzz(adapter, *a, **k):
    cls_scheduler = type(adapter).scheduler
    type(adapter).scheduler = timed("construct", cls_scheduler)
    seen = set()
    for cls in set(adapter.classes.values()):
        for c in cls.__mro__:
            if c.__module__.startswith("vllm") and c not in seen:
                seen.add(c)
                for name, f in list(vars(c).items()):
                    if callable(f) and not name.startswith("__") and not isinstance(f, (staticmethod, classmethod, type)):
                        setattr(c, name, timed("vllm", f))
    t = pt(); out = orig_rf(adapter, *a, **k); out["_total"] = pt() - t; return out
fz.run_fuzz = run_fuzz
orig_rm = fz._run_machine
def _rm(m, sp):
    for k in acc: acc[k] = 0.0
    return orig_rm(m, sp)
fz._run_machine = _rm
import repro.sched.runner as rn
rn.run_fuzz = run_fuzz if hasattr(rn, "run_fuzz") else None
from repro.sched.runner import run
events = []
run(spec, lambda event, **d: events.append({"event": event, **d}))
f = [e for e in events if e["event"] == "fuzz"][0]
n, cpu = f["examples"], f["cpu_s"]
print(json.dumps({"examples": n, "cpu_s": cpu, "per_cpu_s": round(n / cpu, 1), "falsified": bool(f.get("falsifying")),
    "status": f["status"], "ms_per_ex": round(1000 * cpu / n, 2),
    "construct_ms": round(1000 * acc["construct"] / n, 2), "vllm_sched_ms": round(1000 * acc["vllm"] / n, 2),
    "harness_in_rules_ms": round(1000 * (acc["traced"] - acc["construct"] - acc["vllm"]) / n, 2),
    "hypothesis_ms": round(1000 * (cpu - acc["traced"]) / n, 2),
    "reach": (f.get("reach") or {}).get("reachable", {}).get("sched/scheduler.py", {}).get("percent"),
    "ops": sum(f["coverage"]["ops"].values())}))
json.dump(f, open(os.environ.get("FZ_OUT", "/tmp/fzs/split_last.json"), "w"), default=str)
