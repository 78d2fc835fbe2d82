"""The cell and its engine key, derived from the axes table: fields, ids, id parser, sort order, JSON.

``Cell`` has one field per axis (in table order, so ``Cell("0.21.0", "mp", True, "keep", True)`` names the
first five); ``EngineKey`` has the engine axes.  A cell id is ``vllm<version>-`` followed by every axis's
non-empty segment in id order, e.g. ``vllm0.21.0-mp-async_on-keep-clear-tp2-weight_sync``; defaults spell as
nothing, so adding an axis leaves every existing id unchanged.
"""

from __future__ import annotations

import re
from dataclasses import field, make_dataclass, replace
from typing import Any

from harness.core.axes import AXES, BY_NAME, ENGINE_AXES, ID_ORDER, LOOP_ORDER, SORT_ORDER, Axis
from harness.core.errors import BadInput
from harness.core.scenarios import DEFAULT_PROFILE, pauses, profile_of
from harness.core.versions import version_key


def _segments(obj: object, axes: tuple[Axis, ...]) -> list[str]:
    # A scenario that never pauses has no mode or clear_cache to spell (harness.core.scenarios).
    paused = pauses(getattr(obj, "scenario", "pause"))
    return [s for a in axes if (paused or not a.pause_only) and (s := a.spell(getattr(obj, a.attr)))]


def _value_rank(a: Axis, value: Any) -> tuple[Any, ...]:
    if a.kind == "version":
        return version_key(value)
    if a.values:
        known = value in a.values
        return (a.values.index(value) if known else len(a.values), "" if known else str(value))
    return (value,)


class _EngineKeyMethods:
    @property
    def id(self) -> str:
        """``vllm0.21.0-mp-async_on[-tp2][-mr_v2][-batch_invariant][-sched][-<profile>]``."""
        profile = getattr(self, "profile", DEFAULT_PROFILE)
        tail = [] if profile == DEFAULT_PROFILE else [profile.replace("-", "_")]
        return "-".join(_segments(self, tuple(a for a in ID_ORDER if a.engine)) + tail)


class _CellMethods:
    @property
    def engine(self) -> Any:
        """The engine config this cell runs on: its engine axes and its scenario's engine profile (cells that
        differ only in scenario axes share it when their scenarios share a profile)."""
        # The scheduler tier builds each scenario's scheduler itself (harness.sched.cells): no engine profile.
        profile = profile_of(self.scenario) if self.tier == "engine" else DEFAULT_PROFILE
        return EngineKey(**{a.attr: getattr(self, a.attr) for a in ENGINE_AXES}, profile=profile)

    @property
    def id(self) -> str:
        return "-".join(_segments(self, ID_ORDER))

    @property
    def config_id(self) -> str:
        """The id without the version: one row of a history heat-map or a comparison."""
        return "-".join(_segments(self, ID_ORDER[1:]))

    @property
    def scenario_id(self) -> str:
        """The scenario axes alone (``keep-clear``, ``weight_sync-keep-clear``): a scenario of its engine."""
        return "-".join(_segments(self, tuple(a for a in LOOP_ORDER if not a.engine)))

    @property
    def variant(self) -> tuple[str, ...]:
        """Segments of the engine axes beyond version, executor and async (``("tp2", "mr_v2")``)."""
        return tuple(_segments(self, tuple(a for a in ID_ORDER if a.engine and a.id_rank > 2)))

    @property
    def sort_key(self) -> tuple[Any, ...]:
        """Report order: version, executor, TP, runner, batch-invariant, async, mode, clear_cache, ..."""
        return tuple(_value_rank(a, getattr(self, a.attr)) for a in SORT_ORDER)

    def to_dict(self) -> dict[str, Any]:
        return {a.name: getattr(self, a.attr) for a in AXES}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        return cell_from_dict(d)

    def replace(self, **changes: Any) -> Any:
        return replace(self, **changes)  # type: ignore[type-var]


