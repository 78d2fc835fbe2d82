"""The watch's files: ``watch.json`` and ``watch.md`` (the Markdown a CI job adds to its step summary)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.verdicts.mdtable import md_table
from harness.watch.smoke import Status
from harness.watch.watch import ReleaseWatch, WatchResult

WATCH_FILE = "watch.json"
WATCH_MARKDOWN = "watch.md"
HEADER = ("release", "status", "probe", "outcome", "reads as", "cause")


def counted(r: ReleaseWatch) -> str:
    """``1 harness incompatibility, 2 findings about vLLM``."""
    n, m = len(r.incompatibilities), len(r.findings)
    return (f"{n} harness {'incompatibility' if n == 1 else 'incompatibilities'}, "
            f"{m} {'finding' if m == 1 else 'findings'} about vLLM")


def matrix_line(r: ReleaseWatch) -> str:
    """The default matrix in one line: its cells per status, or why it did not run."""
    if r.matrix is None:
        return r.matrix_note
    counts = {s: sum(c.status is s for c in r.matrix) for s in Status}
    return f"{len(r.matrix)} cells: " + ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)


def summary(result: WatchResult) -> str:
    """One line: each release and its status, or that nothing is newer."""
    if not result.releases:
        return f"nothing newer than {result.judged.version} on the index: nothing to watch"
    return "; ".join(f"{r.version} {r.status.value} ({counted(r)})" for r in result.releases)


def rows(r: ReleaseWatch) -> list[tuple[str, ...]]:
    """The table rows of one release: its smoke cells, then its default matrix."""
    out = [(r.version if n == 0 else "", r.status.value if n == 0 else "", c.probe, c.label or c.outcome,
            c.status.value, c.cause) for n, c in enumerate(r.smoke)]
    return [*out, ("", "", "default matrix", "", "", matrix_line(r))]


def watch_markdown(result: WatchResult) -> str:
    """The watch's Markdown: the mark, the table, every incompatibility and finding with its cause."""
    s = result.setup
    lines = [f"## Release watch: {s.package} on {s.platform}", "",
             f"Newest judged: {result.judged.version} ({'; '.join(result.judged.sources)}); newest on the index: "
             f"{result.newest or 'none'}.", "", f"**{summary(result)}**", ""]
    if result.releases:
        lines += md_table(HEADER, [row for r in result.releases for row in rows(r)])
    for r in result.releases:
        for title, cells in (("Harness incompatibilities", r.incompatibilities), ("Findings about vLLM", r.findings)):
            if cells:
                lines += ["", f"### {r.version}: {title.lower()}", ""]
                lines += [f"- `{c.cell}` ({c.probe or 'default matrix'}): {c.label or c.outcome}: {c.cause}"
                          for c in cells]
    return "\n".join(lines) + "\n"


def write_watch(result: WatchResult, folder: Path) -> tuple[Path, Path]:
    """``watch.json`` and ``watch.md`` in ``folder``, each written atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = (folder / WATCH_FILE, folder / WATCH_MARKDOWN)
    for path, text in zip(paths, (json.dumps(result.to_dict(), indent=2) + "\n", watch_markdown(result)),
                          strict=True):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return paths
