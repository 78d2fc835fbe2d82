"""Where an engine's time went, read from what a run leaves in its reports folder (pure: text in, records out).

Each engine folder (``reports/engines/<engine id>/``) holds the engine process's events (``events.jsonl``, one
JSON object a line with its wall-clock ``t``: ``start`` when the process began, ``engine`` once the engine answered,
one ``scenario`` per cell as it finished, with its ``duration_s``) and vLLM's own log (``engine.log``), where vLLM
says how long it spent loading the weights ("Model loading took ... and X seconds", "Loading weights took X
seconds") and initialising the engine ("init engine (profile, create kv cache, warmup model) took X s/seconds";
vLLM 0.21-0.34 spell it so).  From these an engine's start-up splits into model load, KV cache and warm-up, and the
rest (interpreter, ``import vllm``, engine construction); a gated engine's ``turn`` event ends its wait, ready,
for its turn at the scenarios (harness.run.turns); its scenarios each have a start and an end; the gaps between
them are the harness's own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_MODEL_LOAD = re.compile(r"Model loading took .*? and ([0-9.]+) seconds")
_WEIGHTS = re.compile(r"Loading weights took ([0-9.]+) seconds")
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
_GRAPHS = re.compile(r"Graph capturing finished in ([0-9.]+) secs")


@dataclass(frozen=True)
class Span:
    """One stretch of an engine's time, in seconds since the run began."""

    phase: str  # "spawn+import", "import+construct", "model load", "kv cache+warm-up", "turn wait", "scenario", ...
    start: float
    end: float
    label: str = ""  # the scenario's id, for scenario spans

    @property
    def seconds(self) -> float:
        return round(self.end - self.start, 3)


@dataclass(frozen=True)
class EngineTimeline:
    """One engine's spans, in order; ``startup_s`` as the engine process measured it."""

    engine: str
    spans: tuple[Span, ...]
    startup_s: float | None
    problems: tuple[str, ...] = ()  # what could not be read (the breakdown is then partial, and says so)

    def seconds(self, phase: str) -> float:
        return round(sum(s.seconds for s in self.spans if s.phase == phase), 3)

    @property
    def start(self) -> float:
        return min((s.start for s in self.spans), default=0.0)

    @property
    def end(self) -> float:
        return max((s.end for s in self.spans), default=0.0)


@dataclass
class _Log:
    model_load: float = 0.0
    init: float = 0.0
    graphs: float = 0.0
    found: list[str] = field(default_factory=list)


def read_log(text: str) -> _Log:
    """The start-up durations vLLM logs (every worker logs its own load: the longest counts, they run at once)."""
    log = _Log()
    loads = [float(m) for m in _MODEL_LOAD.findall(text)] or [float(m) for m in _WEIGHTS.findall(text)]
    if loads:
        log.model_load, log.found = max(loads), [*log.found, "model load"]
    inits = [float(m) for m in _INIT.findall(text)]
    if inits:
        log.init, log.found = max(inits), [*log.found, "init engine"]
    log.graphs = max((float(m) for m in _GRAPHS.findall(text)), default=0.0)
    return log


def read_events(text: str) -> list[dict[str, Any]]:
    """The engine's events; a line that is no JSON object is skipped (a killed engine may leave half a line)."""
    out = []
    for line in text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and isinstance(ev.get("t"), int | float):
            out.append(ev)
    return out


def timeline(engine: str, events: list[dict[str, Any]], log_text: str, t0: float,
             spawned: float | None = None) -> EngineTimeline:
    """``engine``'s spans from its events and log, in seconds since ``t0`` (the run's start); ``spawned``: when the
    harness started the engine's process (its ``spawned.json``), before the interpreter and ``import vllm``."""
    problems: list[str] = []
    start = next((e["t"] for e in events if e.get("event") == "start"), None)
    ready = next((e for e in events if e.get("event") == "engine"), None)
    if start is None:
        return EngineTimeline(engine, (), None, ("no start event",))
    spans = [Span("spawn+import", spawned - t0, start - t0)] if spawned is not None and spawned < start else []
    spans += _startup(start - t0, None if ready is None else ready["t"] - t0, read_log(log_text), problems)
    last = spans[-1].end if spans else start - t0
    turn = next((e for e in events if e.get("event") == "turn"), None)
    if turn is not None and turn["t"] - t0 > last:
        # A gated engine, started up beside others, waited for its turn at the scenarios (harness.run.turns).
        spans.append(Span("turn wait", last, turn["t"] - t0))
        last = turn["t"] - t0
    for ev in (e for e in events if e.get("event") == "scenario"):
        end = ev["t"] - t0
        begin = max(last, end - float(ev.get("duration_s") or 0.0))
        if begin > last:
            spans.append(Span("harness", last, begin))
        spans.append(Span("scenario", begin, end, str(ev.get("id", ""))))
        last = end
    return EngineTimeline(engine, tuple(spans), None if ready is None else ready.get("startup_s"), tuple(problems))


def _startup(start: float, ready: float | None, log: _Log, problems: list[str]) -> list[Span]:
    """Process start to the engine's answer: the rest, then model load, then KV cache and warm-up (vLLM's order)."""
    if ready is None:
        problems.append("the engine never answered (no engine event): start-up not split")
        return []
    if len(log.found) < 2:
        problems.append("vLLM's log lacks its model-load or init-engine line: start-up not split")
        return [Span("start-up", start, ready)]
    init_start = ready - log.init
    load_start = max(start, init_start - log.model_load)
    return [Span("import+construct", start, load_start), Span("model load", load_start, init_start),
            Span("kv cache+warm-up", init_start, ready)]
