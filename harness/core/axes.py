"""What an axis of a matrix cell is, and the table of axes a cell class declares.

The axes are declared once, as the fields of :class:`harness.core.cell.Cell`: each field carries an
:class:`Axis` (``field(default=..., metadata=axis(...))``) saying its values, whether it needs an engine process
of its own, how it is spelled in a cell id, how a user writes it (``--cell key=value``, TOML rules,
command-line and pytest options), where it sorts and since which results schema it exists.  :func:`table_of`
reads that declaration back as an :class:`AxisTable`; every consumer (ids, patterns, engine keys, workaround
pairing, the scheduler-tier check, the wire spec, options, run-id hashing) derives from it, taking the table of
the cell class it is given, so a test can add an axis to a subclass of ``Cell`` and check them all.

Adding an axis is one field of ``Cell`` (with a default that spells as "" in ids, so existing ids stay valid)
plus the engine side that honours it (``repro.settings.engine_axes``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, replace
from functools import cached_property
from typing import Any

from harness.core import scenarios
from harness.core.errors import BadInput, bad_choice
from harness.core.versions import release_key

PLATFORMS = ("cpu", "cuda")
EXECUTORS = ("mp", "uni", "ray-v1", "ray-v2")
# Scenarios (and the pause modes each plays, its engine profile, its tiers) live in their own table.
MODES = scenarios.MODES
SCENARIOS = scenarios.SCENARIOS
SCENARIO_MODES = scenarios.SCENARIO_MODES
# vLLM's GPU model runner: "v1" (vllm.v1.worker.gpu_model_runner) or "v2" (vllm.v1.worker.gpu.model_runner),
# chosen with VLLM_USE_V2_MODEL_RUNNER.  The scheduler-side bug (#42043) should not care, but 0.22+ picks v2
# on its own for some models and 0.32 by default, so the GPU tier can check both.
MODEL_RUNNERS = ("v1", "v2")
# "engine": a real AsyncLLM engine process runs the scenario.  "scheduler": vLLM's scheduler driven
# in-process with scripted model outputs (the scheduler tier); no engine, no model forward.
TIERS = scenarios.TIERS
DOORS = ("engine", "server", "client")
# What each request of a scenario asks vLLM for (issue 34; docs/requests.md): "greedy" (temperature 0, n=1: every
# cell before the axis), "sampled" (temperature 1.0, a per-request seed, n=4 children, logprobs=1, as an RL
# rollout's GRPO group asks), "penalties" (sampled with repetition/presence/frequency penalties, judged by processed
# logprobs: an engine of its own, harness.core.profiles.REQUEST_PROFILES), "structured" (vLLM's structured
# outputs) or "bad_words" (sampled, every step of the model's cycle a bad word).  A scenario axis: sampled cells
# run on the engines the greedy ones start.
REQUESTS = ("greedy", "sampled", "penalties", "structured", "bad_words")
# What a matrix sends when --request is not given (issue 34: the default run judges sampled groups too), each kind
# only on the cells whose scenario realises it (harness.core.scenarios.Scenario.requests).
DEFAULT_REQUESTS = ("greedy", "sampled")
ON_OFF = {"on": True, "off": False}
TRUE_FALSE = {"true": True, "false": False}
# Any of these words sets a flag in a cell pattern (``--cell async=on``, ``clear_cache=true``).
_FLAG_WORDS = {**ON_OFF, **TRUE_FALSE}


@dataclass(frozen=True)
class ValueRelease:
    """Which vLLM releases have one value of an axis: from ``since`` on, and before ``removed_in``.

    The planner never runs a cell on a release without its value: a value the user named is UNSUPPORTED there
    with ``why``; a value left at the axis's default becomes the release's own (:meth:`Axis.release_value`).
    """

    value: Any
    since: str | None = None  # the first release with the value (None: every release the harness runs)
    removed_in: str | None = None  # the first release without it (None: still there)
    why: str = ""  # the change, checked in vLLM's source


# vLLM 0.34.0 removed model runner V1: Platform.validate_environ (vllm/platforms/interface.py) raises ValueError
# for VLLM_USE_V2_MODEL_RUNNER set to anything but 1, and vllm/v1/worker/gpu_model_runner.py is gone (0.33.0 has
# both; read in the two wheels).
MODEL_RUNNER_RELEASES = (ValueRelease("v1", removed_in="0.34.0", why="vLLM 0.34.0 removed model runner V1; "
                                      "VLLM_USE_V2_MODEL_RUNNER other than 1 raises in Platform.validate_environ"),)
# vLLM 0.33.0 removed the Ray v1 executor: vllm/v1/executor/ray_executor.py is in 0.32.0 and gone in 0.33.0, where
# distributed_executor_backend="ray" always builds RayExecutorV2 (v1/executor/abstract.py, Executor.get_class) and
# VLLM_USE_RAY_V2_EXECUTOR_BACKEND is no longer one of vllm/envs.py's variables (read in the three wheels).
EXECUTOR_RELEASES = (ValueRelease("ray-v1", removed_in="0.33.0", why="vLLM 0.33.0 removed RayDistributedExecutor; "
                                  "distributed_executor_backend='ray' builds RayExecutorV2"),)


@dataclass(frozen=True)
class Axis:
    """One axis of a cell.

    ``name`` is its key in JSON and patterns, ``attr`` the cell attribute (the field's name); ``engine`` axes
    need an engine process of their own (the others run as scenarios of one engine).  ``spell`` maps a value to
    its id segment ("" leaves it out of the id, as every default does); ``id_rank`` orders segments in an id,
    ``loop_rank`` the cells of a selection, ``sort_rank`` the rows of a report.  ``attr`` and ``default`` come
    from the field that declares the axis (:func:`table_of`).
    """

    name: str
    attr: str
    kind: str  # "version", "choice", "flag", "int"
    values: tuple[Any, ...]  # valid values in canonical order; () for open-ended (version, int)
    default: Any
    engine: bool
    id_rank: int
    loop_rank: int
    sort_rank: int
    spellings: tuple[tuple[Any, str], ...] = ()  # choice/flag: value -> id segment
    prefix: str = ""  # version/int: the segment is prefix + value
    aliases: tuple[str, ...] = ()  # other pattern keys for this axis
    value_aliases: tuple[tuple[str, Any], ...] = ()  # other words for a value in patterns
    option: str = ""  # the command-line option selecting values ("" = none)
    what: str = ""  # the noun in messages about the option
    option_words: tuple[tuple[str, bool], ...] = ()  # flag options: word -> value
    # choice options: other words the option takes, each for one value or several (``--scenario stale_kv``)
    option_groups: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    selection_default: tuple[Any, ...] = ()
    plural: str = ""  # the field of a Selection holding this axis's chosen values
    option_all: bool = False  # the option's default is every value (else option_default or selection_default)
    option_default: tuple[Any, ...] = ()  # the option's default when it differs from selection_default
    platform_defaults: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # the option's default per platform, if any
    help: str = ""  # the option's help text
    pause_only: bool = False  # applies only to scenarios that pause (else left out of ids, at its default)
    # The scheduler tier (harness.sched.tier: vLLM's scheduler in-process, no executor or model) honours this
    # engine axis; any other engine axis labels a scheduler-tier cell only at its default.
    sched_tier: bool = False
    # The results schema (harness.core.records) that first carried this axis; None: added since the last one.
    # Run ids hash a cell without the axes added after schema 1 while they are at their default, so every
    # committed report keeps its run id when an axis is added.
    added_in_schema: int | None = None
    pytest_option: str = ""  # the pytest plugin's option ("" = --vllm-<option>)
    releases: tuple[ValueRelease, ...] = ()  # values that only some vLLM releases have

    def not_in_release(self, value: Any, version: str) -> str | None:
        """Why vLLM ``version`` has no ``value`` of this axis, or None (it has, or the label is no release: a
        per-commit label is placed only by the version its engine reports, after the fact)."""
        key = release_key(version)
        if key[0] != 0:
            return None
        for r in self.releases:
            if r.value != value:
                continue
            why = f" ({r.why})" if r.why else ""
            if r.removed_in and key >= release_key(r.removed_in):
                return f"{self.what} {value} was removed in vLLM {r.removed_in}{why}"
            if r.since and key < release_key(r.since):
                return f"{self.what} {value} first exists in vLLM {r.since}{why}"
        return None

    def release_value(self, version: str) -> Any:
        """The value a cell left at this axis's default runs on ``version``: the default where that release has
        it, else the first value it has (model runner v2 on 0.34.0+, where V1 is gone)."""
        if self.not_in_release(self.default, version) is None:
            return self.default
        return next((v for v in self.values if self.not_in_release(v, version) is None), self.default)

    @property
    def pytest_flag(self) -> str:
        """The pytest plugin's option for this axis, without dashes (``executors``, ``vllm-async``)."""
        return self.pytest_option or f"vllm-{self.option}"

    @property
    def pytest_dest(self) -> str:
        return f"repro_{self.plural}"

    @property
    def pytest_env(self) -> str:
        """The variable giving the pytest option's default (``--executors``: VLLM_REPRO_EXECUTORS)."""
        return "VLLM_REPRO_" + self.pytest_flag.removeprefix("vllm-").upper().replace("-", "_")

    @property
    def in_schema_1(self) -> bool:
        return self.added_in_schema == 1

    def spell(self, value: Any) -> str:
        """The id segment of ``value`` ("" when it is left out)."""
        if self.kind == "version":
            return f"{self.prefix}{value}"
        if self.kind == "int":
            return "" if value == self.default else f"{self.prefix}{value}"
        return str(dict(self.spellings)[value])

    def segment_re(self) -> str:
        """A regex matching any non-empty spelling of this axis (used to parse ids)."""
        if self.kind == "version":
            return re.escape(self.prefix) + r"[^-\]\s]+"
        if self.kind == "int":
            return re.escape(self.prefix) + r"\d+"
        words = sorted((s for _, s in self.spellings if s), key=len, reverse=True)
        return "|".join(re.escape(w) for w in words)

    def read(self, segment: str | None) -> Any:
        """The value an id segment spells (None: the segment was absent)."""
        if segment is None:
            return self.default
        if self.kind in ("version", "int"):
            text = segment[len(self.prefix):]
            return text if self.kind == "version" else int(text)
        return {s: v for v, s in self.spellings if s}[segment]

    def parse(self, text: str) -> Any:
        """A value as a user writes it in a pattern (``tp=2``, ``async=on``, ``scenario=weight_sync``)."""
        text = text.strip()
        if self.kind == "version":
            if not text:
                raise BadInput("empty version in a cell pattern")
            return text
        if self.kind == "int":
            if not text.isdigit() or int(text) < 1:
                raise BadInput(f"invalid {self.name} {text!r}; use a positive integer")
            return int(text)
        words = self.words()
        if text not in words:
            raise bad_choice(self.name, text, tuple(words))
        return words[text]

    def words(self) -> dict[str, Any]:
        """Every word a pattern may use for a value of this choice or flag axis."""
        if self.kind == "flag":
            return dict(_FLAG_WORDS)
        return {**{str(v): v for v in self.values}, **dict(self.value_aliases)}

    def coerce(self, raw: Any, where: str) -> Any:
        """A value from a TOML rule or a JSON document, of the axis's own type (true, 2, "mp")."""
        want = {"flag": bool, "int": int}.get(self.kind, str)
        if not isinstance(raw, want) or (want is int and isinstance(raw, bool)):
            raise BadInput(f"{where}: {self.name} = {raw!r} should be a {want.__name__}")
        if self.kind in ("flag", "version"):
            return raw
        if self.kind == "int":
            return self.parse(str(raw))
        if raw not in self.values:
            raise bad_choice(self.name, raw, tuple(str(v) for v in self.values))
        return raw


def axis(kind: str, values: tuple[Any, ...] = (), **settings: Any) -> Mapping[str, Axis]:
    """The metadata of a ``Cell`` field that declares an axis: ``field(default=..., metadata=axis(...))``.

    ``settings`` are :class:`Axis` fields (``engine``, ``id_rank``, ``loop_rank`` and ``sort_rank`` are
    required; ``name`` defaults to the field's name).  The field's name and default complete it (table_of).
    """
    name = settings.pop("name", "")
    return {"axis": Axis(name, "", kind, values, None, **settings)}


@dataclass(frozen=True)
class AxisTable:
    """The axes a cell class declares, in declaration order, and the orders and lookups derived from them."""

    axes: tuple[Axis, ...]

    @cached_property
    def by_name(self) -> dict[str, Axis]:
        return {a.name: a for a in self.axes}

    @cached_property
    def pattern_keys(self) -> dict[str, Axis]:
        """Every key a pattern may use: names and aliases."""
        return {**self.by_name, **{alias: a for a in self.axes for alias in a.aliases}}

    @cached_property
    def engine(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.engine)

    @cached_property
    def id_order(self) -> tuple[Axis, ...]:
        return tuple(sorted(self.axes, key=lambda a: a.id_rank))

    @cached_property
    def loop_order(self) -> tuple[Axis, ...]:
        return tuple(sorted(self.axes, key=lambda a: a.loop_rank))

    @cached_property
    def sort_order(self) -> tuple[Axis, ...]:
        return tuple(sorted(self.axes, key=lambda a: a.sort_rank))

    @cached_property
    def after_v1(self) -> tuple[str, ...]:
        """Names of the axes added after results schema 1 (left out of old forms while at their default)."""
        return tuple(a.name for a in self.axes if not a.in_schema_1)

    def lookup(self, key: str) -> Axis:
        """The axis a pattern key names; BadInput listing every valid key otherwise."""
        keys = self.pattern_keys
        if key not in keys:
            raise bad_choice("cell key", key, tuple(keys))
        return keys[key]


_TABLES: dict[type, AxisTable] = {}


def table_of(cell_type: type) -> AxisTable:
    """The axes the dataclass ``cell_type`` declares (its fields with ``axis`` metadata), completed with each
    field's name and default."""
    if cell_type in _TABLES:
        return _TABLES[cell_type]
    out = []
    for f in fields(cell_type):
        spec = f.metadata.get("axis")
        if isinstance(spec, Axis):
            default = None if f.default is MISSING else f.default
            out.append(replace(spec, name=spec.name or f.name, attr=f.name, default=default))
    return _TABLES.setdefault(cell_type, AxisTable(tuple(out)))
