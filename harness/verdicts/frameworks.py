"""RL framework recipes (issue 22): how each framework drives vLLM, read from its source, compiled to cells.

A recipe (``frameworks.toml``) is a framework's source (repo, commit, file:line of every call), its door, the
vLLM range it pins, the engine arguments it passes, its workaround (a ledger id of ``workarounds.toml``) and the
harness cells that play its call sequence: a scenario with its pause axes, on the framework's door.  They compile
to ordinary :class:`harness.core.cell.Cell` values, so the runner, bisect, ``workarounds check``, pytest and
history take them unchanged; nothing here runs anything or holds a result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.cell import Cell
from harness.core.errors import BadInput, bad_choice
from harness.core.pattern import pattern_from_mapping
from harness.core.scenarios import BY_SCENARIO
from harness.core.schema import validate
from harness.core.versions import version_key
from harness.verdicts.file_schemas import RECIPES
from harness.verdicts.tomlfile import load_table
from harness.verdicts.workarounds import Workaround, load_ledger

# What a compiled cell is for: the framework's own sequence on its own door; the same cell through the engine
# door when the framework's door is the server (the engine door runs where the server door cannot yet, and the
# two agreeing is the server door's check); the ledger's pair for the framework's workaround.
# STALE_KV: the stale-kv scenario (issue 37) nearest the framework's update sequence, through the engine door (the
# stale-kv scenarios are not wired to the server door) on the context-cell model its engine profile brings.
# REQUESTS (issue 34): a recipe cell that names the request kind nearest the framework's own rollout requests
# ([[framework.sampling]]: sampled, logprobs read back), on the framework's door; judged beside the sequence, not
# part of its safety (the bisect windows and the client door were measured with greedy requests).
SEQUENCE, STAND_IN, WORKAROUND, STALE_KV, REQUESTS = "sequence", "stand-in", "workaround", "stale-kv", "requests"
ROLES = (SEQUENCE, STAND_IN, WORKAROUND, STALE_KV, REQUESTS)
_CELL_META = ("match", "why")


@dataclass(frozen=True)
class RecipeCall:
    """One vLLM call the framework makes, and where (a path:line of the framework's repo at its commit)."""

    call: str
    at: str
    quote: str = ""  # the cited line's text (``frameworks drift`` looks for it in a newer release)


@dataclass(frozen=True)
class RecipeSampling:
    """One sampling parameter the framework's rollout requests send (issue 34), and where it was read."""

    param: str  # harness.verdicts.file_schemas.SAMPLING_PARAMS
    value: str
    at: str
    quote: str = ""
    source: str = ""  # where ``at`` was read when not the recipe's own release or commit ("verl==0.9.1")


@dataclass(frozen=True)
class RecipeCell:
    """A cell of the recipe without version and door: axis values, and how close it is to the framework's calls."""

    values: tuple[tuple[str, Any], ...]  # axis name -> value (scenario, mode, clear_cache, async_scheduling, ...)
    match: str  # "same" or "nearest"
    why: str

    def at(self, version: str, door: str) -> Cell:
        template = pattern_from_mapping(dict(self.values), "recipe cell").template()
        return template.at(version).replace(door=door)


@dataclass(frozen=True)
class RecipeBisect:
    """A ``frameworks bisect`` of the framework's sequence that was run: its answer, or why the range was refused,
    and the probe log that shows it (a repo-relative path; tests check the two agree)."""

    find: str
    range: str  # OLD..NEW as given to --versions
    platform: str
    last_old: str
    first_new: str
    refused: str  # why the range had no boundary (then last_old and first_new are empty)
    evidence: str

    @property
    def text(self) -> str:
        """``first safe release 0.22.0 (last unsafe 0.21.0), bisected over 0.17.0..0.25.1 on cpu``."""
        where = f"bisected over {self.range} on {self.platform}"
        if self.refused:
            return f"no boundary: {self.refused} ({where})"
        new, old = ("safe", "unsafe") if self.find == "fix" else ("unsafe", "safe")
        return f"first {new} release {self.first_new} (last {old} {self.last_old}), {where}"


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    repo: str
    commit: str
    pin: str  # PEP 440 specifier of the vLLM releases the framework allows
    pin_at: str
    door: str
    door_detail: str
    workaround: Workaround | None
    note: str
    engine_kwargs: tuple[tuple[str, Any], ...]
    calls: tuple[RecipeCall, ...]
    cells: tuple[RecipeCell, ...]
    bisects: tuple[RecipeBisect, ...] = ()
    package: str = ""  # its distribution on the package index ("" when it has no usable release there)
    no_release: str = ""  # why there is no package to read
    release: str = ""  # the package release the citations were re-read at (``frameworks drift``); "" = commit
    stale_kv: tuple[RecipeCell, ...] = ()  # its update sequence as a stale-kv scenario (issue 37)
    stale_kv_none: str = ""  # why no stale-kv cell applies to it
    sampling: tuple[RecipeSampling, ...] = ()  # what its rollout requests send (issue 34)
    request_cells: tuple[RecipeCell, ...] = ()  # its pause with the request kind nearest its own (issue 34)
    own_door: str = ""  # the door its recipe names, where a run moved it to another (--door client); "": ``door``

    @property
    def engine_cells(self) -> str:
        """What its cells on the engine door are, in a report's words: the recipe itself where its own door is the
        engine (OpenRLHF: its own code runs on that door), else the engine-door stand-in of its sequence."""
        return "recipe on the engine door" if (self.own_door or self.door) == "engine" else "engine-door stand-in"

    def source(self, at: str, where: str = "") -> str:
        """``owner/name@abc1234:path:line``, or ``package==1.0:path:line`` when re-read at a release; ``where``: a
        source of its own (a row read elsewhere), ``where:path:line``."""
        if where:
            return f"{where}:{at}"
        if self.release:
            return f"{self.package}=={self.release}:{at}"
        return f"{self.repo}@{self.commit[:7]}:{at}"

    @property
    def floor(self) -> str | None:
        """The lowest release the pin allows (``==0.26.0`` and ``>=0.26.0``: 0.26.0), or None if it has none."""
        from packaging.specifiers import SpecifierSet

        lows = [s.version for s in SpecifierSet(self.pin) if s.operator in ("==", ">=", "~=", "===", ">")]
        return min(lows, key=version_key) if lows else None

    def allows(self, version: str) -> bool:
        """Whether the pin allows ``version``."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        try:
            return Version(version) in SpecifierSet(self.pin)
        except InvalidVersion:
            return False


@dataclass(frozen=True)
class CompiledCell:
    """One cell a recipe runs: its framework, its role (:data:`ROLES`), how close it is, and why."""

    framework: str
    role: str
    cell: Cell
    match: str
    why: str


def _recipe_cell(raw: Mapping[str, Any], where: str) -> RecipeCell:
    values = {k: v for k, v in raw.items() if k not in _CELL_META}
    pattern = pattern_from_mapping(values, where)  # names an unknown key or a bad value
    shape = BY_SCENARIO[values["scenario"]]
    cell = pattern.template().at("0")
    if not shape.admits(cell.mode, cell.clear_cache):
        raise BadInput(f"{where}: the {shape.name} scenario has no cell mode={cell.mode} "
                       f"clear_cache={str(cell.clear_cache).lower()} (modes: {', '.join(shape.modes) or 'none'})")
    return RecipeCell(tuple(values.items()), raw["match"], raw["why"])


def _request_cell(raw: Mapping[str, Any], where: str) -> RecipeCell:
    """A [[framework.request_cell]]: a recipe cell that names a request kind other than greedy."""
    rc = _recipe_cell(raw, where)
    if dict(rc.values).get("request", "greedy") == "greedy":
        raise BadInput(f"{where}: a request cell names the request kind nearest the framework's (e.g. request = "
                       "\"sampled\"); greedy cells are [[framework.cell]] tables")
    return rc


def _recipe_bisect(raw: Mapping[str, Any], where: str) -> RecipeBisect:
    b = RecipeBisect(raw["find"], raw["range"], raw["platform"], raw.get("last_old", ""), raw.get("first_new", ""),
                     raw.get("refused", ""), raw["evidence"])
    if bool(b.refused) == bool(b.last_old and b.first_new) or bool(b.last_old) != bool(b.first_new):
        raise BadInput(f"{where}: give either last_old and first_new (the answer) or refused (why there was none)")
    return b


def _check_pin(pin: str, where: str) -> None:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        SpecifierSet(pin)
    except InvalidSpecifier:
        raise BadInput(f"{where}: pin {pin!r} is not a PEP 440 specifier (e.g. \">=0.17.0,<=0.25.1\")") from None


def _recipe(raw: Mapping[str, Any], where: str, ledger: Mapping[str, Workaround]) -> Recipe:
    _check_pin(raw["pin"], where)
    wid = raw.get("workaround", "")
    if wid and wid not in ledger:
        raise bad_choice(f"workaround id (in {where})", wid, tuple(ledger))
    cells = tuple(_recipe_cell(c, f"{where} cell #{i + 1}") for i, c in enumerate(raw["cell"]))
    return Recipe(raw["name"], raw["title"], raw["repo"], raw["commit"], raw["pin"], raw.get("pin_at", ""),
                  raw["door"], raw.get("door_detail", ""), ledger[wid] if wid else None, raw.get("note", ""),
                  tuple(raw.get("engine_kwargs", {}).items()),
                  tuple(RecipeCall(c["call"], c["at"], c.get("quote", "")) for c in raw["call"]), cells,
                  tuple(_recipe_bisect(b, f"{where} bisect #{i + 1}") for i, b in enumerate(raw.get("bisect", ()))),
                  raw.get("package", ""), raw.get("no_release", ""), raw.get("release", ""),
                  tuple(_recipe_cell(c, f"{where} stale_kv #{i + 1}") for i, c in enumerate(raw.get("stale_kv", ()))),
                  raw.get("stale_kv_none", ""),
                  tuple(RecipeSampling(r["param"], r["value"], r["at"], r.get("quote", ""), r.get("source", ""))
                        for r in raw.get("sampling", ())),
                  tuple(_request_cell(c, f"{where} request_cell #{i + 1}")
                        for i, c in enumerate(raw.get("request_cell", ()))))


def load_recipes(path: Path | None = None, ledger_path: Path | None = None) -> tuple[Recipe, ...]:
    """Parse the recipes (default: ``frameworks.toml`` shipped with vllm-repro) against the workaround ledger;
    BadInput names the first thing wrong in one line."""
    data, where = load_table(path, "frameworks.toml", "framework recipes")
    validate(RECIPES, data, where)
    ledger = {w.id: w for w in load_ledger(ledger_path)}
    out: list[Recipe] = []
    for i, raw in enumerate(data["framework"]):
        here = f"{where}: framework #{i + 1} ({raw['name']})"
        if raw["name"] in (r.name for r in out):
            raise BadInput(f"{here}: the name {raw['name']!r} is used twice")
        out.append(_recipe(raw, here, ledger))
    return tuple(out)


def select(recipes: Sequence[Recipe], names: Iterable[str]) -> tuple[Recipe, ...]:
    """The recipes named (all when none is); BadInput names an unknown one and every valid choice."""
    wanted = list(dict.fromkeys(names))
    known = [r.name for r in recipes]
    for name in wanted:
        if name not in known:
            raise bad_choice("framework", name, known)
    return tuple(r for r in recipes if not wanted or r.name in wanted)


def recipe_cells(recipe: Recipe, version: str, stand_ins: bool = True,
                 stale_kv: bool = False) -> tuple[CompiledCell, ...]:
    """The cells ``recipe`` runs on ``version``: its sequence on its door; with ``stand_ins``, the same through
    the engine door when its door is the server; its cells sending the framework's kind of requests (issue 34) on
    its door; its workaround's pair (without it, with it); with ``stale_kv``, its stale-kv cells (issue 37) through
    the engine door."""
    out: list[CompiledCell] = [CompiledCell(recipe.name, STALE_KV, rc.at(version, "engine"), rc.match, rc.why)
                               for rc in (recipe.stale_kv if stale_kv else ())]
    for rc in recipe.cells:
        out.append(CompiledCell(recipe.name, SEQUENCE, rc.at(version, recipe.door), rc.match, rc.why))
        if stand_ins and recipe.door != "engine":
            why = (f"the recipe on its own door, the engine door: {rc.why}" if recipe.own_door == "engine" else
                   f"through the engine door instead of the {recipe.door} door: {rc.why}")
            out.append(CompiledCell(recipe.name, STAND_IN, rc.at(version, "engine"), rc.match, why))
    out += [CompiledCell(recipe.name, REQUESTS, rc.at(version, recipe.door), rc.match, rc.why)
            for rc in recipe.request_cells]
    if recipe.workaround is not None:
        w = recipe.workaround
        for cell, label in zip(w.cells(version), w.labels, strict=True):
            # The ledger's own cells, as `workarounds check` runs them: one result serves both commands.
            out.append(CompiledCell(recipe.name, WORKAROUND, cell, "same", f"workaround {w.id}: {label}"))
    return tuple(out)


def compile_recipes(recipes: Iterable[Recipe], versions: Iterable[str] | Mapping[str, tuple[str, ...]],
                    stand_ins: bool = True, stale_kv: bool = False) -> tuple[CompiledCell, ...]:
    """Every recipe's cells on every version (version outermost); ``versions`` by recipe name gives each recipe
    its own releases; ``stale_kv``: with each recipe's stale-kv cells."""
    rs = tuple(recipes)
    by_name = versions if isinstance(versions, Mapping) else {r.name: tuple(versions) for r in rs}
    order = sorted({v for vs in by_name.values() for v in vs}, key=version_key)
    return tuple(c for v in order for r in rs if v in by_name[r.name]
                 for c in recipe_cells(r, v, stand_ins, stale_kv))


PINS = "pins"  # in --versions: each framework also at the lowest release its pin allows


def pin_floor_release(recipe: Recipe, available: Sequence[str]) -> str | None:
    """The oldest of ``available`` (the index's releases, or a wheelhouse's) that the recipe's pin allows."""
    return next((v for v in sorted(available, key=version_key) if recipe.allows(v)), None)


def versions_by_recipe(recipes: Iterable[Recipe], common: Sequence[str],
                       available: Sequence[str] | None) -> dict[str, tuple[str, ...]]:
    """Each recipe's releases: ``common``, and with ``available`` (``pins`` asked) the oldest release its pin
    allows; BadInput when a recipe's pin allows none of them."""
    out: dict[str, tuple[str, ...]] = {}
    for r in recipes:
        floor = pin_floor_release(r, available) if available is not None else None
        if available is not None and floor is None:
            raise BadInput(f"{r.name} pins vllm {r.pin}: no release of the index allows it (newest: "
                           f"{', '.join(sorted(available, key=version_key)[-3:])}); leave it out with --framework")
        out[r.name] = tuple(sorted(dict.fromkeys([*([floor] if floor else []), *common]), key=version_key))
    return out


def unique_cells(compiled: Iterable[CompiledCell]) -> list[Cell]:
    """The distinct cells to run: recipes that share a cell share its run (and its engine)."""
    return list(dict.fromkeys(c.cell for c in compiled))
