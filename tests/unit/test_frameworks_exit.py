"""``frameworks check`` exits as ``matrix`` does (one rule, ``harness.core.outcome_groups.infra_failed``): 1 when a
cell is ERROR, TIMEOUT or BUILD-FAILED, e.g. a client door whose framework package did not install."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.outcome_groups import infra_failed
from harness.envbuild import client_env as ce
from harness.envbuild.client_python import FoundPython
from harness.envbuild.index_releases import Release
from harness.frontends.cli import main
from harness.frontends.commands.matrix import matrix_exit
from harness.verdicts.results import read_results

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("outcomes", "failed"), [
    (["OK", "LOSS", "UNSUPPORTED", "AMBIGUOUS"], False), (["OK", "ERROR"], True), (["TIMEOUT"], True),
    (["BUILD-FAILED"], True), ([], False)])
def test_one_rule(outcomes: list[str], failed: bool) -> None:
    assert infra_failed(outcomes) is failed


def test_matrix_keeps_the_rule() -> None:
    from harness.core.cell import Cell
    from harness.core.oracle import Outcome
    from harness.verdicts.results import infra_result

    cells = [infra_result(Cell(version="0.21.0"), Outcome.ERROR, "boom")]
    assert matrix_exit(cells, strict=False, fail_on_unexpected=False, sensitivity_failed=False).code == 1


def test_frameworks_check_exits_1_when_its_client_cells_are_error(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    def fails(*_: object, **__: object) -> ce.ClientEnv:
        raise ce.ClientEnvError("installing openrlhf==0.11.2 failed: x No solution")

    monkeypatch.setattr(ce, "fetch_releases", lambda *_: [Release("0.11.2", ("any",), ">=3.10", False)])
    monkeypatch.setattr(ce, "ensure_client_env", fails)
    monkeypatch.setattr("harness.envbuild.client_python.find_python", lambda *_: FoundPython("py", "3.11.7"))
    reports = tmp_path / "r"
    # Only the client door's cells (no recipe door, no stand-in): all settled as ERROR without an engine.
    code = main(["frameworks", "check", "--door", "client", "--framework", "openrlhf", "--no-recipe-door",
                 "--no-stand-in", "--versions", "0.21.0", "--reports", str(reports)])
    cells = read_results(reports / "results.json").cells
    assert cells and {c.outcome.value for c in cells} == {"ERROR"}
    assert code == 1
