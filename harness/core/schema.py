"""One small declarative validator for every file a user hands the harness.

Plans, ``--engine-args`` JSON, results and history files, known-bug and workaround tables and ``run.json`` are
each described once as a tree of specs (:class:`Obj`, :class:`ListOf`, :class:`Int`, :class:`Choice`, ...);
:func:`validate` walks a document against it and raises *one* error that names the file, the JSON path
(``requests[0].pause_at``), what was expected and what was found (for a closed set: every valid choice).
The CLI prints it as one line and exits 2, before any env is built, engine started or file written
(issue 21: ``{"requests": "nope"}`` used to start an engine and end in an AttributeError).

Pure: no I/O, no third-party dependency (the schemas are small; a JSON-Schema library would add a runtime
dependency and still need the cross-field checks written by hand).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import BadInput, ReproError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Invalid(Exception):
    """Where a document departs from its schema: the JSON path, what was expected and what was found."""

    def __init__(self, path: str, expected: str, found: str, text: str | None = None) -> None:
        super().__init__(path, expected, found)
        self.path, self.expected, self.found = path, expected, found
        self.text = text or f"expected {expected}, found {found}"


def key_path(path: str, key: object) -> str:
    """``path`` extended by an object key: ``requests[0].rid``; odd keys quoted: ``engine_args["a b"]``."""
    if isinstance(key, str) and _IDENT.match(key):
        return f"{path}.{key}" if path else key
    shown = json.dumps(key) if isinstance(key, str) else repr(key)
    return f"{path}[{shown}]"


def item_path(path: str, index: int) -> str:
    return f"{path}[{index}]"


def found(value: Any) -> str:
    """A value as an error shows it: short, with its JSON type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int):
        return f"{value} (an integer)"
    if isinstance(value, float):
        return f"{value} (a number)"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"{text!r} (a string)"
    if isinstance(value, Mapping):
        keys = ", ".join(map(str, list(value)[:6])) + (", ..." if len(value) > 6 else "")
        return f"an object with keys {keys}" if value else "an empty object"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}" if value else "an empty list"
    return type(value).__name__


class Spec:
    """A node of a schema: ``expected`` says in words what it accepts; ``check`` raises :class:`Invalid`."""

    @property
    def expected(self) -> str:
        raise NotImplementedError

    def check(self, value: Any, path: str) -> None:
        raise NotImplementedError

    def fail(self, value: Any, path: str) -> Invalid:
        return Invalid(path, self.expected, found(value))


def _bounds(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f" from {lo} to {hi}"
    if lo is not None:
        return f" >= {lo}"
    return f" <= {hi}" if hi is not None else ""


@dataclass(frozen=True)
class Int(Spec):
    lo: int | None = None
    hi: int | None = None

    @property
    def expected(self) -> str:
        return "an integer" + _bounds(self.lo, self.hi)

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(value, path)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise self.fail(value, path)


@dataclass(frozen=True)
class Num(Spec):
    """A number (an integer is one too)."""

    lo: float | None = None
    hi: float | None = None

    @property
    def expected(self) -> str:
        return "a number" + _bounds(self.lo, self.hi)

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(value, path)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise self.fail(value, path)


@dataclass(frozen=True)
class Bool(Spec):
    @property
    def expected(self) -> str:
        return "true or false"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            raise self.fail(value, path)


@dataclass(frozen=True)
class Str(Spec):
    nonempty: bool = False
    pattern: str | None = None  # a regular expression the whole string matches
    what: str = ""  # the words for a pattern: "an AsyncEngineArgs field name"

    @property
    def expected(self) -> str:
        return self.what or ("a non-empty string" if self.nonempty else "a string")

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str) or (self.nonempty and not value):
            raise self.fail(value, path)
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise self.fail(value, path)


@dataclass(frozen=True)
class Choice(Spec):
    """One of a closed set of values; the error lists them all."""

    values: tuple[Any, ...]

    @property
    def expected(self) -> str:
        return "one of " + ", ".join(v if isinstance(v, str) else repr(v) for v in self.values)

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, list | dict) or value not in self.values:
            raise self.fail(value, path)


@dataclass(frozen=True)
class Anything(Spec):
    @property
    def expected(self) -> str:
        return "any value"

    def check(self, value: Any, path: str) -> None:
        return None


@dataclass(frozen=True)
class Nullable(Spec):
    inner: Spec

    @property
    def expected(self) -> str:
        return f"null or {self.inner.expected}"

    def check(self, value: Any, path: str) -> None:
        if value is not None:
            self.inner.check(value, path)


