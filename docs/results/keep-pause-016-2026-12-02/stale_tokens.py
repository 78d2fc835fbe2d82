"""Which weights produced each running request's first post-swap token (the weight-sync cells of a report).

Usage: PYTHONPATH=<repo> python stale_tokens.py REPORT.json[.gz] ...  (results.json, bisect.json or a frameworks
bisect's JSON).  A and B are the bigram-cycle checkpoints the scenario swaps (seed 0 and its swap partner).  For
each request running at the pause: the token at the swap index is A's continuation (stale) or B's (right), and
how many of the tokens after it follow B's cycle from it.
"""

from __future__ import annotations

import gzip
import json
import sys
from typing import Any

from repro.models import BigramCycleSpec, cycle_permutation, swap_partner


def cells_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if "cells" in doc:
        return list(doc["cells"])
    out: list[dict[str, Any]] = []
    for p in doc.get("probes", []):
        out += p.get("cells") or ([p["cell"]] if p.get("cell") else [])
    return out


def main(paths: list[str]) -> None:
    spec = BigramCycleSpec()
    pa, pb = cycle_permutation(spec.vocab_size, spec.seed), cycle_permutation(spec.vocab_size,
                                                                             swap_partner(spec).seed)
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            doc = json.load(f)
        print(f"== {path}")
        for c in cells_of(doc):
            if "weight_sync" not in c["id"]:
                continue
            tally = {"A (stale)": 0, "B": 0, "other": 0}
            for r in c["requests"]:
                ws, obs = r.get("weight_sync") or {}, r["observed"]
                i = ws.get("swap_index")
                if not r.get("pauses") or i is None or not 0 < i < len(obs):
                    continue
                last, got = obs[i - 1], obs[i]
                kind = "A (stale)" if got == pa[last] else "B" if got == pb[last] else "other"
                tally[kind] += 1
                then_b = all(obs[j] == pb[obs[j - 1]] for j in range(i + 1, len(obs)))
                print(f"  {c['id']} {r['rid'][-3:]}: swap index {i}, token {got} = {kind}, "
                      f"then B's cycle from it: {then_b}; oracle {r['verdict']['label']}")
            print(f"  {c['id']}: {c['summary']}; first post-swap token of the running requests: {tally}")


if __name__ == "__main__":
    main(sys.argv[1:])
