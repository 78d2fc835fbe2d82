"""Every axis of a matrix cell, declared once.

A cell is one value per axis.  The table :data:`AXES` says, per axis, its values, its default, whether it
needs an engine process of its own, how it is spelled in a cell id, how a user writes it (``--cell
key=value``, TOML rules, command-line options) and where it sorts.  ``harness.core.cell`` derives the cell,
the engine key, ids and their parser from it; ``harness.core.pattern`` derives cell patterns.

Adding an axis is one entry here (with a default that spells as "" in ids, so existing ids stay valid)
plus the engine side that honours it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from harness.core import scenarios
from harness.core.errors import BadInput, bad_choice

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
ON_OFF = {"on": True, "off": False}
TRUE_FALSE = {"true": True, "false": False}
# Any of these words sets a flag in a cell pattern (``--cell async=on``, ``clear_cache=true``).
_FLAG_WORDS = {**ON_OFF, **TRUE_FALSE}


@dataclass(frozen=True)
class Axis:
    """One axis of a cell.

    ``name`` is its key in JSON and patterns, ``attr`` the cell attribute; ``engine`` axes need an engine
    process of their own (the others run as scenarios of one engine).  ``spell`` maps a value to its id
    segment ("" leaves it out of the id, as every default does); ``id_rank`` orders segments in an id,
    ``loop_rank`` the cells of a selection, ``sort_rank`` the rows of a report.
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
    selection_default: tuple[Any, ...] = ()
    plural: str = ""  # the field of a Selection holding this axis's chosen values
    option_all: bool = False  # the option's default is every value (else option_default or selection_default)
    option_default: tuple[Any, ...] = ()  # the option's default when it differs from selection_default
    platform_defaults: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # the option's default per platform, if any
    help: str = ""  # the option's help text
    pause_only: bool = False  # applies only to scenarios that pause (else left out of ids, at its default)

    def spell(self, value: Any) -> str:
        """The id segment of ``value`` ("" when it is left out)."""
        if self.kind == "version":
            return f"{self.prefix}{value}"
        if self.kind == "int":
            return "" if value == self.default else f"{self.prefix}{value}"
        return dict(self.spellings)[value]

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


AXES: tuple[Axis, ...] = (
    Axis("version", "version", "version", (), None, engine=True, id_rank=0, loop_rank=0, sort_rank=0,
         prefix="vllm"),
    Axis("executor", "executor", "choice", EXECUTORS, "mp", engine=True, id_rank=1, loop_rank=1, sort_rank=1,
         spellings=tuple((e, e) for e in EXECUTORS),
         option="executor", what="executor", option_all=True, plural="executors", selection_default=("mp",),
         help=f"executors: {','.join(EXECUTORS)} or all (default: all)"),
    Axis("async_scheduling", "async_on", "flag", (False, True), True, engine=True, id_rank=2, loop_rank=2,
         sort_rank=5, spellings=((True, "async_on"), (False, "async_off")), aliases=("async",),
         option="async", what="async setting", option_words=tuple(ON_OFF.items()), plural="asyncs",
         selection_default=(False, True), help="async scheduling: on, off or both (default)"),
    Axis("mode", "mode", "choice", MODES, "keep", engine=False, id_rank=3, loop_rank=9, sort_rank=6,
         spellings=tuple((m, m) for m in MODES),
         option="mode", what="mode", option_all=True, plural="modes", selection_default=MODES,
         help=f"pause modes: {','.join(MODES)} or all (default: all)", pause_only=True),
    Axis("clear_cache", "clear_cache", "flag", (True, False), True, engine=False, id_rank=4, loop_rank=10,
         sort_rank=7, spellings=((True, "clear"), (False, "noclear")),
         option="clear-cache", what="clear-cache value", option_words=tuple(TRUE_FALSE.items()),
         plural="clear_caches", selection_default=(True, False), help="clear_cache: true, false or both (default)",
         pause_only=True),
    Axis("tp", "tp", "int", (), 1, engine=True, id_rank=5, loop_rank=3, sort_rank=2, prefix="tp",
         option="tp", what="tensor-parallel size", plural="tps", selection_default=(1,),
         help="tensor-parallel sizes, e.g. 1,2 (default: 1 on cpu; 1,2 on cuda, where TP=2 cells are UNSUPPORTED "
              "unless 2 GPUs are visible)"),
    Axis("scenario", "scenario", "choice", SCENARIOS, "pause", engine=False, id_rank=9, loop_rank=8,
         sort_rank=9, spellings=tuple((s.name, s.segment) for s in scenarios.SCENARIO_TABLE),
         value_aliases=tuple((s.replace("-", "_"), s) for s in SCENARIOS if "-" in s),
         option="scenario", what="scenario", plural="scenarios", selection_default=("pause",),
         option_default=scenarios.DEFAULT_SCENARIOS,
         platform_defaults=tuple((p, scenarios.default_scenarios(p)) for p in PLATFORMS),
         help=f"scenarios: {','.join(SCENARIOS)} or all (default on cuda: "
              f"{','.join(scenarios.default_scenarios('cuda'))}, the scenarios sharing their config's engine; "
              "on cpu also "
              f"{','.join(s for s in scenarios.default_scenarios('cpu') if s not in scenarios.DEFAULT_SCENARIOS)}: "
              "every scenario vLLM's CPU platform runs)"),
    Axis("model_runner", "model_runner", "choice", MODEL_RUNNERS, "v1", engine=True, id_rank=6, loop_rank=4,
         sort_rank=3, spellings=(("v1", ""), ("v2", "mr_v2")),
         option="model-runner", what="model runner", plural="model_runners", selection_default=("v1",),
         help="vLLM GPU model runner (VLLM_USE_V2_MODEL_RUNNER, set explicitly per cell): v1, v2 or all "
              "(default: v1); v2 is UNSUPPORTED on cpu"),
    Axis("batch_invariant", "batch_invariant", "flag", (False, True), False, engine=True, id_rank=7,
         loop_rank=5, sort_rank=4, spellings=((True, "batch_invariant"), (False, "")),
         option="batch-invariant", what="batch-invariant setting", option_words=tuple(ON_OFF.items()),
         plural="batch_invariants", selection_default=(False,),
         help="VLLM_BATCH_INVARIANT: on, off or both (default: off); on is UNSUPPORTED on cpu"),
    Axis("tier", "tier", "choice", TIERS, "engine", engine=True, id_rank=8, loop_rank=6, sort_rank=8,
         spellings=(("engine", ""), ("scheduler", "sched")),
         option="tier", what="tier", plural="tiers", selection_default=("engine",),
         help="engine (a real AsyncLLM engine per config, default) or scheduler (vLLM's scheduler driven "
              "in-process with scripted model outputs)"),
)

BY_NAME: dict[str, Axis] = {a.name: a for a in AXES}
# Every key a pattern may use: names and aliases.
PATTERN_KEYS: dict[str, Axis] = {**BY_NAME, **{alias: a for a in AXES for alias in a.aliases}}
ENGINE_AXES = tuple(a for a in AXES if a.engine)
ID_ORDER = tuple(sorted(AXES, key=lambda a: a.id_rank))
LOOP_ORDER = tuple(sorted(AXES, key=lambda a: a.loop_rank))
SORT_ORDER = tuple(sorted(AXES, key=lambda a: a.sort_rank))


def axis(key: str) -> Axis:
    """The axis a pattern key names; BadInput listing every valid key otherwise."""
    try:
        return PATTERN_KEYS[key]
    except KeyError:
        raise bad_choice("cell key", key, tuple(PATTERN_KEYS)) from None
