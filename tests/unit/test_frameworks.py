"""Tests of the RL framework recipes (harness.verdicts.frameworks), their verdicts
(harness.verdicts.framework_verdicts) and the ``frameworks`` command's validation and rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome
from harness.frontends.cli import main
from harness.frontends.commands.frameworks import render_check, render_recipe, render_report, render_table
from harness.plan.matrix import plan_cells
from harness.verdicts.framework_verdicts import Safety, check_frameworks, safety_of, versions_with_results
from harness.verdicts.frameworks import (
    REQUESTS,
    SEQUENCE,
    STAND_IN,
    WORKAROUND,
    Recipe,
    compile_recipes,
    load_recipes,
    pin_floor_release,
    recipe_cells,
    select,
    unique_cells,
    versions_by_recipe,
)
from harness.verdicts.results import CellResult, infra_result

pytestmark = pytest.mark.unit

NAMES = ["trl", "skyrl", "prime-rl", "areal", "openrlhf", "verl", "pipelinerl", "nemo-rl"]


def by(name: str) -> Recipe:
    (r,) = select(load_recipes(), [name])
    return r


# --------------------------------------------------------------------------- the shipped recipes


def test_shipped_recipes_name_every_framework_with_a_pinned_source() -> None:
    rs = load_recipes()
    assert [r.name for r in rs] == NAMES
    for r in rs:
        assert len(r.commit) == 40 and r.calls and r.cells and r.pin_at
        assert all(":" in c.at or c.at.endswith((".py", ".yaml")) for c in r.calls), r.name


def test_doors_and_pins_follow_the_research() -> None:
    assert {r.name: r.door for r in load_recipes()} == {
        "trl": "server", "skyrl": "server", "prime-rl": "server", "areal": "server",
        "openrlhf": "engine", "verl": "engine", "pipelinerl": "engine", "nemo-rl": "engine"}
    # trl 1.16.0's METADATA pins vllm >=0.22.0,<=0.31.0 (the first release with vllm#42043's fix).
    assert by("trl").floor == "0.22.0" and by("trl").allows("0.31.0") and not by("trl").allows("0.21.0")
    # skyrl 0.4.0's METADATA pins vllm ==0.30.0 (its fsdp and megatron extras).
    assert by("skyrl").floor == "0.30.0" and not by("skyrl").allows("0.22.0")
    assert by("verl").floor == "0.8.5"


def test_pipelinerl_carries_its_workaround_from_the_ledger() -> None:
    w = by("pipelinerl").workaround
    assert w is not None and w.id == "pipelinerl-async-scheduling-off"
    assert w.applied == {"async_scheduling": False} and "conf/base.yaml:67" in w.location
    assert all(by(n).workaround is None for n in NAMES if n != "pipelinerl")


def test_trl_compiles_to_weight_sync_keep_clear_on_the_server_door_and_its_stand_in() -> None:
    cells = recipe_cells(by("trl"), "0.21.0")
    assert [(c.role, c.cell.id) for c in cells] == [
        (SEQUENCE, "vllm0.21.0-mp-async_on-keep-clear-weight_sync-server"),
        (STAND_IN, "vllm0.21.0-mp-async_on-keep-clear-weight_sync"),
        # Its pause and resume over HTTP without the swap (the server door has no HTTP trainer yet).
        (SEQUENCE, "vllm0.21.0-mp-async_on-keep-clear-server"),
        (STAND_IN, "vllm0.21.0-mp-async_on-keep-clear"),
        # The same pause with TRL's kind of requests (issue 34): sampled, logprobs read back, on its door only.
        (REQUESTS, "vllm0.21.0-mp-async_on-keep-clear-server-sampled")]
    assert [c.role for c in recipe_cells(by("trl"), "0.21.0", stand_ins=False)] == [SEQUENCE, SEQUENCE, REQUESTS]
    assert {(s.param, s.at) for s in by("trl").sampling} >= {
        ("seed", "trl/experimental/async_grpo/async_rollout_worker.py:1014"),
        ("logprobs", "trl/experimental/async_grpo/async_rollout_worker.py:1010")}


def test_pipelinerl_sequence_is_its_workarounds_without_cell() -> None:
    cells = recipe_cells(by("pipelinerl"), "0.22.0")
    assert [c.role for c in cells] == [SEQUENCE, WORKAROUND, WORKAROUND]
    assert cells[0].cell == cells[1].cell == Cell("0.22.0", "mp", True, "keep", False, scenario="weight-sync")
    assert cells[2].cell == cells[0].cell.replace(async_on=False)
    assert len(unique_cells(cells)) == 2


def test_recipes_share_engines_per_engine_config() -> None:
    compiled = compile_recipes(load_recipes(), ["0.21.0", "0.22.0"])
    plan = plan_cells(unique_cells(compiled), "cpu")
    # Per version: the server door, the engine door (async on, off) and the sleep profile; no cell refused by plan.
    assert len(plan.engines) == 8 and not plan.unsupported
    assert len(plan.cells) == len(set(c.cell for c in compiled)) < len(compiled)


# --------------------------------------------------------------------------- validation at the edge

HEAD = '''[[framework]]
name = "x"
title = "X"
repo = "o/x"
commit = "0123456789abcdef0123456789abcdef01234567"
pin = ">=0.20.0"
door = "engine"
workaround = "{w}"
[[framework.call]]
call = "pause_generation(mode='keep')"
at = "x.py:1"
'''
CELL = '''[[framework.cell]]
scenario = "{s}"
mode = "{m}"
clear_cache = true
match = "same"
why = "because"
'''


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "f.toml"
    p.write_text(text)
    return p


def test_a_minimal_recipe_loads(tmp_path: Path) -> None:
    (r,) = load_recipes(_file(tmp_path, HEAD.format(w="") + CELL.format(s="pause", m="wait")))
    assert r.cells[0].at("0.21.0", "engine").id == "vllm0.21.0-mp-async_on-wait-clear"


@pytest.mark.parametrize(("text", "needle"), [
    ("[[framework]\n", "invalid TOML"),
    (HEAD.format(w=""), "framework[0].cell: missing"),
    (HEAD.format(w="") + CELL.format(s="bogus", m="keep"), "cell[0].scenario: expected one of pause, weight-sync"),
    (HEAD.format(w="") + CELL.format(s="sleep", m="abort"), "the sleep scenario has no cell mode=abort"),
    (HEAD.format(w="nope") + CELL.format(s="pause", m="keep"), "unknown workaround id"),
    (HEAD.format(w="").replace('door = "engine"', 'door = "http"') + CELL.format(s="pause", m="keep"),
     "framework[0].door"),
    (HEAD.format(w="").replace(">=0.20.0", "0.20 or so") + CELL.format(s="pause", m="keep"), "not a PEP 440"),
    (HEAD.format(w="").replace('repo = "o/x"', 'repo = "o/x"\nrepository = "x"') + CELL.format(s="pause", m="keep"),
     "unknown key; valid keys: name, title"),
    ((HEAD.format(w="") + CELL.format(s="pause", m="keep")) * 2, "used twice"),
])
def test_a_malformed_recipe_file_is_one_line(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(BadInput) as exc:
        load_recipes(_file(tmp_path, text))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_an_unknown_framework_names_the_valid_choices() -> None:
    with pytest.raises(BadInput, match="unknown framework 'trll'; valid choices: trl, skyrl, prime-rl"):
        select(load_recipes(), ["trl", "trll"])
    assert [r.name for r in select(load_recipes(), [])] == NAMES


@pytest.mark.parametrize(("command", "extra", "says"), [
    ("frameworks", ["--framework", "trl,nope"], "valid choices: trl,"),
    ("frameworks", ["--recipes", "MISSING"], "cannot read"),
    # The air-gapped GPU node's options (issue 22's one-GPU run): checked before an env or a file is made.
    ("frameworks", ["--wheelhouse", "MISSING"], "does not exist"),
    ("workarounds", ["--wheelhouse", "MISSING"], "does not exist"),
    ("frameworks", ["--wheelhouse", "MISSING", "--wheels", "cuda"], "not both"),
    ("frameworks", ["--jobs", "0"], "give a positive number of engines, or auto"),
])
def test_check_refuses_bad_input_with_exit_2_and_writes_nothing(tmp_path: Path, command: str, extra: list[str],
                                                                says: str, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    argv = [command, "check", "--versions", "0.21.0", "--platform", "cpu", "--reports", str(reports), *extra]
    assert main([a.replace("MISSING", str(tmp_path / "none")) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not reports.exists()


def test_list_prints_every_call_with_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frameworks", "list", "--framework", "pipelinerl"]) == 0
    out = capsys.readouterr().out
    assert "ServiceNow/PipelineRL@58d3934:pipelinerl/vllm1.py:160" in out
    assert "async-scheduling: false" in out and out.startswith("pipelinerl:")
    assert "weight_sync" in "\n".join(render_recipe(by("skyrl")))


# --------------------------------------------------------------------------- verdicts and rendering


def _res(cell: Cell, outcome: Outcome) -> CellResult:
    if outcome.is_infra:
        return infra_result(cell, outcome, f"why {cell.id}")
    return CellResult(cell, outcome, f"{outcome.value} summary")


@pytest.mark.parametrize(("outcomes", "safety"), [
    ((Outcome.OK, Outcome.OK), Safety.SAFE),
    ((Outcome.OK, Outcome.LOSS), Safety.UNSAFE),
    ((Outcome.UNSUPPORTED, Outcome.DUPLICATE), Safety.UNSAFE),
    ((Outcome.OK, Outcome.UNSUPPORTED), Safety.UNKNOWN),
    ((Outcome.OK, None), Safety.UNKNOWN),
    ((), Safety.UNKNOWN),
])
def test_safety_of(outcomes: tuple[Outcome | None, ...], safety: Safety) -> None:
    cell = Cell("0.21.0")
    assert safety_of(None if o is None else _res(cell, o) for o in outcomes) is safety


def test_check_reads_sequence_stand_in_and_workaround() -> None:
    rs = select(load_recipes(), ["trl", "pipelinerl"])
    results = []
    for c in unique_cells(compile_recipes(rs, ["0.21.0", "0.22.0"])):
        if c.door == "server" and c.scenario == "weight-sync" and c.version == "0.22.0":
            results.append(_res(c, Outcome.UNSUPPORTED))  # e.g. a server that could not swap
        elif c.version == "0.21.0" and c.async_on and c.clear_cache:
            results.append(_res(c, Outcome.LOSS))
        else:
            results.append(_res(c, Outcome.OK))
    trl, pipe = check_frameworks(rs, ["0.22.0", "0.21.0"], results)
    assert [r.version for r in trl.releases] == ["0.21.0", "0.22.0"]
    # 0.21.0: the HTTP swap and pause lose the token; 0.22.0: one OK cell and one that could not run is no
    # verdict.
    assert [r.safety for r in trl.releases] == [Safety.UNSAFE, Safety.UNKNOWN]
    assert [r.stand_in for r in trl.releases] == [Safety.UNSAFE, Safety.SAFE]
    assert trl.safe_on == () and trl.stand_in_safe_on == ("0.22.0",)
    assert trl.first_safe_from_pin(stand_in=True) == "0.22.0" and trl.first_safe_from_pin() is None
    assert pipe.safe_on == ("0.21.0", "0.22.0") and pipe.first_safe_from_pin() == "0.21.0"  # pin ==0.18.1
    assert pipe.workaround is not None
    assert [v.status.value for v in pipe.workaround.verdicts] == ["REMOVABLE", "REMOVABLE"]
    table = "\n".join(render_table((trl, pipe)))
    assert "| trl (server; pins >=0.22.0,<=0.31.0) | UNSAFE (weight_sync-keep-clear[server] LOSS, " \
           "keep-clear[server] LOSS); engine-door stand-in: UNSAFE (weight_sync-keep-clear LOSS, keep-clear LOSS); " \
           "its requests: keep-clear-sampled[server] LOSS [outside its pin] |" in table
    assert "UNKNOWN (weight_sync-keep-clear[server] UNSUPPORTED, keep-clear[server] OK)" in table
    text = "\n".join(render_check(trl))
    assert "why vllm0.22.0-mp-async_on-keep-clear-weight_sync-server" in text
    assert "first safe release at or after its pin: none of the checked releases from 0.22.0" in text
    assert "0.21.0: REMOVABLE" in "\n".join(render_check(pipe))
    assert render_report((trl, pipe))[0].startswith("| framework | 0.21.0 | 0.22.0 |")


def test_each_release_says_why_from_the_known_bug_table() -> None:
    from harness.core.records import ExpectationRecord

    (trl,) = select(load_recipes(), ["trl"])
    results = []
    for c in unique_cells(compile_recipes((trl,), ["0.21.0", "0.22.0"], stand_ins=False)):
        if c.version == "0.21.0":
            exp = ExpectationRecord("as expected", "LOSS(1)", "vllm#42043")
            results.append(CellResult(c, Outcome.LOSS, "LOSS(1) in 8/10", expectation=exp))
        elif c.scenario == "pause":
            results.append(CellResult(c, Outcome.OK, "OK 10/10", expectation=ExpectationRecord("as expected", "OK")))
        else:  # a loss no known bug predicts on 0.22.0
            exp = ExpectationRecord("UNEXPECTED", "OK")
            results.append(CellResult(c, Outcome.DUPLICATE, "DUPLICATE(1) in 1/10", expectation=exp))
    (check,) = check_frameworks((trl,), ["0.21.0", "0.22.0"], results, stand_ins=False)
    text = "\n".join(render_check(check))
    assert ("0.21.0 UNSAFE, why: weight_sync-keep-clear[server] LOSS: predicted by vllm#42043; "
            "keep-clear[server] LOSS: predicted by vllm#42043") in text
    assert ("0.22.0 UNSAFE, why: weight_sync-keep-clear[server] DUPLICATE: UNEXPECTED (expected OK); "
            "keep-clear[server] OK: no known bug covers this cell on this release") in text


def test_report_reads_results_already_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from harness.verdicts.results import Results

    rs = select(load_recipes(), ["openrlhf"])
    cells = unique_cells(compile_recipes(rs, ["0.21.0", "0.22.0"]))
    results = Results(tuple(_res(c, Outcome.LOSS if c.version == "0.21.0" else Outcome.OK) for c in cells))
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results.to_dict()))
    assert main(["frameworks", "report", str(path), "--framework", "openrlhf"]) == 0
    out = capsys.readouterr().out
    assert ("| openrlhf (engine; pins >=0.27.1) | UNSAFE (weight_sync-keep-clear LOSS); its requests: "
            "keep-clear-sampled LOSS [outside its pin] | SAFE (") in out
    assert "0.21.0 with its requests: keep-clear-sampled LOSS" in out
    assert "safe on: 0.22.0" in out and "first safe release at or after its pin: none checked at or after 0.27.1" in out


# --------------------------------------------------------------------------- each framework at its own pin

AVAILABLE = ["0.12.0", "0.17.0", "0.18.0", "0.18.1", "0.19.1", "0.21.0", "0.22.0", "0.26.0", "0.27.1", "0.32.0"]


def test_pins_take_the_oldest_release_each_pin_allows() -> None:
    rs = select(load_recipes(), ["trl", "pipelinerl", "openrlhf", "verl"])
    assert {r.name: pin_floor_release(r, AVAILABLE) for r in rs} == {
        "trl": "0.22.0", "pipelinerl": "0.18.1", "openrlhf": "0.27.1", "verl": "0.12.0"}
    got = versions_by_recipe(rs, ("0.32.0",), AVAILABLE)
    assert got == {"trl": ("0.22.0", "0.32.0"), "pipelinerl": ("0.18.1", "0.32.0"),
                   "openrlhf": ("0.27.1", "0.32.0"), "verl": ("0.12.0", "0.32.0")}
    assert versions_by_recipe(rs, ("0.21.0",), None)["trl"] == ("0.21.0",)  # no pins asked: the common ones only
    with pytest.raises(BadInput, match=r"pipelinerl pins vllm ==0\.18\.1: no release of the index allows it"):
        versions_by_recipe(select(rs, ["pipelinerl"]), (), ["0.21.0", "0.22.0"])


def test_recipes_checked_at_their_own_releases_leave_the_others_out() -> None:
    rs = select(load_recipes(), ["openrlhf", "pipelinerl"])
    versions = {"openrlhf": ("0.27.1",), "pipelinerl": ("0.18.1", "0.32.0")}
    cells = unique_cells(compile_recipes(rs, versions, stand_ins=False))
    assert sorted({c.version for c in cells if c.scenario == "weight-sync" and c.clear_cache}) == ["0.27.1"]
    assert sorted({c.version for c in cells if not c.clear_cache}) == ["0.18.1", "0.32.0"]
    results = [_res(c, Outcome.OK) for c in cells]
    # `frameworks report` finds each recipe's own releases in the results: no NOT RUN columns for the others.
    assert versions_with_results(rs, results, stand_ins=False) == versions
    openrlhf, pipe = check_frameworks(rs, versions, results, stand_ins=False)
    assert openrlhf.safe_on == ("0.27.1",) and openrlhf.first_safe_from_pin() == "0.27.1"
    assert pipe.first_safe_from_pin() == "0.18.1"
    assert pipe.workaround is not None and [v.version for v in pipe.workaround.verdicts] == ["0.18.1", "0.32.0"]
    header, _, *rows = render_table((openrlhf, pipe))
    assert header == "| framework | 0.18.1 | 0.27.1 | 0.32.0 |"
    assert rows[0].startswith("| openrlhf (engine; pins >=0.27.1) | - | SAFE (") and rows[0].endswith(" | - |")


def test_every_framework_has_a_stale_kv_cell_or_says_why_not() -> None:
    """Issue 37's column: each recipe's update sequence as a stale-kv scenario (engine door, its own model), or a
    reason; ``frameworks check`` runs them unless --no-stale-kv, bisects and the ledger never do."""
    from harness.core.scenarios import BY_SCENARIO
    from harness.verdicts.frameworks import STALE_KV

    for r in load_recipes():
        assert bool(r.stale_kv) != bool(r.stale_kv_none), r.name
        for rc in r.stale_kv:
            assert dict(rc.values)["scenario"].startswith("stale-kv-") and rc.why
        cells = recipe_cells(r, "0.32.0", stale_kv=True)
        stale = [c for c in cells if c.role == STALE_KV]
        assert len(stale) == len(r.stale_kv) and all(c.cell.door == "engine" for c in stale)
        assert all(BY_SCENARIO[c.cell.scenario].profile == "prefix-cache" for c in stale)
        assert not [c for c in recipe_cells(r, "0.32.0") if c.role == STALE_KV]
    assert by("pipelinerl").stale_kv_none.startswith("PipelineRL starts vLLM with enable-prefix-caching false")


def test_the_stale_kv_column_shows_each_release_and_is_not_the_safety_verdict() -> None:
    from harness.verdicts.frameworks import STALE_KV

    rs = select(load_recipes(), ["prime-rl", "pipelinerl"])
    compiled = compile_recipes(rs, ["0.21.0"], stale_kv=True)
    results = [_res(c.cell, Outcome.STALE_KV if c.role == STALE_KV else Outcome.OK) for c in compiled]
    prime, pipe = check_frameworks(rs, ["0.21.0"], results)
    (rv,) = prime.releases
    assert rv.safety is Safety.SAFE and [o.outcome for o in rv.stale_kv] == ["STALE-KV"]
    assert "stale KV: stale_kv_keep-keep-noclear STALE-KV" in "\n".join(render_table((prime, pipe)))
    text = "\n".join(render_check(prime))
    assert "stale KV (same: keep pause with clear_cache=False" in text
    assert "0.21.0 stale_kv_keep-keep-noclear: STALE-KV" in text
    assert "stale KV: not applicable: PipelineRL starts vLLM" in "\n".join(render_check(pipe))
    # A run without the column (--no-stale-kv, an older report) shows none, never NOT RUN rows.
    (bare,) = check_frameworks(rs[:1], ["0.21.0"], [r for r, c in zip(results, compiled, strict=True)
                                                     if c.role != STALE_KV])
    assert bare.releases[0].stale_kv == ()


def test_every_framework_read_says_what_its_rollouts_send() -> None:
    """Issue 34 item 5: temperature, n, seed, logprobs, logprobs mode, penalties and structured output, each cited;
    every recipe with a pause the pause scenario plays sends sampled requests in a request cell on its door."""
    from harness.verdicts.file_schemas import SAMPLING_PARAMS

    for name in ("trl", "verl", "openrlhf", "skyrl", "areal", "prime-rl", "nemo-rl"):
        r = by(name)
        assert sorted(s.param for s in r.sampling) == sorted(SAMPLING_PARAMS), name
        assert all(s.quote and ":" in s.at for s in r.sampling), name
    for name in ("trl", "verl", "openrlhf", "skyrl", "areal", "prime-rl"):
        (rc,) = by(name).request_cells
        assert dict(rc.values)["request"] == "sampled" and dict(rc.values)["scenario"] == "pause"
    assert not by("nemo-rl").request_cells  # it never pauses


def test_a_request_cell_must_name_a_request_kind(tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "harness/verdicts/frameworks.toml").read_text()
    bad = text.replace('request = "sampled"\n', "", 1)
    path = tmp_path / "f.toml"
    path.write_text(bad)
    with pytest.raises(BadInput, match=r"request_cell #1.*request kind"):
        load_recipes(path)


def test_frameworks_check_pipelines_on_cpu_and_jobs_1_is_the_run_of_before() -> None:
    """``frameworks check`` takes the matrix's capacity (issue 39): on the CPU platform one engine more than decode
    at once, so the next engine starts up during the scenarios; a command without ``--jobs`` keeps one at a time."""
    import argparse
    from types import SimpleNamespace

    from harness.frontends.commands.cellrun import check_capacity
    from harness.run.spec import RunConfig

    cfg = RunConfig(platform="cpu", work_dir=Path("w"), model_cache=Path("m"))

    def ctx(**args: str) -> Any:
        return SimpleNamespace(args=argparse.Namespace(**args), platform="cpu")

    auto = check_capacity(ctx(jobs="auto"), cfg)
    assert auto is not None and auto.jobs == auto.scenarios + 1 and auto.scenarios >= 1
    one = check_capacity(ctx(jobs="1"), cfg)
    assert one is not None and one.jobs == 1
    assert check_capacity(ctx(), cfg) is None  # workarounds check: no --jobs, one engine at a time as before
