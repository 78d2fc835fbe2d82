"""Poll listening sockets of a process tree: python monitor.py OUT CMD..."""
import os, re, subprocess, sys, time, json
out = sys.argv[1]; cmd = sys.argv[2:]
p = subprocess.Popen(cmd, stdout=open(out + ".stdout", "w"), stderr=subprocess.STDOUT)
def tree(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = open(f"/proc/{d}/stat").read()
                ppid = int(st.rsplit(")", 1)[1].split()[1]); kids.setdefault(ppid, []).append(int(d))
            except OSError: pass
    seen, todo = set(), [root]
    while todo:
        x = todo.pop(); seen.add(x); todo += kids.get(x, [])
    return seen
seen = {}
while p.poll() is None:
    pids = tree(p.pid)
    r = subprocess.run(["ss", "-ltnupH"], capture_output=True, text=True).stdout
    for line in r.splitlines():
        for pid in map(int, re.findall(r"pid=(\d+)", line)):
            if pid in pids:
                f = line.split()
                try: comm = open(f"/proc/{pid}/comm").read().strip()
                except OSError: comm = "?"
                key = (pid, f[0], f[4], comm)
                if key not in seen:
                    seen[key] = time.strftime("%H:%M:%S")
    time.sleep(0.3)
with open(out, "w") as fh:
    for (pid, proto, local, comm), t in sorted(seen.items(), key=lambda kv: (kv[1], kv[0])):
        fh.write(f"{t} pid={pid} {proto} {local} {comm}\n")
print("rc", p.returncode)
