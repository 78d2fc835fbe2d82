"""What the pytest face prints at the end: engine hangs, the items retried after an infrastructure failure, and
each cell with its first post-resume tokens.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.core.oracle import Outcome
from harness.verdicts.results import CellResult


def first_post_resume_tokens(c: CellResult) -> list[str]:
    """``rid#i: expected X, observed Y`` for every request with a post-resume token (mismatches first).

    Frozen requests: the token at their pause index; requests submitted during
    the pause or after resume: their token 0.
    """
    rows = []
    for r in c.requests:
        v = r.get("verdict") or {}
        f = v.get("first_post_resume")
        if isinstance(f, dict):
            bad = f.get("expected") != f.get("observed")
            rows.append((not bad, f"{r['rid']}#{f['index']}: expected {f['expected']}, observed {f['observed']}"))
    return [text for _, text in sorted(rows, key=lambda t: t[0])]


def terminal_summary(tr: Any, config: pytest.Config) -> None:
    """The plugin's ``pytest_terminal_summary``."""
    pool = getattr(config, "_repro_pool", None)
    if pool is not None and pool.hangs:
        tr.section("vllm-repro: engine hangs during property tests", yellow=True)
        for version, reason in pool.hangs:
            tr.write_line(f"vLLM {version}: {reason[:400]}")
        tr.write_line(f"plans saved to {pool.run_dir.parent / 'hangs.jsonl'}; replay with vllm-repro plan")
    cells: tuple[CellResult, ...] = getattr(config, "_repro_cells", ())
    if not cells:
        return
    write_retried(tr, cells)
    tr.section("vllm-repro post-resume cells")
    for c in cells:
        line = f"{c.id}: {c.summary} [{c.expectation.status if c.expectation else '?'}]"
        firsts = first_post_resume_tokens(c)
        if firsts:
            line += "; first post-resume token " + "; ".join(firsts[:3]) + (" ..." if len(firsts) > 3 else "")
        tr.write_line(line)
    paths = getattr(config, "_repro_report_paths", None)
    if paths is not None:
        tr.write_line(f"reports: {paths.json}, {paths.markdown}, {paths.junit}")


_RETRIED = frozenset(o.value for o in Outcome if o.is_retryable)


def retried_lines(cells: tuple[CellResult, ...]) -> list[str]:
    """One line per cell ``--retry-infra`` ran again: every attempt's outcome, and why each failed one failed."""
    lines = []
    for c in cells:
        if len(c.attempts) < 2:
            continue
        tries = []
        for a in c.attempts:
            why = (a.reason or a.summary or "").strip().splitlines() if a.outcome in _RETRIED else []
            tries.append(f"attempt {a.n} {a.label or a.outcome}" + (f" ({why[0][:300]})" if why else ""))
        lines.append(f"{c.id}: " + "; ".join(tries))
    return lines


def write_retried(tr: Any, cells: tuple[CellResult, ...]) -> None:
    """The summary's section of retried items (infrastructure failures run again on a fresh engine)."""
    lines = retried_lines(cells)
    if not lines:
        return
    tr.section(f"vllm-repro: {len(lines)} item(s) retried after an infrastructure failure (--retry-infra)",
               yellow=True)
    for line in lines:
        tr.write_line(line)
