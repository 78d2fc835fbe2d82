"""Recompute fuzz.json's reach.reachable with the current CPU_UNREACHABLE table, from its missing lines/branches
and the scheduler.py source (coverage.py's parser gives statements and branch arcs)."""
import json, sys
from coverage.parser import PythonParser
from repro.sched.reach import CPU_UNREACHABLE, function_ranges, reachable
fuzz_json, source = sys.argv[1], sys.argv[2]
doc = json.load(open(fuzz_json))
r = doc["versions"][0]["reach"]
miss = r["missing"]["sched/scheduler.py"]
parser = PythonParser(filename=source)
parser.parse_source()
statements = parser.statements
branch_arcs = {(a, b) for a, exits in parser.exit_counts().items() if exits > 1 for (x, b) in parser.arcs() if x == a}
ml = set(miss["lines"]); mb = {tuple(b) for b in miss["branches"]}
d = {"executed_lines": sorted(statements - ml), "missing_lines": sorted(ml),
     "executed_branches": [list(b) for b in sorted(branch_arcs - mb)], "missing_branches": [list(b) for b in sorted(mb)]}
f = r["files"]["sched/scheduler.py"]
print("check", len(d["executed_lines"]), f["covered_lines"], len(d["executed_branches"]), f["covered_branches"])
out = reachable(d, function_ranges(open(source).read()), CPU_UNREACHABLE)
print({k: out[k] for k in ("statements", "covered_lines", "branches", "covered_branches", "percent")})
if len(sys.argv) > 3:
    r["reachable"] = {"sched/scheduler.py": out}
    r["reachable_note"] = "recomputed after the run with the CPU_UNREACHABLE table of the commit (tools: see README)"
    json.dump(doc, open(fuzz_json, "w"), indent=2)