@dataclass(frozen=True)
class AnyOf(Spec):
    """The first option that accepts the value; else the error names ``what`` (or every option)."""

    options: tuple[Spec, ...]
    what: str = ""

    @property
    def expected(self) -> str:
        return self.what or " or ".join(o.expected for o in self.options)

    def check(self, value: Any, path: str) -> None:
        for option in self.options:
            try:
                option.check(value, path)
            except Invalid:
                continue
            return
        raise self.fail(value, path)


@dataclass(frozen=True)
class ListOf(Spec):
    item: Spec
    min_len: int = 0
    what: str = ""  # "a list of requests"

    @property
    def expected(self) -> str:
        if self.what:
            return self.what
        return f"a{' non-empty' if self.min_len else ''} list of {_plural(self.item.expected)}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or len(value) < self.min_len:
            raise self.fail(value, path)
        for i, v in enumerate(value):
            self.item.check(v, item_path(path, i))


@dataclass(frozen=True)
class Tuple(Spec):
    """A list of fixed length whose items each have their own spec (``["during", 0]``)."""

    items: tuple[Spec, ...]
    what: str = ""

    @property
    def expected(self) -> str:
        return self.what or "[" + ", ".join(i.expected for i in self.items) + "]"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or len(value) != len(self.items):
            raise self.fail(value, path)
        for i, (spec, v) in enumerate(zip(self.items, value, strict=True)):
            spec.check(v, item_path(path, i))


# A check across fields of one object: given the object and its path, raise Invalid (with a sub-path) or return.
CrossCheck = Callable[[Mapping[str, Any], str], None]


@dataclass(frozen=True)
class Obj(Spec):
    """An object (JSON object, TOML table) of known keys; unknown keys are refused unless ``open``."""

    fields: Mapping[str, Spec]
    required: tuple[str, ...] = ()
    open: bool = False  # keys beyond ``fields`` are kept unchecked (documents vLLM or a newer harness extends)
    what: str = "an object"
    checks: tuple[CrossCheck, ...] = field(default=(), compare=False)

    @property
    def expected(self) -> str:
        return self.what

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self.fail(value, path)
        for key in self.required:
            if key not in value:
                spec = self.fields[key]
                raise Invalid(key_path(path, key), spec.expected, "nothing",
                              f"missing (expected {spec.expected})")
        for key, v in value.items():
            known = self.fields.get(key)
            if known is None:
                if self.open:
                    continue
                raise Invalid(key_path(path, key), "a known key", repr(key),
                              f"unknown key; valid keys: {', '.join(self.fields)}")
            known.check(v, key_path(path, key))
        for cross in self.checks:
            cross(value, path)


@dataclass(frozen=True)
class MapOf(Spec):
    """An object whose keys are free (each matching ``key``) and whose values all match ``value``."""

    value: Spec
    key: Str = Str()
    what: str = ""

    @property
    def expected(self) -> str:
        return self.what or f"an object of {_plural(self.value.expected)}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self.fail(value, path)
        for k, v in value.items():
            try:
                self.key.check(k, path)
            except Invalid:
                raise Invalid(key_path(path, k), self.key.expected, repr(k),
                              f"key {k!r} is not {self.key.expected}") from None
            self.value.check(v, key_path(path, k))


_PLURALS = {"an integer": "integers", "a number": "numbers", "a string": "strings",
            "a non-empty string": "non-empty strings", "true or false": "booleans"}


def _plural(expected: str) -> str:
    # "an integer >= 0" -> "integers >= 0"; anything else reads "items, each <expected>".
    for one, many in _PLURALS.items():
        if expected == one or expected.startswith(one + " "):
            return many + expected[len(one):]
    return f"items, each {expected}"


def message(where: str, exc: Invalid) -> str:
    """The one line: ``bad.json: requests[0].prompt: expected a non-empty list of integers >= 0, found ...``."""
    return f"{where}: {exc.path or 'top level'}: {exc.text}"


def validate(spec: Spec, doc: Any, where: str, error: type[ReproError] = BadInput, at: str = "") -> Any:
    """``doc`` when it matches ``spec``; else ``error`` (a ReproError: one line, exit 2) naming ``where`` (the file),
    the JSON path (from ``at``, where ``doc`` sits in its file: ``cells[3]``), what was expected and what was found."""
    try:
        spec.check(doc, at)
    except Invalid as exc:
        raise error(message(where, exc)) from None
    return doc


def require(ok: bool, path: str, expected: str, value: Any) -> None:
    """For cross-field checks: Invalid at ``path`` unless ``ok``."""
    if not ok:
        raise Invalid(path, expected, found(value))


def choices(values: Sequence[str]) -> Choice:
    return Choice(tuple(values))
