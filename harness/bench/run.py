"""A benchmarked run: its wall time, what happened before the first engine, and each engine's timeline.

Read from a reports folder (``results.json`` for the run's own start and end, ``engines/*/`` for each engine's
events and log): a run the ``bench`` command just made, or any earlier one (``--from``), e.g. a run on a GPU node.
"""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.bench.phases import EngineTimeline, read_events, timeline
from harness.core.errors import BadInput

# The last five: a fuzz run's parts.
PHASES = ("environments", "spawn+import", "import+construct", "model load", "kv cache+warm-up", "start-up",
          "turn wait", "scenario", "harness", "setups", "examples", "reach report", "known minimise", "minimise+replay")
SCHEMA = "vllm-repro/bench"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class BenchRun:
    """One run's breakdown; times in seconds."""

    workload: str
    argv: tuple[str, ...]
    wall_s: float | None  # measured around the command (None: read from an earlier run)
    run_s: float  # results.json created -> finished
    before_engines_s: float  # run start -> first engine start: environments resolved, built, verified; planning
    engines: tuple[EngineTimeline, ...]
    workload_facts: dict[str, Any] = field(default_factory=dict)  # what the workload says of itself (fuzz: speed)

    def phase_seconds(self) -> dict[str, float]:
        """Engine-seconds per phase (engines side by side each count), plus the time before the first engine."""
        out = {"environments": round(self.before_engines_s, 3)}
        for phase in PHASES[1:]:
            out[phase] = round(sum(e.seconds(phase) for e in self.engines), 3)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "workload": self.workload,
                "argv": list(self.argv), "wall_s": self.wall_s, "run_s": self.run_s,
                "phases": self.phase_seconds(),
                "engines": [{"engine": e.engine, "startup_s": e.startup_s, "problems": list(e.problems),
                             "phases": {p: e.seconds(p) for p in PHASES[1:] if e.seconds(p)},
                             "spans": [{"phase": s.phase, "label": s.label, "start": round(s.start, 3),
                                        "end": round(s.end, 3)} for s in e.spans]}
                            for e in self.engines],
                **self.workload_facts}


def text_of(path: Path) -> str:
    """``path``'s text, or its ``.xz``'s; empty when neither exists."""
    if path.is_file():
        return path.read_text(errors="replace")
    xz = path.with_name(path.name + ".xz")
    return lzma.open(xz, "rt", errors="replace").read() if xz.is_file() else ""


def _results(reports: Path) -> dict[str, Any]:
    text = text_of(reports / "results.json")  # or results.json.xz
    try:
        data = json.loads(text) if text else None
    except ValueError as exc:
        raise BadInput(f"{reports}/results.json is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{reports} holds no results.json: give the --reports folder of a matrix or frameworks run")
    return data


def _epoch(stamp: Any, what: str, reports: Path) -> float:
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        raise BadInput(f"{reports}/results.json: {what} {stamp!r} is no ISO time") from None


def _spawned(folder: Path) -> float | None:
    """When the harness spawned the engine's process (``spawned.json``; runs before it have none)."""
    try:
        t = json.loads((folder / "spawned.json").read_text()).get("t")
    except (OSError, ValueError, AttributeError):
        return None
    return float(t) if isinstance(t, int | float) else None


def load_run(reports: Path, workload: str = "", wall_s: float | None = None) -> BenchRun:
    """The breakdown of the run whose reports are in ``reports``."""
    data = _results(reports)
    t0 = _epoch(data.get("created"), "created", reports)
    t1 = _epoch(data.get("finished") or data.get("created"), "finished", reports)
    engines = []
    for folder in sorted(p for p in (reports / "engines").glob("*") if p.is_dir()):
        events = read_events(text_of(folder / "events.jsonl"))
        if events:
            # The server and client doors' vLLM logs its start-up in the server's log, beside the engine's.
            log = text_of(folder / "engine.log") + "\n" + text_of(folder / "server.log")
            engines.append(timeline(folder.name, events, log, t0, _spawned(folder)))
    starts = [e.start for e in engines if e.spans]
    return BenchRun(workload or "run", tuple(str(a) for a in data.get("argv") or ()), wall_s, round(t1 - t0, 3),
                    round(min(starts), 3) if starts else round(t1 - t0, 3), tuple(engines))
