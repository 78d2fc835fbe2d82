"""Per scenario and per engine profile: where a run's engine time went (issue 37's "the stale-KV cells share the
engines started for their engine configuration"; issue 39's breakdown by what was run, not only by phase).

A scenario span's label is its scenario id within its engine (``keep-clear``, ``weight_sync-keep-noclear``,
``stale_kv_keep-keep-noclear``: :attr:`harness.core.cell.Cell.scenario_id`); the scenario is the segment that
spells one (:attr:`harness.core.scenarios.Scenario.segment`), else the one spelled as nothing (``pause``).  An
engine's profile is its id's tail (:attr:`harness.core.cell.EngineKey.id`: ``-tiny_kv``), else the default one.
Engines are started per engine configuration, profile included, so a scenario of a profile no other selected
scenario has starts engines of its own: the profile totals say how many and what they cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.bench.phases import EngineTimeline
from harness.core.profiles import DEFAULT_PROFILE, PROFILES
from harness.core.scenarios import SCENARIO_TABLE

_BY_SEGMENT = {s.segment: s.name for s in SCENARIO_TABLE if s.segment}
_BLANK = next((s.name for s in SCENARIO_TABLE if not s.segment), "pause")
_PROFILE_TAILS = {p.replace("-", "_"): p for p in PROFILES if p != DEFAULT_PROFILE}


def scenario_of(label: str) -> str:
    """The scenario a scenario span's label names."""
    return next((_BY_SEGMENT[seg] for seg in label.split("-") if seg in _BY_SEGMENT), _BLANK)


def profile_of_engine(engine: str) -> str:
    """The engine profile an engine id (or ``worker/engine-id-pid`` folder name) ends with."""
    segments = engine.split("/")[-1].split("-")
    return next((_PROFILE_TAILS[s] for s in reversed(segments) if s in _PROFILE_TAILS), DEFAULT_PROFILE)


def _scenarios_on(engine: EngineTimeline) -> list[tuple[str, float]]:
    return [(scenario_of(s.label), s.seconds) for s in engine.spans if s.phase == "scenario"]


def scenario_totals(engines: Iterable[EngineTimeline]) -> dict[str, dict[str, Any]]:
    """Per scenario, in the order first seen: its cells, the engine-seconds its cells took, the engines it ran on,
    their profile, and the other scenarios those engines ran (``shared_with``: empty = engines of its own)."""
    out: dict[str, dict[str, Any]] = {}
    ran: dict[str, set[str]] = {}
    for eng in engines:
        names = _scenarios_on(eng)
        for name, secs in names:
            row = out.setdefault(name, {"cells": 0, "scenario_s": 0.0, "engines": [],
                                        "profile": profile_of_engine(eng.engine)})
            row["cells"] += 1
            row["scenario_s"] = round(row["scenario_s"] + secs, 3)
            if eng.engine not in row["engines"]:
                row["engines"].append(eng.engine)
            ran.setdefault(name, set()).update(n for n, _ in names)
    for name, row in out.items():
        row["shared_with"] = sorted(ran[name] - {name})
    return out


def profile_totals(engines: Iterable[EngineTimeline]) -> dict[str, dict[str, Any]]:
    """Per engine profile: its engines, their engine-seconds (first span to last: start-up, turn wait, scenarios,
    the harness's gaps), of which start-up (every span before the first scenario) and scenarios, and the
    scenarios they ran."""
    out: dict[str, dict[str, Any]] = {}
    for eng in engines:
        row = out.setdefault(profile_of_engine(eng.engine), {"engines": 0, "engine_s": 0.0, "startup_s": 0.0,
                                                              "scenario_s": 0.0, "scenarios": []})
        first = next((s.start for s in eng.spans if s.phase == "scenario"), eng.end)
        row["engines"] += 1
        row["engine_s"] = round(row["engine_s"] + eng.end - eng.start, 3) if eng.spans else row["engine_s"]
        row["startup_s"] = round(row["startup_s"] + sum(min(s.end, first) - s.start for s in eng.spans
                                                        if s.start < first), 3)
        row["scenario_s"] = round(row["scenario_s"] + eng.seconds("scenario"), 3)
        row["scenarios"] += [n for n, _ in _scenarios_on(eng)]
    for row in out.values():
        row["scenarios"] = list(dict.fromkeys(row["scenarios"]))
    return out
