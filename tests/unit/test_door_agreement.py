"""Tests of the agreement of the doors (issue 36 item 5): the framework's client, the recipe on its own door and
the engine-door stand-in, per release; a disagreement is reported as one."""

from __future__ import annotations

import pytest

from harness.core.oracle import Outcome
from harness.verdicts.agreement import agreement, render_agreement
from harness.verdicts.framework_verdicts import Safety
from harness.verdicts.frameworks import load_recipes, select
from harness.verdicts.results import CellResult

pytestmark = pytest.mark.unit

TRL = select(load_recipes(), ["trl"])[0]


def _results(version: str, by_door: dict[str, Outcome]) -> list[CellResult]:
    return [CellResult(cell, outcome, outcome.value, label=outcome.value)
            for door, outcome in by_door.items() for cell in (rc.at(version, door) for rc in TRL.cells)]


def test_doors_that_ran_agree_and_a_missing_door_is_left_out() -> None:
    rs = _results("0.21.0", {"client": Outcome.LOSS, "server": Outcome.LOSS, "engine": Outcome.LOSS})
    rs += _results("0.22.0", {"client": Outcome.OK, "engine": Outcome.OK})
    a21, a22 = agreement(TRL, ["0.21.0", "0.22.0"], rs)
    assert [d.door for d in a21.doors] == ["client", "server", "engine"]
    assert a21.agree and {d.safety for d in a21.doors} == {Safety.UNSAFE}
    assert a22.agree and a22.doors[1].safety is None  # the recipe's door did not run on 0.22.0
    table = "\n".join(render_agreement((a21, a22)))
    assert "| trl 0.21.0 | UNSAFE (LOSS, LOSS) | UNSAFE (LOSS, LOSS) | UNSAFE (LOSS, LOSS) | agree |" in table
    assert "| trl 0.22.0 | SAFE (OK, OK) | - | SAFE (OK, OK) | agree |" in table


def test_a_disagreement_is_a_finding() -> None:
    rs = _results("0.21.0", {"client": Outcome.OK, "server": Outcome.LOSS})
    (a,) = agreement(TRL, ["0.21.0"], rs)
    assert a.agree is False
    assert "**DISAGREE** (a finding)" in "\n".join(render_agreement((a,)))


def test_an_unjudged_door_does_not_count() -> None:
    rs = _results("0.21.0", {"client": Outcome.UNSUPPORTED, "server": Outcome.LOSS})
    (a,) = agreement(TRL, ["0.21.0"], rs)
    assert a.agree is None and a.doors[0].safety is Safety.UNKNOWN


def test_an_unknown_door_agrees_with_nothing() -> None:
    # The client door's cells UNSUPPORTED (say, its precondition unmet) beside two UNSAFE doors: the row is
    # unjudged, not "agree" (the client door said nothing about the framework).
    rs = _results("0.21.0", {"client": Outcome.UNSUPPORTED, "server": Outcome.LOSS, "engine": Outcome.LOSS})
    (a,) = agreement(TRL, ["0.21.0"], rs)
    assert a.agree is None and [d.door for d in a.unjudged] == ["client"]
    assert "| unjudged (client UNKNOWN: agrees with nothing) |" in "\n".join(render_agreement((a,)))
    # Two judged doors that differ stay a disagreement, whatever a third unjudged one says.
    rs = _results("0.21.0", {"client": Outcome.ERROR, "server": Outcome.LOSS, "engine": Outcome.OK})
    assert agreement(TRL, ["0.21.0"], rs)[0].agree is False


def test_an_engine_door_recipe_is_its_own_door_not_a_stand_in() -> None:
    from harness.verdicts.agreement import doors_of

    (orl,) = select(load_recipes(), ["openrlhf"])
    assert doors_of(orl) == (("client", "framework's client"), ("engine", "recipe"))


def test_the_framework_block_says_a_recipe_on_the_engine_door_ran_itself_not_a_stand_in() -> None:
    """``frameworks check --door client``: OpenRLHF's engine-door cells are its recipe on its own door (its own code,
    agreement.doors_of), TRL's are a stand-in for its server door; the rendered block says which ran."""
    from harness.frontends.commands.frameworks import render_check, render_table
    from harness.frontends.commands.fwclient import on_client_door
    from harness.verdicts.framework_verdicts import check_frameworks

    moved = {r.name: r for r in on_client_door(tuple(select(load_recipes(), ["openrlhf", "trl"])))}
    openrlhf, trl = moved["openrlhf"], moved["trl"]
    assert (openrlhf.door, openrlhf.own_door, trl.own_door) == ("client", "engine", "server")
    results = [CellResult(rc.at("0.21.0", door), outcome, outcome.value, label=outcome.value)
               for r in (openrlhf, trl) for rc in r.cells
               for door, outcome in (("client", Outcome.LOSS), ("engine", Outcome.LOSS))]
    checks = check_frameworks((openrlhf, trl), ["0.21.0"], results)
    by_name = {c.recipe.name: c for c in checks}
    ours = "\n".join([*render_table((by_name["openrlhf"],)), *render_check(by_name["openrlhf"])])
    assert "stand-in" not in ours
    assert "; recipe on the engine door: UNSAFE (" in ours
    assert "  recipe on the engine door safe on: none;" in ours
    assert "(recipe on the engine door, same): LOSS" in ours
    theirs = "\n".join([*render_table((by_name["trl"],)), *render_check(by_name["trl"])])
    assert "; engine-door stand-in: UNSAFE (" in theirs and "(engine-door stand-in, same): LOSS" in theirs
