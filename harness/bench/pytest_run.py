"""A benchmarked pytest run of the matrix (``post-resume``: ``tests/integration/test_post_resume.py`` as
``tox -e post-resume`` runs it): its engines' timelines, read from the sessions the pytest plugin leaves.

The plugin (harness.frontends.pytest_plugin) runs each engine config as one long-lived session per pytest process
(an xdist worker, or ``main``), in ``<--repro-reports>/.run-<id>/<worker>/sessions/<engine id>-<pid>/``: the same
``events.jsonl``, ``engine.log`` and ``spawned.json`` as a matrix engine (harness.run.engine_process), its scenario
events labelled by the cell's scenario id.  The plugin removes that folder after a run without ERROR or TIMEOUT
cells unless ``--repro-keep-engines`` is given, which the benchmark passes.  The time axis starts when the benchmark
started the command; read back with ``--from``, when pytest started (``pytest-session.json`` beside the sessions,
written by the plugin), else at the first engine's spawn.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness.bench.phases import read_events, timeline
from harness.bench.run import BenchRun, spawned_at, text_of
from harness.core.errors import BadInput

SESSION_SPAN_FILE = "pytest-session.json"


def write_session_span(run_dir: Path, started: float | None) -> None:
    """When pytest started and ended, beside the engine sessions of ``run_dir`` (the plugin, at the session's end):
    ``bench post-resume --from`` reads it (the time before the first engine is the environments' and collection's),
    since a kept run leaves no other run start."""
    if run_dir.is_dir():
        (run_dir / SESSION_SPAN_FILE).write_text(json.dumps({"started": started, "finished": time.time()}) + "\n")


def session_span(reports: Path) -> tuple[float | None, float | None]:
    """When the newest pytest run under ``reports`` started and how long it ran (s), from the plugin's
    ``pytest-session.json``; ``(None, None)`` where no run left one (one made before the plugin wrote it)."""
    spans = []
    for f in reports.glob(f".run-*/{SESSION_SPAN_FILE}"):
        try:
            span = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(span, dict) and isinstance(span.get("started"), (int, float)) \
                and isinstance(span.get("finished"), (int, float)):
            spans.append((float(span["started"]), float(span["finished"])))
    if not spans:
        return None, None
    started, finished = max(spans)
    return started, round(finished - started, 3)


def session_folders(reports: Path) -> list[Path]:
    """Every engine session folder of the pytest runs under ``reports``, in name order (worker, then engine)."""
    return sorted(p for p in reports.glob(".run-*/*/sessions/*") if p.is_dir())


def load_pytest(reports: Path, wall_s: float | None = None, started: float | None = None,
                argv: tuple[str, ...] = ("pytest",)) -> BenchRun:
    """The breakdown of the pytest run whose ``--repro-reports`` is ``reports``; ``started``: its start (epoch s)."""
    folders = [(f, read_events(text_of(f / "events.jsonl"))) for f in session_folders(reports)]
    folders = [(f, evs) for f, evs in folders if evs]
    if not folders:
        raise BadInput(f"{reports} holds no engine sessions (.run-*/*/sessions/*/events.jsonl): give the "
                       "--repro-reports folder of a pytest run made with --repro-keep-engines")
    if started is None and wall_s is None:
        started, wall_s = session_span(reports)
    firsts = [min([e["t"] for e in evs] + [s for s in [spawned_at(f)] if s is not None]) for f, evs in folders]
    t0 = started if started is not None else min(firsts)
    engines = tuple(timeline(f"{f.parent.parent.name}/{f.name.rsplit('-', 1)[0]}", evs,
                             text_of(f / "engine.log"), t0, spawned_at(f)) for f, evs in folders)
    ends = [e.end for e in engines if e.spans]
    run_s = round(wall_s if wall_s is not None else max(ends, default=0.0), 3)
    starts = [e.start for e in engines if e.spans]
    return BenchRun("post-resume", argv, wall_s, run_s, round(min(starts), 3) if starts else run_s, engines)
