"""Cell patterns: any subset of axes, each with the values it allows.

One grammar for ``bisect --cell``, known-bug rules, the workaround ledger and history selection:
``executor=mp,async=on,mode=keep,clear_cache=true,tp=2,scenario=weight_sync`` (keys are axis names or
aliases, see harness.core.axes; ``key=a|b`` allows several values).  A pattern with one value per axis
but the version is a template: ``template.at(version)`` is the cell a bisect probes on each candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.core.axes import AXES, BY_NAME, axis
from harness.core.cell import Cell
from harness.core.errors import BadInput

DEFAULT_TEMPLATE = "executor=mp,async=on,mode=keep,clear_cache=true"


@dataclass(frozen=True)
class CellPattern:
    """Allowed values per constrained axis (by axis name); an unconstrained axis matches anything."""

    allowed: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def matches(self, cell: Any) -> bool:
        return all(getattr(cell, BY_NAME[name].attr) in values for name, values in self.allowed)

    def get(self, name: str) -> tuple[Any, ...] | None:
        return dict(self.allowed).get(name)

    def merged(self, other: CellPattern) -> CellPattern:
        """``other``'s constraints over this pattern's (the later one wins per axis)."""
        d = {**dict(self.allowed), **dict(other.allowed)}
        return CellPattern(tuple((a.name, d[a.name]) for a in AXES if a.name in d))

    @property
    def text(self) -> str:
        return ",".join(f"{name}={'|'.join(_word(name, v) for v in values)}" for name, values in self.allowed)

    def template(self) -> CellTemplate:
        """This pattern over the default template, every axis but the version pinned to one value."""
        merged = parse_pattern(DEFAULT_TEMPLATE).merged(self)
        several = [name for name, values in merged.allowed if len(values) != 1]
        if several or merged.get("version"):
            raise BadInput(f"a --cell names one value per axis and no version; got {self.text!r}")
        return CellTemplate(tuple((name, values[0]) for name, values in merged.allowed))


def _word(name: str, value: Any) -> str:
    a = BY_NAME[name]
    if a.kind == "flag":
        return "on" if value else "off"
    return str(value)


def parse_pattern(raw: str | None, where: str = "--cell") -> CellPattern:
    """``key=value[|value],...`` -> CellPattern; BadInput names a bad key or value and the valid ones."""
    allowed: dict[str, tuple[Any, ...]] = {}
    for part in (p.strip() for p in (raw or "").split(",") if p.strip()):
        key, sep, val = part.partition("=")
        if not sep:
            raise BadInput(f"bad {where} item {part!r}; write key=value, e.g. {DEFAULT_TEMPLATE}")
        a = axis(key.strip())
        allowed[a.name] = tuple(dict.fromkeys(a.parse(v) for v in val.split("|")))
    return CellPattern(tuple((a.name, allowed[a.name]) for a in AXES if a.name in allowed))


def pattern_from_mapping(table: Mapping[str, Any], where: str) -> CellPattern:
    """A pattern from a TOML table (``async_scheduling = true``, ``executor = ["mp", "ray-v2"]``).

    Keys are axis names (as in results JSON), values of the axis's own type; a list allows several.
    """
    allowed: dict[str, tuple[Any, ...]] = {}
    for key, raw in table.items():
        if key not in BY_NAME:
            raise BadInput(f"{where}: unknown cell key {key!r}; valid: {', '.join(BY_NAME)}")
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise BadInput(f"{where}: {key} lists no value")
        try:
            allowed[key] = tuple(dict.fromkeys(BY_NAME[key].coerce(v, where) for v in items))
        except BadInput as exc:
            msg = str(exc)
            raise BadInput(msg if msg.startswith(where) else f"{where}: {msg}") from None
    return CellPattern(tuple((a.name, allowed[a.name]) for a in AXES if a.name in allowed))


@dataclass(frozen=True)
class CellTemplate:
    """A cell without its version: the predicate a bisect evaluates on every candidate."""

    pairs: tuple[tuple[str, Any], ...]

    @property
    def values(self) -> Mapping[str, Any]:
        return dict(self.pairs)

    def at(self, version: str) -> Any:
        return Cell(version, **{BY_NAME[n].attr: v for n, v in self.pairs})

    @property
    def label(self) -> str:
        """``mp, async on, keep, clear_cache=true`` and every other axis that is not at its default."""
        v = self.values
        base = (f"{v['executor']}, async {'on' if v['async_scheduling'] else 'off'}, {v['mode']}, "
                f"clear_cache={'true' if v['clear_cache'] else 'false'}")
        shown = ("executor", "async_scheduling", "mode", "clear_cache")
        extra = [f"{n}={_word(n, x)}" for n, x in v.items() if n not in shown and x != BY_NAME[n].default]
        return ", ".join([base, *extra])
