"""Sample the CPU seconds (user+sys, from /proc) of a command and every process descended from it, every 0.25 s,
and the load average; run the command, then write {"cpu_s", "processes", "wall_s", "load": [min, max]} to OUT.
usage: cpusample.py OUT -- COMMAND..."""
import json, os, subprocess, sys, time
out, cmd = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
tck = os.sysconf("SC_CLK_TCK")
seen, loads = {}, []
t0 = time.monotonic()
p = subprocess.Popen(cmd)
def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        fl = f.read().rsplit(")", 1)[1].split()
    return int(fl[1]), fl[19], (int(fl[11]) + int(fl[12])) / tck  # ppid, start time, cpu s
while p.poll() is None:
    table = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                table[int(e)] = stat(int(e))
            except (OSError, IndexError, ValueError):
                pass
    kids = {p.pid}
    grew = True
    while grew:
        more = {pid for pid, (pp, _, _) in table.items() if pp in kids} - kids
        grew, kids = bool(more), kids | more
    for pid in kids:
        if pid in table:
            key = (pid, table[pid][1])
            seen[key] = max(seen.get(key, 0.0), table[pid][2])
    loads.append(os.getloadavg()[0])
    time.sleep(0.25)
json.dump({"rc": p.returncode, "cpu_s": round(sum(seen.values()), 1), "processes": len(seen),
           "wall_s": round(time.monotonic() - t0, 1), "load1": [min(loads), max(loads)] if loads else None,
           "argv": cmd}, open(out, "w"))