def _fields(axes: tuple[Axis, ...]) -> list[tuple[str, type, Any]]:
    # The version comes first and has no default; every other axis defaults to its table default.
    return [(a.attr, object, field()) if a.kind == "version" else (a.attr, object, field(default=a.default))
            for a in axes]


Cell = make_dataclass("Cell", _fields(AXES), bases=(_CellMethods,), frozen=True, order=True)
Cell.__doc__ = "One cell of the matrix: a value per axis of harness.core.axes.AXES."
Cell.__module__ = __name__  # pickled by Ray tasks and pytest-xdist: findable as harness.core.cell.Cell
# The profile (engine arguments a scenario needs, harness.core.scenarios) comes last: not an axis of its own,
# it follows from the scenario, and EngineKey(version, executor, async) keeps meaning the default profile.
EngineKey = make_dataclass("EngineKey", [*_fields(ENGINE_AXES), ("profile", str, field(default=DEFAULT_PROFILE))],
                           bases=(_EngineKeyMethods,), frozen=True, order=True)
EngineKey.__doc__ = "Everything that needs a separate engine process: the engine axes of a cell and its profile."
EngineKey.__module__ = __name__

# Axes that are always in an id (their defaults spell as something): a cell dict must name them.
REQUIRED_KEYS = tuple(a.name for a in AXES if a.kind == "version" or a.spell(a.default))


def cell_from_dict(d: dict[str, Any]) -> Any:
    """A Cell from its JSON form; axes added after a file was written take their defaults."""
    missing = [k for k in REQUIRED_KEYS if k not in d]
    if missing:
        raise KeyError(", ".join(missing))
    values = {}
    for a in AXES:
        if a.name in d:
            raw = d[a.name]
            values[a.attr] = str(raw) if a.kind in ("version", "choice") else (
                int(raw) if a.kind == "int" else bool(raw))
    return Cell(**values)


def _id_regex(axes: tuple[Axis, ...]) -> str:
    parts = []
    for a in axes:
        group = f"(?P<{a.attr}>{a.segment_re()})"
        if a.kind == "version":
            parts.append(group)
        elif a.kind != "int" and not a.pause_only and all(s for _, s in a.spellings):
            parts.append(f"-{group}")
        else:
            parts.append(f"(?:-{group})?")
    return "".join(parts)


CELL_ID_RE = re.compile(_id_regex(ID_ORDER))
ENGINE_ID_RE = re.compile(_id_regex(tuple(a for a in ID_ORDER if a.engine)))


def _pause_segments_agree(m: re.Match[str]) -> bool:
    """A pausing scenario's id spells mode and clear_cache; a non-pausing one spells neither."""
    present = [m.group(a.attr) is not None for a in AXES if a.pause_only]
    scenario = BY_NAME["scenario"].read(m.group("scenario"))
    return all(present) if pauses(scenario) else not any(present)


def parse_cell_id(text: str) -> Any:
    """The Cell a cell id names (``vllm0.21.0-mp-async_on-keep-clear-tp2``); BadInput if it names none."""
    m = CELL_ID_RE.fullmatch(text.strip())
    if m is None or not _pause_segments_agree(m):
        raise BadInput(f"{text!r} is not a cell id (e.g. vllm0.21.0-mp-async_on-keep-clear)")
    return Cell(**{a.attr: a.read(m.group(a.attr)) for a in AXES})


def find_cell_id(text: str) -> Any | None:
    """The Cell whose id ends ``text`` in brackets (a pytest node id ``test_x[<cell id>]``), or None."""
    m = re.search(r"\[([^\[\]]+)\]$", text)
    if m is None or (c := CELL_ID_RE.fullmatch(m.group(1))) is None or not _pause_segments_agree(c):
        return None
    return parse_cell_id(m.group(1))


def parse_config_id(text: str) -> Any | None:
    """The Cell (version "") a config id names (``mp-async_on-keep-clear``), or None if it names none."""
    m = CELL_ID_RE.fullmatch(f"vllm_-{text}")
    if m is None or not _pause_segments_agree(m):
        return None
    return Cell(**{a.attr: ("" if a.kind == "version" else a.read(m.group(a.attr))) for a in AXES})
