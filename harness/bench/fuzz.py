"""A benchmarked ``vllm-repro fuzz`` run: each version's process split into its parts, and its examples' speed.

A fuzz run leaves no ``results.json``; each version's process (``reports/engines/fuzz-<version>/events.jsonl``)
says when it started, when vLLM's scheduler was loaded (``sched``), and in its ``fuzz`` event how many wall
seconds each part of the fuzzing took, in order (``phases``: the setups probed once, the examples, the reach
report, the falsifying example's minimising and replay; ``repro/sched/fuzz.py`` ``run_fuzz``), with the examples'
CPU seconds.  The event is written when the last part ends, so the parts are laid back from it; ``fuzz.json``
adds each version's examples per CPU second and reach.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.bench.phases import EngineTimeline, Span, read_events
from harness.bench.run import BenchRun, text_of
from harness.core.errors import BadInput

# The parts of a fuzz process, in the order run_fuzz runs them (the names of the fuzz event's ``phases``).
FUZZ_PARTS = ("setups", "examples", "reach report", "known minimise", "minimise+replay")


def fuzz_timeline(engine: str, events: list[dict[str, Any]], t0: float) -> EngineTimeline:
    """``engine``'s spans since ``t0``: import (start -> sched), the harness's own gaps, then the fuzz parts."""
    start = next((e["t"] for e in events if e.get("event") == "start"), None)
    loaded = next((e["t"] for e in events if e.get("event") == "sched"), None)
    fuzz = next((e for e in events if e.get("event") == "fuzz"), None)
    done = next((e["t"] for e in events if e.get("event") == "done"), None)
    if start is None or loaded is None:
        return EngineTimeline(engine, (), None, ("no start or sched event: the process never loaded vLLM",))
    spans = [Span("import+construct", start - t0, loaded - t0)]
    problems: list[str] = []
    parts = (fuzz or {}).get("phases") or {}
    if fuzz is None:
        problems.append("no fuzz event: the run ended before the examples did")
    elif not parts:
        problems.append("the fuzz event has no phases (a release of the harness before bench fuzz)")
    end = None if fuzz is None else fuzz["t"] - t0
    laid: list[Span] = []
    for name in reversed([p for p in FUZZ_PARTS if p in parts]):
        assert end is not None
        laid.append(Span(name, end - float(parts[name]), end))
        end -= float(parts[name])
    last = loaded - t0
    for span in reversed(laid):
        if span.start > last:
            spans.append(Span("harness", last, span.start))
        spans.append(span)
        last = span.end
    if done is not None and done - t0 > last:
        spans.append(Span("harness", last, done - t0))
    return EngineTimeline(engine, tuple(spans), round(loaded - start, 3), tuple(problems))


def _summary(reports: Path) -> dict[str, Any]:
    text = text_of(reports / "fuzz.json")
    try:
        data = json.loads(text) if text else None
    except ValueError as exc:
        raise BadInput(f"{reports}/fuzz.json is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != "vllm-repro/fuzz":
        raise BadInput(f"{reports} holds no fuzz.json: give the --reports folder of a fuzz run")
    return data


def speed(version: dict[str, Any]) -> dict[str, Any]:
    """One version's examples, CPU seconds, examples per CPU second and reach of ``scheduler.py``."""
    reach = version.get("reach") or {}
    reachable = (reach.get("reachable") or {}).get("sched/scheduler.py") or {}
    return {"version": version.get("version"), "status": version.get("status"), "examples": version.get("examples"),
            "cpu_s": version.get("cpu_s"), "examples_per_cpu_s": version.get("examples_per_cpu_s"),
            "reach_scheduler_py": ((reach.get("files") or {}).get("sched/scheduler.py") or {}).get("percent"),
            "reach_of_reachable": reachable.get("percent")}


def load_fuzz(reports: Path, wall_s: float | None = None, started: float | None = None,
              argv: tuple[str, ...] = ("fuzz",)) -> BenchRun:
    """The breakdown of the fuzz run in ``reports``; ``started``: its start (epoch s), else its first process's."""
    summary = _summary(reports)
    folders = sorted(p for p in (reports / "engines").glob("fuzz-*") if p.is_dir())
    runs = [(p.name, read_events(text_of(p / "events.jsonl"))) for p in folders]
    starts = [e["t"] for _, evs in runs for e in evs if e.get("event") == "start"]
    ends = [e["t"] for _, evs in runs for e in evs]
    t0 = started if started is not None else min(starts, default=0.0)
    engines = tuple(fuzz_timeline(name, evs, t0) for name, evs in runs if evs)
    run_s = round(max(ends, default=t0) - t0, 3)
    before = round(min(starts) - t0, 3) if starts else run_s
    return BenchRun("fuzz", argv, wall_s, run_s, before, engines,
                    {"fuzz": [speed(v) for v in summary.get("versions") or []]})
