"""The schemas of the files a user hands the verdict side: results (cells), history lines, ``run.json``, the
known-bug table and the workaround ledger, each checked by :mod:`harness.core.schema` where it is read.

Files the harness writes (results, history, ``run.json``) are *open*: a key this version does not know is left
alone (their ``schema_version`` already says what they hold); hand-written tables are closed, so a misspelt key
is named instead of silently ignored.
"""

from __future__ import annotations

from typing import cast

from harness.core.axes import DOORS, PLATFORMS, Axis
from harness.core.cell import AXES, Cell
from harness.core.oracle import Outcome
from harness.core.schema import (
    AnyOf,
    Bool,
    Choice,
    Int,
    ListOf,
    MapOf,
    Nullable,
    Num,
    Obj,
    Spec,
    Str,
)

OUTCOMES = Choice(tuple(o.value for o in Outcome))


def axis_spec(a: Axis) -> Spec:
    """One value of an axis, of the axis's own type (as ``Axis.coerce`` takes it)."""
    if a.kind == "flag":
        return Bool()
    if a.kind == "int":
        return Int(lo=1)
    if a.kind == "choice":
        return Choice(tuple(a.values))
    return Str(nonempty=True)


def _one_or_more(spec: Spec) -> Spec:
    return AnyOf((spec, ListOf(spec, min_len=1)), what=f"{spec.expected}, or a non-empty list of them")


# A cell as results files hold it: the axes (any newer axis is left to the reader's defaults).
CELL = Obj({a.name: axis_spec(a) for a in AXES}, required=("version",), open=True, what="a cell object")
_OPEN = Obj({}, open=True)
ATTEMPT = Obj({"n": Int(lo=1), "outcome": Str(nonempty=True)}, required=("n", "outcome"), open=True,
              what="an attempt object {n, outcome, ...}")
REPEATS = Obj({"n": Int(lo=1), "outcomes": MapOf(Int(lo=0)), "runs": ListOf(Str())}, required=("n",), open=True,
              what="a repeat summary {n, outcomes, ...}")
# A cell result of the current schema version (older ones are migrated first).
CELL_RESULT = Obj({
    "id": Str(nonempty=True), "cell": CELL, "outcome": OUTCOMES, "label": Str(), "summary": Str(),
    "reason": Nullable(Str()), "counts": Nullable(MapOf(Int(lo=0))),
    "requests": Nullable(ListOf(_OPEN, what="a list of request objects")), "engine": Nullable(_OPEN),
    "duration_s": Nullable(Num(lo=0)), "expectation": Nullable(_OPEN), "repeats": Nullable(REPEATS),
    "attempts": Nullable(ListOf(ATTEMPT, what="a list of attempts")),
}, required=("cell", "outcome", "summary"), open=True, what="a cell result object {cell, outcome, summary, ...}")

# One line of a history file (harness.verdicts.history): a run and its cells, flat.
_HISTORY_KEYS = {"async": Bool(), **{a.name: axis_spec(a) for a in AXES if a.name != "async_scheduling"}}
HISTORY_CELL = Obj({"id": Str(nonempty=True), **_HISTORY_KEYS, "outcome": Str(nonempty=True),
                    "summary": Nullable(Str()), "label": Nullable(Str()), "reason": Nullable(Str())},
                   required=("id", "version", "executor", "async", "mode", "clear_cache", "outcome"), open=True,
                   what="a history cell object {id, version, executor, async, mode, clear_cache, outcome, ...}")
HISTORY_RUN = Obj({"run_id": Str(nonempty=True), "added": Str(nonempty=True), "source": Nullable(Str()),
                   "meta": Nullable(Obj({}, open=True, what="an object")), "cells": ListOf(HISTORY_CELL),
                   "cells_digest": Nullable(Str())},
                  required=("run_id", "added", "cells"), open=True, what="a history run object")

# run.json of a matrix run (harness.run.resume.run_record): what a resumed run must match.
RUN_RECORD = Obj({"platform": Str(nonempty=True), "cells": ListOf(Str(nonempty=True), what="a list of cell ids"),
                  "settings": Obj({}, open=True, what="an object of run settings"), "tool_version": Str()},
                 required=("platform", "cells", "settings"), open=True, what="a run record object")

# The known-bug table (harness/verdicts/known_bugs.toml, or --known-bugs FILE).
def known_bugs_schema(cell_type: type[Cell] = Cell) -> Obj:
    """The known-bug table whose rules name the axes of ``cell_type``'s table."""
    by_name = cell_type.table().by_name
    rule_axes = {name: _one_or_more(axis_spec(a)) for name, a in by_name.items()}
    # message: the words a CRASH of the rule must carry; sometimes: the rule holds only in runs that crashed with them
    # (timing), its cells are otherwise judged as if it were not there (harness.verdicts.known_bugs.known_crash).
    rule = Obj({**rule_axes, "executors": _one_or_more(axis_spec(by_name["executor"])), "expect": OUTCOMES,
                "k": Int(lo=1), "message": Str(nonempty=True), "sometimes": Bool()}, required=("expect",),
               what="a [[bug.cells]] table of cell keys, expect, k, message and sometimes")
    bug = Obj({"id": Str(nonempty=True), "title": Str(), "fix": Str(), "fixed_in": Str(),
               "affected": Str(nonempty=True, what="a PEP 440 version specifier, e.g. \">=0.17.0, <0.22.0\""),
               "platforms": ListOf(Choice(PLATFORMS), min_len=1, what="a non-empty list of platforms"),
               "note": Str(), "cells": ListOf(rule, what="a list of [[bug.cells]] tables")},
              required=("id", "affected"), what="a [[bug]] table {id, affected, cells, ...}")
    return Obj({"bug": ListOf(bug, what="a list of [[bug]] tables")}, what="a known-bug table of [[bug]] entries")


