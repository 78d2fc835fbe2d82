"""Cell patterns: any subset of axes, each with the values it allows.

One grammar for ``bisect --cell``, known-bug rules, the workaround ledger and history selection:
``executor=mp,async=on,mode=keep,clear_cache=true,tp=2,scenario=weight_sync`` (keys are axis names or
aliases, see harness.core.cell.Cell; ``key=a|b`` allows several values).  A pattern with one value per axis
but the version is a template: ``template.at(version)`` is the cell a bisect probes on each candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.core.axes import AxisTable
from harness.core.cell import Cell, at_release
from harness.core.errors import BadInput

DEFAULT_TEMPLATE = "executor=mp,async=on,mode=keep,clear_cache=true"


@dataclass(frozen=True)
class CellPattern:
    """Allowed values per constrained axis (by axis name); an unconstrained axis matches anything.

    ``cell_type`` is the cell class whose axes the names are (its table: harness.core.axes).
    """

    allowed: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    cell_type: type[Cell] = field(default=Cell, compare=False, repr=False)

    @property
    def table(self) -> AxisTable:
        return self.cell_type.table()

    def matches(self, cell: Cell) -> bool:
        by_name = type(cell).table().by_name
        return all(getattr(cell, by_name[name].attr) in values for name, values in self.allowed)

    def get(self, name: str) -> tuple[Any, ...] | None:
        return dict(self.allowed).get(name)

    def merged(self, other: CellPattern) -> CellPattern:
        """``other``'s constraints over this pattern's (the later one wins per axis)."""
        d = {**dict(self.allowed), **dict(other.allowed)}
        return CellPattern(tuple((a.name, d[a.name]) for a in self.table.axes if a.name in d), self.cell_type)

    @property
    def text(self) -> str:
        return ",".join(f"{name}={'|'.join(_word(self.table, name, v) for v in values)}"
                        for name, values in self.allowed)

    def template(self) -> CellTemplate:
        """This pattern over the default template, every axis but the version pinned to one value."""
        merged = parse_pattern(DEFAULT_TEMPLATE, cell_type=self.cell_type).merged(self)
        several = [name for name, values in merged.allowed if len(values) != 1]
        if several or merged.get("version"):
            raise BadInput(f"a --cell names one value per axis and no version; got {self.text!r}")
        return CellTemplate(tuple((name, values[0]) for name, values in merged.allowed), self.cell_type)


def _word(table: AxisTable, name: str, value: Any) -> str:
    a = table.by_name[name]
    if a.kind == "flag":
        return "on" if value else "off"
    return str(value)


def parse_pattern(raw: str | None, where: str = "--cell", cell_type: type[Cell] = Cell) -> CellPattern:
    """``key=value[|value],...`` -> CellPattern; BadInput names a bad key or value and the valid ones."""
    table = cell_type.table()
    allowed: dict[str, tuple[Any, ...]] = {}
    for part in (p.strip() for p in (raw or "").split(",") if p.strip()):
        key, sep, val = part.partition("=")
        if not sep:
            raise BadInput(f"bad {where} item {part!r}; write key=value, e.g. {DEFAULT_TEMPLATE}")
        a = table.lookup(key.strip())
        allowed[a.name] = tuple(dict.fromkeys(a.parse(v) for v in val.split("|")))
    return CellPattern(tuple((a.name, allowed[a.name]) for a in table.axes if a.name in allowed), cell_type)


def pattern_from_mapping(rule: Mapping[str, Any], where: str, cell_type: type[Cell] = Cell) -> CellPattern:
    """A pattern from a TOML table (``async_scheduling = true``, ``executor = ["mp", "ray-v2"]``).

    Keys are axis names (as in results JSON), values of the axis's own type; a list allows several.
    """
    by_name = cell_type.table().by_name
    allowed: dict[str, tuple[Any, ...]] = {}
    for key, raw in rule.items():
        if key not in by_name:
            raise BadInput(f"{where}: unknown cell key {key!r}; valid: {', '.join(by_name)}")
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise BadInput(f"{where}: {key} lists no value")
        try:
            allowed[key] = tuple(dict.fromkeys(by_name[key].coerce(v, where) for v in items))
        except BadInput as exc:
            msg = str(exc)
            raise BadInput(msg if msg.startswith(where) else f"{where}: {msg}") from None
    return CellPattern(tuple((a.name, allowed[a.name]) for a in cell_type.table().axes if a.name in allowed),
                       cell_type)


@dataclass(frozen=True)
class CellTemplate:
    """A cell without its version: the predicate a bisect evaluates on every candidate."""

    pairs: tuple[tuple[str, Any], ...]
    cell_type: type[Cell] = field(default=Cell, compare=False, repr=False)

    @property
    def values(self) -> Mapping[str, Any]:
        return dict(self.pairs)

    def at(self, version: str) -> Cell:
        """The cell on ``version``; an axis the template leaves at its default takes the release's own value
        where that release lacks the default (harness.core.cell.at_release)."""
        by_name = self.cell_type.table().by_name
        cell = self.cell_type(version, **{by_name[n].attr: v for n, v in self.pairs})
        return at_release(cell, frozenset(n for n, _ in self.pairs))

    @property
    def label(self) -> str:
        """``mp, async on, keep, clear_cache=true`` and every other axis that is not at its default."""
        v = self.values
        base = (f"{v['executor']}, async {'on' if v['async_scheduling'] else 'off'}, {v['mode']}, "
                f"clear_cache={'true' if v['clear_cache'] else 'false'}")
        shown = ("executor", "async_scheduling", "mode", "clear_cache")
        table = self.cell_type.table()
        extra = [f"{n}={_word(table, n, x)}" for n, x in v.items()
                 if n not in shown and x != table.by_name[n].default]
        return ", ".join([base, *extra])
