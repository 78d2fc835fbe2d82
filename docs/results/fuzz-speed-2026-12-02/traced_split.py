"""Run ../fuzz-reach-2026-12-02/inprocess_run.py with the CPU time spent inside FuzzRun.traced
(set-up, rules, invariant, teardown: everything that calls vLLM or the executor) summed: the rest is Hypothesis and
the state machine around the rules.  Same arguments as inprocess_run.py."""
import sys, time, runpy
from pathlib import Path
from repro.sched import fuzzrun
acc = [0.0]
orig = fuzzrun.FuzzRun.traced
def traced(self, fn):
    if self.tracing: return fn()
    c = time.process_time()
    self.tracing = True
    try: return fn()
    finally:
        self.tracing = False
        acc[0] += time.process_time() - c
fuzzrun.FuzzRun.traced = traced
RUN = Path(__file__).resolve().parent.parent / "fuzz-reach-2026-12-02" / "inprocess_run.py"
sys.argv = [str(RUN)] + sys.argv[1:]
try:
    runpy.run_path(str(RUN), run_name="__main__")
finally:
    print("inside traced (set-up, rules, checks, teardown):", round(acc[0], 2), "CPU s")
