"""Compare two runs' results.jsonl cell by cell: outcome and label (e.g. LOSS(1)). usage: compare.py A/results.jsonl B/results.jsonl"""
import json, sys
def load(p):
    out = {}
    for line in open(p):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        cid = d.get("id") or d.get("cell", {}).get("id")
        out[cid] = (d.get("outcome"), d.get("label"))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
same = [k for k in a if k in b and a[k] == b[k]]
diff = [k for k in a if k in b and a[k] != b[k]]
print(f"{len(same)}/{len(set(a) | set(b))} identical (outcome, label); only in A: {sorted(set(a) - set(b))}; only in B: {sorted(set(b) - set(a))}")
for k in diff:
    print("DIFF", k, a[k], b[k])
from collections import Counter
print("A:", dict(Counter(v[0] for v in a.values())), "B:", dict(Counter(v[0] for v in b.values())))
