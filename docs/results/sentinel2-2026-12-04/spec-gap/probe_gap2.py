import json, sys
import repro.sched.scenario as scn
from repro.models import load_perm
from repro.sched.adapter import Adapter
from repro.sched.runner import model_dir_of
spec = json.load(open(sys.argv[1]))
md = model_dir_of(spec); perm = load_perm(md); ad = Adapter()
rows = []
for sc in spec["scenarios"]:
    ev = scn.run_scenario(ad, sc, md, perm)
    recs = ev.get("records", [])
    ok = all(r["observed"] == r["reference"][:len(r["observed"])] and len(r["observed"]) == r["max_tokens"] for r in recs)
    pre = (ev.get("num_preemptions") or sum((r.get("num_preemptions") or 0) for r in recs))
    st = ev.get("spec_steps", {})
    row = {"id": sc["id"], "status": ev["status"], "reason": (ev.get("reason") or "")[:160], "streams_ok": ok,
           "stalled": ev.get("stalled"), "preemptions": pre, "gap": ev.get("precondition", {}).get("met"),
           "steps": st.get("steps"), "stale": st.get("stale")}
    rows.append(row); print(json.dumps(row)[:400])
json.dump(rows, open(sys.argv[2], "w"), indent=1)
