"""Drive one fuzz run in-process (profiling): python drive.py EXAMPLES SEED REACH(0/1) [PROF_OUT]"""
import cProfile, json, os, sys, time, pstats
ex, seed, reach = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
prof = sys.argv[4] if len(sys.argv) > 4 else None
steps = int(os.environ.get("STEPS", "25"))
spec = {"schema_version": 2, "version_label": "0.32.0",
        "model_cache": os.path.expanduser("~/.cache/vllm-repro-tests/vllm-repro/models"),
        "model": {"kind": "bigram-cycle", "params": {}}, "scenarios": [],
        "fuzz": {"examples": ex, "steps": steps, "seed": seed, "depths": [1, 2, 3], "spec_tokens": [0, 2],
                 "max_requests": 8, "reach": reach}, "fsync": False}
from repro.sched.runner import run
events = []
def emit(event, **data):
    events.append({"event": event, **data})
p = cProfile.Profile() if prof else None
c0 = time.process_time()
if p: p.enable()
run(spec, emit)
if p:
    p.disable(); p.dump_stats(prof)
fz = [e for e in events if e["event"] == "fuzz"][0]
r = fz.get("reach") or {}
print(json.dumps({k: fz.get(k) for k in ("status", "examples", "cpu_s", "wall_s", "examples_per_s")}),
      "per cpu s", round(fz["examples"] / fz["cpu_s"], 1) if fz.get("cpu_s") else None, "total cpu", round(time.process_time() - c0, 1))
if r.get("files"):
    print({n: d["percent"] for n, d in r["files"].items()}, r["reachable"]["sched/scheduler.py"]["percent"],
          r["reachable"]["sched/scheduler.py"]["covered_lines"]+r["reachable"]["sched/scheduler.py"]["covered_branches"],
          r["reachable"]["sched/scheduler.py"]["statements"]+r["reachable"]["sched/scheduler.py"]["branches"])
if fz.get("falsifying"): print("FALSIFYING", json.dumps(fz["falsifying"])[:2000])
if fz.get("reason"): print("REASON", fz["reason"], fz.get("traceback", "")[-3000:])
json.dump(fz, open(os.environ.get("FZ_OUT", "/tmp/fr/last_fuzz.json"), "w"), default=str)
