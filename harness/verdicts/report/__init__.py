"""Reports rendered from results, and ``write_reports``, which writes the three report files atomically.

The renderings are pure functions of a ``Results`` (or a sequence of ``CellResult``): ``markdown``
(results.md), ``junit`` (junit.xml), ``terminal`` (a rich table), ``workaround_text`` (the verdict
paragraph), all built from what ``cells`` says of a cell and its requests.  The workaround judged is the
upstream advice for vLLM #42043: run with ``async_scheduling=False``.  The cells that demonstrate the bug
are keep-mode pauses with ``clear_cache=True``; per vLLM version the async-on and async-off cells of one
executor are compared.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from harness.verdicts.report.junit import junit_xml
from harness.verdicts.report.markdown import markdown
from harness.verdicts.results import Results


@dataclass(frozen=True)
class ReportPaths:
    json: Path
    markdown: Path
    junit: Path


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_reports(results: Results, out_dir: Path) -> ReportPaths:
    """Write results.json, results.md and junit.xml into ``out_dir`` (each atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = ReportPaths(out_dir / "results.json", out_dir / "results.md", out_dir / "junit.xml")
    _write_atomic(paths.json, json.dumps(results.to_dict(), indent=2) + "\n")
    _write_atomic(paths.markdown, markdown(results))
    _write_atomic(paths.junit, junit_xml(results))
    return paths
