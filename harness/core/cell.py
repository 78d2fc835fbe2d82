"""The cell, which is the axes table: one field per axis, and what derives from them (engine key, ids and their
parser, sort order, JSON).

Every axis is declared once, as a field of :class:`Cell` carrying its :class:`harness.core.axes.Axis`
(``field(default=..., metadata=axis(...))``).  Field order is the positional order, so
``Cell("0.21.0", "mp", True, "keep", True)`` names the first five.  ``EngineKey`` has the engine axes.  A cell id
is ``vllm<version>-`` followed by every axis's non-empty segment in id order, e.g.
``vllm0.21.0-mp-async_on-keep-clear-tp2-weight_sync``; defaults spell as nothing, so adding an axis leaves every
existing id unchanged.  Everything here reads the table of the cell's own class (``type(cell)``), so a subclass
that adds an axis gets ids, engine keys and parsers with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, make_dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from harness.core import scenarios
from harness.core.axes import (
    DEFAULT_REQUESTS,
    DOORS,
    EXECUTOR_RELEASES,
    EXECUTORS,
    MODEL_RUNNER_RELEASES,
    MODEL_RUNNERS,
    MODES,
    ON_OFF,
    PLATFORMS,
    REQUESTS,
    SCENARIOS,
    TIERS,
    TRUE_FALSE,
    Axis,
    AxisTable,
    axis,
    table_of,
)
from harness.core.errors import BadInput
from harness.core.profiles import DEFAULT_PROFILE
from harness.core.scenarios import pauses, profile_of
from harness.core.versions import version_key

C = TypeVar("C", bound="Cell")
K = TypeVar("K")  # a Cell or an engine key

_SCENARIO_HELP = (
    f"scenarios: {','.join(SCENARIOS)} or all (default on cuda: {','.join(scenarios.default_scenarios('cuda'))}, "
    "the scenarios sharing their config's engine; on cpu also "
    f"{','.join(s for s in scenarios.default_scenarios('cpu') if s not in scenarios.DEFAULT_SCENARIOS)}: "
    "every scenario vLLM's CPU platform runs)")


@dataclass(frozen=True, order=True)
class Cell:
    """One cell of the matrix: a value per axis.  Its fields are the axes table (harness.core.axes)."""

    version: str = field(metadata=axis(
        "version", engine=True, id_rank=0, loop_rank=0, sort_rank=0, prefix="vllm", sched_tier=True,
        added_in_schema=1))
    executor: str = field(default="mp", metadata=axis(
        "choice", EXECUTORS, engine=True, id_rank=1, loop_rank=1, sort_rank=1,
        spellings=tuple((e, e) for e in EXECUTORS), option="executor", what="executor", option_all=True,
        plural="executors", selection_default=("mp",), pytest_option="executors", added_in_schema=1,
        releases=EXECUTOR_RELEASES,
        help=f"executors: {','.join(EXECUTORS)} or all (default: all)"))
    async_on: bool = field(default=True, metadata=axis(
        "flag", (False, True), name="async_scheduling", engine=True, id_rank=2, loop_rank=2, sort_rank=5,
        spellings=((True, "async_on"), (False, "async_off")), aliases=("async",), option="async",
        what="async setting", option_words=tuple(ON_OFF.items()), plural="asyncs", selection_default=(False, True),
        sched_tier=True, added_in_schema=1, help="async scheduling: on, off or both (default)"))
    mode: str = field(default="keep", metadata=axis(
        "choice", MODES, engine=False, id_rank=3, loop_rank=9, sort_rank=6, spellings=tuple((m, m) for m in MODES),
        option="mode", what="mode", option_all=True, plural="modes", selection_default=MODES, pause_only=True,
        added_in_schema=1, help=f"pause modes: {','.join(MODES)} or all (default: all)"))
    clear_cache: bool = field(default=True, metadata=axis(
        "flag", (True, False), engine=False, id_rank=4, loop_rank=10, sort_rank=7,
        spellings=((True, "clear"), (False, "noclear")), option="clear-cache", what="clear-cache value",
        option_words=tuple(TRUE_FALSE.items()), plural="clear_caches", selection_default=(True, False),
        pause_only=True, added_in_schema=1, help="clear_cache: true, false or both (default)"))
    tp: int = field(default=1, metadata=axis(
        "int", engine=True, id_rank=5, loop_rank=3, sort_rank=2, prefix="tp", option="tp",
        what="tensor-parallel size", plural="tps", selection_default=(1,), platform_defaults=(("cuda", (1, 2)),),
        added_in_schema=1,
        help="tensor-parallel sizes, e.g. 1,2 (default: 1 on cpu; 1,2 on cuda, where TP=2 cells are UNSUPPORTED "
             "unless 2 GPUs are visible)"))
    scenario: str = field(default="pause", metadata=axis(
        "choice", SCENARIOS, engine=False, id_rank=9, loop_rank=8, sort_rank=9,
        spellings=tuple((s.name, s.segment) for s in scenarios.SCENARIO_TABLE),
        value_aliases=tuple((s.replace("-", "_"), s) for s in SCENARIOS if "-" in s), option="scenario",
        option_groups=tuple(scenarios.scenario_words().items()),
        what="scenario", plural="scenarios", selection_default=("pause",), pytest_option="scenarios",
        option_default=scenarios.DEFAULT_SCENARIOS,
        platform_defaults=tuple((p, scenarios.default_scenarios(p)) for p in ("cpu", "cuda")),
        added_in_schema=1, help=_SCENARIO_HELP))
    model_runner: str = field(default="v1", metadata=axis(
        "choice", MODEL_RUNNERS, engine=True, id_rank=6, loop_rank=4, sort_rank=3,
        spellings=(("v1", ""), ("v2", "mr_v2")), option="model-runner", what="model runner", plural="model_runners",
        selection_default=("v1",), added_in_schema=1, releases=MODEL_RUNNER_RELEASES,
        help="vLLM GPU model runner (VLLM_USE_V2_MODEL_RUNNER, set explicitly per cell): v1, v2 or all "
             "(default: v1, and v2 from vLLM 0.34.0, which removed v1); v2 is UNSUPPORTED on cpu"))
    batch_invariant: bool = field(default=False, metadata=axis(
        "flag", (False, True), engine=True, id_rank=7, loop_rank=5, sort_rank=4,
        spellings=((True, "batch_invariant"), (False, "")), option="batch-invariant",
        what="batch-invariant setting", option_words=tuple(ON_OFF.items()), plural="batch_invariants",
        selection_default=(False,), added_in_schema=1,
        help="VLLM_BATCH_INVARIANT: on, off or both (default: off); on is UNSUPPORTED on cpu"))
    tier: str = field(default="engine", metadata=axis(
        "choice", TIERS, engine=True, id_rank=8, loop_rank=6, sort_rank=8,
        spellings=(("engine", ""), ("scheduler", "sched")), option="tier", what="tier", plural="tiers",
        selection_default=("engine",), sched_tier=True, added_in_schema=2,
        help="engine (a real AsyncLLM engine per config, default) or scheduler (vLLM's scheduler driven "
             "in-process with scripted model outputs)"))
    # How the scenario reaches vLLM (issue 22): AsyncLLM in-process (engine, the default: ids unchanged) or a real
    # `vllm serve` on a loopback port driven over HTTP (server), the door most RL frameworks use; or that server with
    # the pauses made by a framework's own released client (client, issue 36: repro/client/).
    door: str = field(default="engine", metadata=axis(
        "choice", DOORS, engine=True, id_rank=10, loop_rank=7, sort_rank=10,
        spellings=(("engine", ""), ("server", "server"), ("client", "client")), option="door", what="door",
        plural="doors", selection_default=("engine",),
        help="engine (AsyncLLM in the engine process, default), server (vLLM's OpenAI server on 127.0.0.1, "
             "driven over its HTTP API), client (that server, paused and resumed by an RL framework's own released "
             "client: frameworks check --door client), or all"))
    # What the scenario's requests ask for (issue 34): greedy (the default: ids unchanged) or sampled GRPO groups
    # with seeds and logprobs (repro.scenarios.sampling), judged by harness.core.oracle.sampled.
    request: str = field(default="greedy", metadata=axis(
        "choice", REQUESTS, engine=False, id_rank=11, loop_rank=11, sort_rank=11,
        spellings=(("greedy", ""), *((k, k) for k in REQUESTS[1:])), option="request", what="request kind",
        plural="requests", selection_default=("greedy",),
        # The matrix's default on every platform (the pytest plugin reads no per-platform default: its items stay
        # greedy unless --vllm-request names more, so its suite's counted items do not change).
        platform_defaults=tuple((p, DEFAULT_REQUESTS) for p in PLATFORMS),
        help=f"request kinds: {','.join(REQUESTS)} or all (default: {','.join(DEFAULT_REQUESTS)} in a matrix, each "
             "only where a scenario sends it: sampled on the pause scenario's engine-tier cells; greedy as pytest "
             "items); sampled: temperature 1.0, a seed per request, n=4, logprobs=1; penalties: sampled with "
             "repetition, presence and frequency penalties (an engine with processed logprobs); structured: "
             "vLLM's structured outputs; bad_words: sampled with every step of the model's cycle a bad word "
             "(docs/requests.md)"))

    @classmethod
    def table(cls) -> AxisTable:
        """The axes this class declares (harness.core.axes.table_of)."""
        return table_of(cls)

    @property
    def engine(self) -> Any:
        """The engine config this cell runs on: its engine axes and its scenario's engine profile (cells that
        differ only in scenario axes share it when their scenarios share a profile)."""
        # The scheduler tier builds each scenario's scheduler itself (harness.sched.tier): no engine profile.
        request = getattr(self, "request", "greedy")
        profile = profile_of(self.scenario, request) if self.tier == "engine" else DEFAULT_PROFILE
        values = {a.attr: getattr(self, a.attr) for a in self.table().engine}
        return engine_key_type(type(self))(**values, profile=profile)

    @property
    def id(self) -> str:
        return "-".join(_segments(self, self.table().id_order))

    @property
    def config_id(self) -> str:
        """The id without the version: one row of a history heat-map or a comparison."""
        return "-".join(_segments(self, self.table().id_order[1:]))

    @property
    def scenario_id(self) -> str:
        """The scenario axes alone (``keep-clear``, ``weight_sync-keep-clear``): a scenario of its engine."""
        return "-".join(_segments(self, tuple(a for a in self.table().loop_order if not a.engine)))

    @property
    def variant(self) -> tuple[str, ...]:
        """Segments of the engine axes beyond version, executor and async (``("tp2", "mr_v2")``)."""
        return tuple(_segments(self, tuple(a for a in self.table().id_order if a.engine and a.id_rank > 2)))

    @property
    def sort_key(self) -> tuple[Any, ...]:
        """Report order: version, executor, TP, runner, batch-invariant, async, mode, clear_cache, ..."""
        return tuple(_value_rank(a, getattr(self, a.attr)) for a in self.table().sort_order)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form.  An axis added since the last results schema (``added_in_schema`` None) is written only
        off its default: files of this schema read back as they were written, in this vllm-repro and older."""
        return {a.name: v for a in self.table().axes
                if (v := getattr(self, a.attr)) != a.default or a.added_in_schema is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cell:
        return cell_from_dict(d, cls)

    def replace(self: C, **changes: Any) -> C:
        return replace(self, **changes)


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
    cell_type: ClassVar[type[Cell]]

    @property
    def id(self) -> str:
        """``vllm0.21.0-mp-async_on[-tp2][-mr_v2][-batch_invariant][-sched][-<profile>]``."""
        profile = getattr(self, "profile", DEFAULT_PROFILE)
        tail = [] if profile == DEFAULT_PROFILE else [profile.replace("-", "_")]
        return "-".join(_segments(self, tuple(a for a in self.cell_type.table().id_order if a.engine)) + tail)


_ENGINE_KEYS: dict[type, type] = {}
_ID_RES: dict[tuple[type, bool], re.Pattern[str]] = {}


def engine_key_type(cell_type: type[Cell]) -> type:
    """The engine-key class of ``cell_type``: its engine axes and the profile, frozen and ordered.

    The profile (engine arguments a scenario needs, harness.core.scenarios) comes last: not an axis of its own, it
    follows from the scenario, and EngineKey(version, executor, async) keeps meaning the default profile.
    """
    if cell_type in _ENGINE_KEYS:
        return _ENGINE_KEYS[cell_type]
    axes = cell_type.table().engine
    specs: list[tuple[str, type, Any]] = [
        (a.attr, object, field() if a.kind == "version" else field(default=a.default)) for a in axes]
    key = make_dataclass("EngineKey", [*specs, ("profile", str, field(default=DEFAULT_PROFILE))],
                         bases=(_EngineKeyMethods,), namespace={"cell_type": cell_type}, frozen=True, order=True)
    key.__doc__ = "Everything that needs a separate engine process: the engine axes of a cell and its profile."
    key.__module__ = __name__  # pickled by Ray tasks and pytest-xdist: findable as harness.core.cell.EngineKey
    return _ENGINE_KEYS.setdefault(cell_type, key)


if TYPE_CHECKING:
    class EngineKey(_EngineKeyMethods):
        """What a type checker sees: the engine axes are read off the cell's table when the class is built, so adding
        an axis needs no edit here (a typo in a cell's axis is still caught: ``Cell`` is the table itself)."""

        profile: str

        def __init__(self, *args: Any, **kwargs: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        def __lt__(self, other: EngineKey) -> bool: ...
else:
    EngineKey = engine_key_type(Cell)

TABLE = Cell.table()
AXES = TABLE.axes
BY_NAME = TABLE.by_name


def at_release(cell: K, explicit: frozenset[str] | set[str] = frozenset()) -> K:
    """``cell`` (a Cell or an engine key) as its release runs it: an axis left at its default whose value that
    release lacks (model runner v1 on 0.34.0+) takes the release's own value (harness.core.axes.Axis.release_value),
    so the id says what runs.  An axis in ``explicit`` (names the user gave) keeps its value: the planner then says
    UNSUPPORTED, and why."""
    table = cell.table() if isinstance(cell, Cell) else cast(Any, cell).cell_type.table()
    version = cast(Any, cell).version
    changes = {a.attr: a.release_value(version) for a in table.axes
               if a.releases and a.name not in explicit and getattr(cell, a.attr, None) == a.default}
    changes = {k: v for k, v in changes.items() if v != getattr(cell, k)}
    return cast(K, replace(cast(Any, cell), **changes)) if changes else cell


def required_keys(cell_type: type[Cell] = Cell) -> tuple[str, ...]:
    """Axes that are always in an id (their defaults spell as something): a cell dict must name them."""
    return tuple(a.name for a in cell_type.table().axes if a.kind == "version" or a.spell(a.default))


def cell_from_dict(d: dict[str, Any], cell_type: type[Cell] = Cell) -> Cell:
    """A Cell from its JSON form; axes added after a file was written take their defaults."""
    missing = [k for k in required_keys(cell_type) if k not in d]
    if missing:
        raise KeyError(", ".join(missing))
    values: dict[str, Any] = {}
    for a in cell_type.table().axes:
        if a.name in d:
            raw = d[a.name]
            values[a.attr] = str(raw) if a.kind in ("version", "choice") else (
                int(raw) if a.kind == "int" else bool(raw))
    return cell_type(**values)


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


def id_regex(cell_type: type[Cell] = Cell, engine: bool = False) -> re.Pattern[str]:
    """The regex of ``cell_type``'s cell ids (``engine``: of its engine-key ids, without the profile)."""
    if (cell_type, engine) not in _ID_RES:
        axes = tuple(a for a in cell_type.table().id_order if a.engine or not engine)
        _ID_RES[cell_type, engine] = re.compile(_id_regex(axes))
    return _ID_RES[cell_type, engine]


CELL_ID_RE = id_regex(Cell)
ENGINE_ID_RE = id_regex(Cell, engine=True)


def _pause_segments_agree(m: re.Match[str], t: AxisTable) -> bool:
    """A pausing scenario's id spells mode and clear_cache; a non-pausing one spells neither."""
    present = [m.group(a.attr) is not None for a in t.axes if a.pause_only]
    scenario = t.by_name["scenario"].read(m.group("scenario"))
    return all(present) if pauses(scenario) else not any(present)


def parse_cell_id(text: str, cell_type: type[Cell] = Cell) -> Cell:
    """The Cell a cell id names (``vllm0.21.0-mp-async_on-keep-clear-tp2``); BadInput if it names none."""
    t = cell_type.table()
    m = id_regex(cell_type).fullmatch(text.strip())
    if m is None or not _pause_segments_agree(m, t):
        raise BadInput(f"{text!r} is not a cell id (e.g. vllm0.21.0-mp-async_on-keep-clear)")
    return cell_type(**{a.attr: a.read(m.group(a.attr)) for a in t.axes})


def find_cell_id(text: str, cell_type: type[Cell] = Cell) -> Cell | None:
    """The Cell whose id ends ``text`` in brackets (a pytest node id ``test_x[<cell id>]``), or None."""
    m = re.search(r"\[([^\[\]]+)\]$", text)
    if m is None or (c := id_regex(cell_type).fullmatch(m.group(1))) is None \
            or not _pause_segments_agree(c, cell_type.table()):
        return None
    return parse_cell_id(m.group(1), cell_type)


def parse_config_id(text: str, cell_type: type[Cell] = Cell) -> Cell | None:
    """The Cell (version "") a config id names (``mp-async_on-keep-clear``), or None if it names none."""
    t = cell_type.table()
    m = id_regex(cell_type).fullmatch(f"vllm_-{text}")
    if m is None or not _pause_segments_agree(m, t):
        return None
    values: dict[str, Any] = {a.attr: ("" if a.kind == "version" else a.read(m.group(a.attr))) for a in t.axes}
    return cell_type(**values)