KNOWN_BUGS = known_bugs_schema()
KNOWN_BUG = cast(Obj, cast(ListOf, KNOWN_BUGS.fields["bug"]).item)

# The workaround ledger (harness/verdicts/workarounds.toml, or --ledger FILE).
_CELL_SETTINGS = Obj({a.name: axis_spec(a) for a in AXES}, what="a table of cell settings (one value per key)")
WORKAROUND = Obj({"id": Str(nonempty=True), "issue": Str(nonempty=True), "title": Str(), "location": Str(),
                  "setting": Str(), "fix": Str(), "fixed_in": Str(), "cell": _CELL_SETTINGS,
                  "applied": _CELL_SETTINGS},
                 required=("id", "issue", "cell", "applied"), what="a [[workaround]] table")
LEDGER = Obj({"workaround": ListOf(WORKAROUND, min_len=1, what="a non-empty list of [[workaround]] tables")},
             required=("workaround",), what="a workaround ledger of [[workaround]] entries")

# The RL framework recipes (harness/verdicts/frameworks.toml, or --recipes FILE).  A recipe cell names scenario
# axes (and engine axes other than the version and the door: the framework's own door is the cell's).
_RECIPE_CELL_AXES = {a.name: axis_spec(a) for a in AXES if a.name not in ("version", "door")}
RECIPE_CELL = Obj({**_RECIPE_CELL_AXES, "match": Choice(("same", "nearest")), "why": Str(nonempty=True)},
                  required=("scenario", "match", "why"),
                  what="a [[framework.cell]] table {scenario, mode, clear_cache, ..., match, why}")
# ``quote``: the cited line's text at the commit (``frameworks drift`` finds it in a newer release).
RECIPE_CALL = Obj({"call": Str(nonempty=True), "at": Str(nonempty=True), "quote": Str()}, required=("call", "at"),
                  what="a [[framework.call]] table {call, at, quote}")
# A bisect of the framework's sequence that was run (``frameworks bisect``), with its committed probe log.
RECIPE_BISECT = Obj({"find": Choice(("fix", "regression")),
                     "range": Str(pattern=r"[^.\s]\S*\.\.\S+", what="OLD..NEW"),
                     "platform": Choice(("cpu", "cuda")), "last_old": Str(), "first_new": Str(), "refused": Str(),
                     "evidence": Str(nonempty=True, what="the committed frameworks-bisect.json(.xz), repo-relative")},
                    required=("find", "range", "platform", "evidence"),
                    what="a [[framework.bisect]] table {find, range, platform, the answer or refused, evidence}")
# What the framework's rollout requests ask vLLM for (issue 34, docs/requests.md), one cited row per parameter;
# ``source`` names where the line was read when it is not the recipe's own release or commit ("verl==0.9.1").
SAMPLING_PARAMS = ("temperature", "n", "seed", "logprobs", "logprobs_mode", "penalties", "structured")
RECIPE_SAMPLING = Obj({"param": Choice(SAMPLING_PARAMS), "value": Str(nonempty=True), "at": Str(nonempty=True),
                       "quote": Str(), "source": Str()}, required=("param", "value", "at"),
                      what="a [[framework.sampling]] table {param, value, at, quote, source}")
_ENGINE_KWARG = AnyOf((Str(), Bool(), Int(), Num()), what="a string, boolean or number")
RECIPE = Obj({
    "name": Str(nonempty=True, pattern=r"[a-z0-9][a-z0-9-]*", what="a lower-case name (letters, digits, -)"),
    "title": Str(nonempty=True), "repo": Str(nonempty=True, pattern=r"[\w.-]+/[\w.-]+", what="owner/name"),
    "commit": Str(pattern=r"[0-9a-f]{40}", what="a 40-hex commit"),
    "pin": Str(nonempty=True, what="a PEP 440 version specifier, e.g. \">=0.17.0,<=0.25.1\""),
    "pin_at": Str(nonempty=True), "door": Choice(tuple(DOORS)), "door_detail": Str(), "workaround": Str(),
    "note": Str(), "engine_kwargs": MapOf(_ENGINE_KWARG), "package": Str(), "no_release": Str(),
    "release": Str(),
    "call": ListOf(RECIPE_CALL, min_len=1, what="a non-empty list of [[framework.call]] tables"),
    "cell": ListOf(RECIPE_CELL, min_len=1, what="a non-empty list of [[framework.cell]] tables"),
    "bisect": ListOf(RECIPE_BISECT, what="a list of [[framework.bisect]] tables"),
    # Issue 37: the stale-kv scenario the framework's update sequence maps to (its pause, its reset, or none), or
    # why no stale-kv cell applies (e.g. the framework turns prefix caching off).
    "stale_kv": ListOf(RECIPE_CELL, what="a list of [[framework.stale_kv]] tables"),
    "stale_kv_none": Str(),
    "sampling": ListOf(RECIPE_SAMPLING, what="a list of [[framework.sampling]] tables"),
    # Issue 34: its pause played with the request kind nearest its rollout requests (a cell naming ``request``).
    "request_cell": ListOf(RECIPE_CELL, what="a list of [[framework.request_cell]] tables"),
}, required=("name", "title", "repo", "commit", "pin", "door", "call", "cell"), what="a [[framework]] table")
RECIPES = Obj({"framework": ListOf(RECIPE, min_len=1, what="a non-empty list of [[framework]] tables")},
              required=("framework",), what="a recipe file of [[framework]] entries")
