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

from harness.bench.cpu import CpuSample
from harness.bench.per_scenario import profile_of_engine, profile_totals, scenario_totals
from harness.bench.phases import EngineTimeline, Span, read_events, timeline
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
    cpu: CpuSample | None = None  # CPU seconds of the workload's processes, per engine (None: not sampled)
    machine: dict[str, Any] = field(default_factory=dict)  # host, CPUs, load average at the start and the end

    def phase_seconds(self) -> dict[str, float]:
        """Engine-seconds per phase (engines side by side each count), plus the time before the first engine."""
        out = {"environments": round(self.before_engines_s, 3)}
        for phase in PHASES[1:]:
            out[phase] = round(sum(e.seconds(phase) for e in self.engines), 3)
        return out

    @property
    def cpu_s(self) -> float | None:
        return None if self.cpu is None else self.cpu.cpu_s

    def profiles(self) -> dict[str, dict[str, Any]]:
        """:func:`profile_totals`, with each profile's engines' sampled CPU seconds when there are some."""
        out = profile_totals(self.engines)
        if self.cpu is not None and self.cpu.per_engine:  # a total alone says nothing per profile
            for row in out.values():
                row["cpu_s"] = 0.0
            for engine, secs in self.cpu.per_engine.items():
                if (hit := out.get(profile_of_engine(engine))) is not None:
                    hit["cpu_s"] = round(hit["cpu_s"] + secs, 1)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "workload": self.workload,
                "argv": list(self.argv), "wall_s": self.wall_s, "run_s": self.run_s,
                "cpu_s": None if self.cpu is None else self.cpu.cpu_s, "machine": self.machine,
                "phases": self.phase_seconds(), "scenarios": scenario_totals(self.engines),
                "profiles": self.profiles(), "cpu": None if self.cpu is None else {
                    "per_engine": self.cpu.per_engine, "processes": self.cpu.processes,
                    "method": "sampled from /proc every 0.5 s (harness.bench.cpu): a lower bound"},
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


def spawned_at(folder: Path) -> float | None:
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
            engines.append(timeline(folder.name, events, log, t0, spawned_at(folder)))
    starts = [e.start for e in engines if e.spans]
    return BenchRun(workload or "run", tuple(str(a) for a in data.get("argv") or ()), wall_s, round(t1 - t0, 3),
                    round(min(starts), 3) if starts else round(t1 - t0, 3), tuple(engines),
                    machine={"host": data["host"]} if data.get("host") else {})


def load_bench_json(path: Path) -> BenchRun:
    """A ``bench.json`` read back (to draw its picture again, e.g. one written where matplotlib was missing)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not a readable bench.json ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise BadInput(f"{path} is no bench.json (schema {SCHEMA}): give a reports folder or a bench.json")
    engines = tuple(EngineTimeline(e["engine"], tuple(Span(s["phase"], s["start"], s["end"], s.get("label", ""))
                                                      for s in e.get("spans", ())),
                                   e.get("startup_s"), tuple(e.get("problems", ())))
                    for e in doc.get("engines", ()))
    cpu = doc.get("cpu") or {}
    sample = None if doc.get("cpu_s") is None else CpuSample(doc["cpu_s"], cpu.get("per_engine") or {},
                                                               cpu.get("processes") or 0)
    facts = {"fuzz": doc["fuzz"]} if "fuzz" in doc else {}
    return BenchRun(doc.get("workload", "run"), tuple(doc.get("argv", ())), doc.get("wall_s"), doc.get("run_s", 0.0),
                    (doc.get("phases") or {}).get("environments", 0.0), engines, facts, sample,
                    doc.get("machine") or {})
