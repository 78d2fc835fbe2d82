"""Per release: where make_arg_parser, the server's __main__, build_app (defined / called) and run_server_worker live."""
import re, sys
from pathlib import Path
root = Path(sys.argv[1])
for rel in sys.argv[2:]:
    ep = root / rel / "vllm" / "entrypoints"
    def mod(p): return "vllm." + str(p.relative_to(root / rel / "vllm")).removesuffix(".py").replace("/", ".")
    out = {"make_arg_parser": [], "__main__+main()": [], "def build_app": [], "calls build_app": [], "def run_server_worker": []}
    for f in sorted(ep.rglob("*.py")):
        t = f.read_text(errors="replace")
        ln = lambda pat: [i + 1 for i, l in enumerate(t.splitlines()) if re.search(pat, l)]
        if "run_batch" in f.name: continue
        if ln(r"^def make_arg_parser\("): out["make_arg_parser"].append(f"{mod(f)}:{ln(r'^def make_arg_parser')[0]}")
        if ln(r'^if __name__ == "__main__"') and ("uvloop.run(run_server" in t or "main()" in t) and "api_server" in str(f): out["__main__+main()"].append(f"{mod(f)}:{ln(r'^if __name__')[0]}")
        if ln(r"^def build_app\("): out["def build_app"].append(f"{mod(f)}:{ln(r'^def build_app')[0]}")
        c = ln(r"app = build_app\(")
        if c: out["calls build_app"].append(f"{mod(f)}:{c[0]}")
        if ln(r"^async def run_server_worker\("): out["def run_server_worker"].append(f"{mod(f)}:{ln(r'^async def run_server_worker')[0]}")
    print(rel, out)
