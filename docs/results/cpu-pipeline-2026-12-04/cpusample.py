"""Sample CPU seconds of every process whose cwd is under ROOT (the run's engines and their children), plus the
harness process PID given; prints the total when the harness exits.  usage: cpusample.py ROOT HARNESS_PID OUT"""
import os, sys, time, json
root, hpid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tck = os.sysconf("SC_CLK_TCK")
seen = {}
def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fl = f.read().rsplit(")", 1)[1].split()
    return (int(fl[11]) + int(fl[12])) / tck
while os.path.exists(f"/proc/{hpid}"):
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        pid = int(e)
        try:
            if pid != hpid and not os.readlink(f"/proc/{pid}/cwd").startswith(root):
                continue
            key = (pid, open(f"/proc/{pid}/stat").read().split()[21])  # pid + start time
            seen[key] = max(seen.get(key, 0.0), cpu(pid))
        except OSError:
            continue
    time.sleep(0.25)
json.dump({"cpu_s": round(sum(seen.values()), 1), "processes": len(seen)}, open(out, "w"))
