"""Do the doors agree (issue 36 item 5)?  Per framework and release, the verdict of the framework's cells on each
door that ran them: its own released client (``client``), the recipe on the framework's door (``server`` for
TRL: our reading of its calls, replayed over HTTP) and the engine-door stand-in (``engine``).  A door with no
result for the release is left out; a disagreement between doors that ran is a finding, not noise.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.verdicts.framework_verdicts import Safety, safety_of
from harness.verdicts.frameworks import Recipe
from harness.verdicts.results import CellResult

CLIENT_DOOR = "client"


@dataclass(frozen=True)
class DoorVerdict:
    door: str
    role: str  # "framework's client", "recipe", "engine stand-in"
    safety: Safety | None  # None: no result of this door's cells
    outcomes: tuple[str, ...]  # per recipe cell, its outcome ("NOT RUN" when absent)


@dataclass(frozen=True)
class Agreement:
    framework: str
    version: str
    doors: tuple[DoorVerdict, ...]

    @property
    def judged(self) -> tuple[DoorVerdict, ...]:
        """The doors whose cells all have a verdict (SAFE or UNSAFE)."""
        return tuple(d for d in self.doors if d.safety in (Safety.SAFE, Safety.UNSAFE))

    @property
    def unjudged(self) -> tuple[DoorVerdict, ...]:
        """The doors that ran but gave no verdict (UNKNOWN: a cell UNSUPPORTED, ERROR, ...)."""
        return tuple(d for d in self.doors if d.safety is Safety.UNKNOWN)

    @property
    def agree(self) -> bool | None:
        """False when two judged doors differ (a finding); True only when every door that ran is judged and they
        say the same, two at least; else None: an UNKNOWN door agrees with nothing (it is unjudged, not in
        agreement), and one judged door has nothing to agree with."""
        verdicts = {d.safety for d in self.judged}
        if len(verdicts) > 1:
            return False
        return None if self.unjudged or len(self.judged) < 2 else True


def doors_of(recipe: Recipe) -> tuple[tuple[str, str], ...]:
    """The doors compared for ``recipe`` (its door as read from its recipe, not the client door's override); a
    recipe on the engine door (OpenRLHF) is itself the engine door's cells, no stand-in."""
    if recipe.door == "engine":
        return ((CLIENT_DOOR, "framework's client"), ("engine", "recipe"))
    own = (recipe.door, "recipe") if recipe.door != CLIENT_DOOR else None
    return ((CLIENT_DOOR, "framework's client"), *((own,) if own else ()), ("engine", "engine stand-in"))


def agreement(recipe: Recipe, versions: Sequence[str], results: Iterable[CellResult]) -> tuple[Agreement, ...]:
    """Per release, the verdict of ``recipe``'s cells on every door (a later result for a cell id wins)."""
    by_id = {r.id: r for r in results}
    out = []
    for v in versions:
        doors = []
        for door, role in doors_of(recipe):
            got = [by_id.get(rc.at(v, door).id) for rc in recipe.cells]
            outcomes = tuple(r.outcome.value if r is not None else "NOT RUN" for r in got)
            doors.append(DoorVerdict(door, role, safety_of(got) if any(r is not None for r in got) else None,
                                     outcomes))
        out.append(Agreement(recipe.name, v, tuple(doors)))
    return tuple(out)


def _not_compared(a: Agreement) -> str:
    if a.unjudged:
        return f"unjudged ({', '.join(d.door for d in a.unjudged)} UNKNOWN: agrees with nothing)"
    return "fewer than two doors judged"


def render_agreement(rows: Sequence[Agreement]) -> list[str]:
    """The agreement table: framework and release, each door's verdict with its cells' outcomes, and whether they
    agree (a DISAGREEMENT is a finding to look into)."""
    from harness.verdicts.mdtable import md_table

    if not rows:
        return []
    heads = [f"{d.door} ({d.role})" for d in rows[0].doors]
    body = []
    for a in rows:
        cells = [f"{d.safety.value} ({', '.join(d.outcomes)})" if d.safety else "-" for d in a.doors]
        said = {True: "agree", False: "**DISAGREE** (a finding)", None: _not_compared(a)}[a.agree]
        body.append([f"{a.framework} {a.version}", *cells, said])
    return md_table(["framework, vLLM", *heads, "doors"], body)
