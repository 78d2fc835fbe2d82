"""Per release: where make_arg_parser, the server's __main__, build_app (defined / called) and run_server_worker
live, read from the vllm/ package of unpacked wheels: python layout_scan.py ROOT REL... (ROOT/REL/vllm/...)."""

import re
import sys
from pathlib import Path


def lines(text: str, pattern: str) -> list[int]:
    return [i + 1 for i, line in enumerate(text.splitlines()) if re.search(pattern, line)]


def scan(pkg: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"make_arg_parser": [], "__main__+main()": [], "def build_app": [],
                                 "calls build_app": [], "def run_server_worker": []}
    patterns = {"make_arg_parser": r"^def make_arg_parser\(", "def build_app": r"^def build_app\(",
                "calls build_app": r"app = build_app\(", "def run_server_worker": r"^async def run_server_worker\("}
    for f in sorted((pkg / "entrypoints").rglob("*.py")):
        if "run_batch" in f.name:  # run_batch has a make_arg_parser of its own (the batch runner's)
            continue
        text = f.read_text(errors="replace")
        mod = "vllm." + str(f.relative_to(pkg)).removesuffix(".py").replace("/", ".")
        for key, pattern in patterns.items():
            found = lines(text, pattern)
            if found:
                out[key].append(f"{mod}:{found[0]}")
        main = lines(text, r'^if __name__ == "__main__"')
        if main and "api_server" in str(f):
            out["__main__+main()"].append(f"{mod}:{main[0]}")
    return out


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for rel in sys.argv[2:]:
        print(rel, scan(root / rel / "vllm"))
