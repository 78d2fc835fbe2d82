"""Tests of harness.verdicts.workarounds: the shipped ledger, ledger validation, judge() and LedgerCheck."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from synthetic import request_record

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from harness.verdicts.results import CellResult, infra_result, judged_result
from harness.verdicts.workarounds import (
    LedgerCheck,
    Workaround,
    WorkaroundStatus,
    WorkaroundVerdict,
    judge,
    load_ledger,
)

pytestmark = pytest.mark.unit

NEEDED, REMOVABLE, BROKEN, UNKNOWN = (WorkaroundStatus.NEEDED, WorkaroundStatus.REMOVABLE, WorkaroundStatus.BROKEN,
                                      WorkaroundStatus.UNKNOWN)

MAX_TOKENS = 24
PAUSE_AT = 6
RUNNING = 8
LATE = 2


# --------------------------------------------------------------------------- synthetic results


def _records(cell: Cell, lose: int) -> list[dict[str, Any]]:
    # RUNNING requests paused at PAUSE_AT (the first ``lose`` lose one token there), LATE submitted during it.
    out = []
    for i in range(RUNNING + LATE):
        ref = [100 * (i + 1) + j for j in range(MAX_TOKENS)]
        running = i < RUNNING
        obs = ref[:PAUSE_AT] + ref[PAUSE_AT + 1:] if running and i < lose else list(ref)
        out.append(request_record(
            f"{'r' if running else 'x'}{i:02d}", obs, ref, running=running, mode=cell.mode,
            clear_cache=cell.clear_cache, pause_at=PAUSE_AT, max_tokens=MAX_TOKENS, prompt=[i],
        ))
    return out


def ran(version: str, async_on: bool, lose: int = 0, *, executor: str = "mp", mode: str = "keep",
        clear: bool = True) -> CellResult:
    cell = Cell(version, executor, async_on, mode, clear)
    recs = _records(cell, lose)
    return judged_result(cell, cell_verdict(stream_records(recs)), stream_records(recs), None, 1.0)


def infra(version: str, async_on: bool, outcome: Outcome, reason: str) -> CellResult:
    return infra_result(Cell(version, "mp", async_on, "keep", True), outcome, reason)


@pytest.fixture(scope="module")
def w() -> Workaround:
    (entry,) = [x for x in load_ledger() if x.id == "rlhf-async-scheduling-off"]
    return entry


# --------------------------------------------------------------------------- the shipped ledger


def test_shipped_ledger_entry(w: Workaround) -> None:
    assert w.issue == "vllm#42043"
    assert w.cell == {"executor": "mp", "async_scheduling": True, "mode": "keep", "clear_cache": True}
    assert w.applied == {"async_scheduling": False}
    assert w.fixed_in == "0.22.0"
    assert w.fix == "vllm#42117"
    assert w.setting == "async_scheduling=False"
    assert "rlhf_async_new_apis.py" in w.location
    assert w.labels == ("async_scheduling=True", "async_scheduling=False")


def test_shipped_ledger_ids_are_unique() -> None:
    ids = [x.id for x in load_ledger()]
    assert len(ids) == len(set(ids)) >= 1


@pytest.mark.parametrize("version", ["0.21.0", "0.9.0", "0.32.0"])
def test_cells_without_and_with(w: Workaround, version: str) -> None:
    without, with_ = w.cells(version)
    assert without == Cell(version, "mp", True, "keep", True)
    assert with_ == Cell(version, "mp", False, "keep", True)
    assert without.id == f"vllm{version}-mp-async_on-keep-clear"
    assert with_.id == f"vllm{version}-mp-async_off-keep-clear"


def test_cells_apply_every_changed_setting() -> None:
    wa = Workaround("x", "vllm#1", "", "", "", "", "", {"executor": "ray-v2", "async_scheduling": True,
                                                         "mode": "keep", "clear_cache": True},
                    {"mode": "wait", "clear_cache": False, "executor": "mp"})
    assert wa.cells("0.21.0") == (Cell("0.21.0", "ray-v2", True, "keep", True), Cell("0.21.0", "mp", True, "wait",
                                                                                     False))
    assert wa.labels == ("mode=keep, clear_cache=True, executor=ray-v2", "mode=wait, clear_cache=False, executor=mp")


# --------------------------------------------------------------------------- ledger validation

HEAD = '[[workaround]]\nid = "w1"\nissue = "vllm#1"\nfixed_in = "0.22.0"\n'
CELL = '[workaround.cell]\nexecutor = "mp"\nasync_scheduling = true\nmode = "keep"\nclear_cache = true\n'
APPLIED = "[workaround.applied]\nasync_scheduling = false\n"


def test_custom_ledger_loads(tmp_path: Path) -> None:
    second = HEAD.replace('"w1"', '"w2"') + CELL.replace('"keep"', '"wait"') + "[workaround.applied]\nmode = 'abort'\n"
    p = tmp_path / "ledger.toml"
    p.write_text(HEAD + CELL + APPLIED + second)
    a, b = load_ledger(p)
    assert (a.id, b.id) == ("w1", "w2")
    assert a.title == a.location == a.setting == a.fix == ""
    assert b.cells("0.21.0") == (Cell("0.21.0", "mp", True, "wait", True), Cell("0.21.0", "mp", True, "abort", True))


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[[workaround]\nid = 1", ["invalid TOML"]),
        (HEAD + CELL + "color = 'red'\n" + APPLIED,
         ["workaround[0].cell.color: unknown key", "async_scheduling, mode"]),
        (HEAD + CELL + "[workaround.applied]\nasync = false\n", ["workaround[0].applied.async: unknown key"]),
        (HEAD + CELL.replace("async_scheduling = true", 'async_scheduling = "yes"') + APPLIED,
         ["cell.async_scheduling: expected true or false, found 'yes'"]),
        (HEAD + CELL.replace("clear_cache = true", "clear_cache = 1") + APPLIED,
         ["cell.clear_cache: expected true or false, found 1 (an integer)"]),
        (HEAD + CELL.replace('executor = "mp"', "executor = 2") + APPLIED,
         ["cell.executor: expected one of mp, uni, ray-v1, ray-v2, found 2"]),
        (HEAD + CELL.replace('"keep"', '"hold"') + APPLIED, ["cell.mode", "'hold'", "keep, wait, abort"]),
        (HEAD + CELL + "[workaround.applied]\nmode = 'hold'\n", ["applied.mode", "'hold'", "keep, wait, abort"]),
        (HEAD + CELL.replace('"mp"', '"gpu"') + APPLIED, ["cell.executor", "'gpu'", "mp, uni, ray-v1, ray-v2"]),
        (HEAD + CELL + "[workaround.applied]\n", ["w1", "[applied] changes nothing"]),
        ("# an empty ledger\n", ["workaround: missing", "[[workaround]] tables"]),
        ("", ["workaround: missing", "[[workaround]] tables"]),
        (HEAD + CELL.replace('mode = "keep"\n', "") + APPLIED, ["cell lacks ['mode']"]),
        (HEAD + CELL.replace('mode = "keep"\n', "").replace("clear_cache = true\n", "") + APPLIED,
         ["cell lacks ['clear_cache', 'mode']"]),
        (HEAD + APPLIED, ["workaround[0].cell: missing"]),
        (HEAD + CELL, ["workaround[0].applied: missing"]),
        (HEAD.replace('id = "w1"\n', "") + CELL + APPLIED, ["workaround[0].id: missing"]),
        (HEAD.replace('issue = "vllm#1"\n', "") + CELL + APPLIED, ["workaround[0].issue: missing"]),
    ],
)
def test_bad_ledger(tmp_path: Path, text: str, needles: list[str]) -> None:
    p = tmp_path / "ledger.toml"
    p.write_text(text)
    with pytest.raises(BadInput) as exc:
        load_ledger(p)
    msg = str(exc.value)
    assert msg.startswith(str(p))
    for needle in needles:
        assert needle in msg


def test_bad_ledger_names_the_entry(tmp_path: Path) -> None:
    p = tmp_path / "ledger.toml"
    p.write_text(HEAD + CELL + APPLIED + HEAD.replace('"w1"', '"w2"') + CELL.replace('"mp"', '"gpu"') + APPLIED)
    with pytest.raises(BadInput, match=r"workaround\[1\]\.cell\.executor"):
        load_ledger(p)


def test_missing_ledger_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read workaround ledger"):
        load_ledger(tmp_path / "nope.toml")


def test_cell_that_is_not_a_table(tmp_path: Path) -> None:
    p = tmp_path / "ledger.toml"
    p.write_text(HEAD + 'cell = "mp"\n' + APPLIED)
    with pytest.raises(BadInput, match="cell"):
        load_ledger(p)


# --------------------------------------------------------------------------- judge


def _statuses(check: LedgerCheck) -> dict[str, WorkaroundStatus]:
    return {v.version: v.status for v in check.verdicts}


def test_judge_needed_and_removable(w: Workaround) -> None:
    results = [
        ran("0.21.0", True, lose=RUNNING), ran("0.21.0", False),
        ran("0.22.0", True), ran("0.22.0", False),
        ran("0.32.0", True), ran("0.32.0", False),
    ]
    check = judge(w, ["0.32.0", "0.21.0", "0.22.0"], results)
    assert [v.version for v in check.verdicts] == ["0.21.0", "0.22.0", "0.32.0"]
    assert [v.status for v in check.verdicts] == [NEEDED, REMOVABLE, REMOVABLE]
    needed = check.verdicts[0]
    assert needed.cell_ids == ("vllm0.21.0-mp-async_on-keep-clear", "vllm0.21.0-mp-async_off-keep-clear")
    assert needed.executor == "mp"
    assert f"LOSS(1) in {RUNNING}/{RUNNING + LATE} requests" in needed.evidence
    assert "vllm0.21.0-mp-async_on-keep-clear" in needed.evidence
    assert "async_scheduling=False: OK" in needed.evidence
    assert check.first_removable == "0.22.0"
    assert check.consistency is None


def test_judge_sorts_versions_numerically(w: Workaround) -> None:
    results = [ran(v, a) for v in ("0.9.0", "0.10.0", "0.21.0") for a in (True, False)]
    check = judge(w, ["0.21.0", "0.10.0", "0.9.0"], results)
    assert [v.version for v in check.verdicts] == ["0.9.0", "0.10.0", "0.21.0"]


def test_judge_broken(w: Workaround) -> None:
    check = judge(w, ["0.21.0"], [ran("0.21.0", True, lose=RUNNING), ran("0.21.0", False, lose=3)])
    (v,) = check.verdicts
    assert v.status is BROKEN
    assert "LOSS(1) in 3/10" in v.evidence and "even with async_scheduling=False" in v.evidence
    # BROKEN even when the cell without the workaround is clean.
    (v,) = judge(w, ["0.21.0"], [ran("0.21.0", True), ran("0.21.0", False, lose=1)]).verdicts
    assert v.status is BROKEN


@pytest.mark.parametrize(
    "results",
    [
        pytest.param([ran("0.21.0", True, lose=RUNNING)], id="with-workaround cell missing"),
        pytest.param([ran("0.21.0", False)], id="without-workaround cell missing"),
        pytest.param([infra("0.21.0", True, Outcome.UNSUPPORTED, "no async here"), ran("0.21.0", False)],
                     id="without cell unsupported"),
        pytest.param([ran("0.21.0", True, lose=RUNNING), infra("0.21.0", False, Outcome.ERROR, "engine died")],
                     id="with cell error"),
        pytest.param([infra("0.21.0", True, Outcome.TIMEOUT, "hung"), infra("0.21.0", False, Outcome.TIMEOUT,
                                                                              "hung")], id="both timeout"),
        pytest.param([ran("0.21.0", True, lose=RUNNING), infra("0.21.0", False, Outcome.BUILD_FAILED, "no wheel")],
                     id="build failed"),
    ],
)
def test_judge_unknown(w: Workaround, results: list[CellResult]) -> None:
    (v,) = judge(w, ["0.21.0"], results).verdicts
    assert v.status is UNKNOWN


def test_judge_unknown_when_both_cells_are_missing(w: Workaround) -> None:
    check = judge(w, ["0.21.0", "0.22.0"], [ran("0.22.0", True), ran("0.22.0", False)])
    assert _statuses(check) == {"0.21.0": UNKNOWN, "0.22.0": REMOVABLE}


def test_judge_ignores_other_cells(w: Workaround) -> None:
    # Faults in cells that are not the ledger's pair (other mode, noclear, other executor) do not count.
    results = [
        ran("0.32.0", True), ran("0.32.0", False),
        ran("0.32.0", True, lose=RUNNING, mode="wait"),
        ran("0.32.0", True, lose=RUNNING, clear=False),
        ran("0.32.0", False, lose=RUNNING, executor="ray-v2"),
        ran("0.21.0", True, lose=RUNNING), ran("0.21.0", False),  # a version that was not asked for
    ]
    check = judge(w, ["0.32.0"], results)
    assert _statuses(check) == {"0.32.0": REMOVABLE}


def test_judge_later_duplicate_result_wins(w: Workaround) -> None:
    check = judge(w, ["0.21.0"], [ran("0.21.0", True), ran("0.21.0", False), ran("0.21.0", True, lose=2)])
    assert _statuses(check) == {"0.21.0": NEEDED}


# --------------------------------------------------------------------------- LedgerCheck


def _check(w: Workaround, *pairs: tuple[str, WorkaroundStatus], fixed_in: str | None = None) -> LedgerCheck:
    wa = w if fixed_in is None else Workaround(w.id, w.issue, w.title, w.location, w.setting, w.fix, fixed_in,
                                               w.cell, w.applied)
    return LedgerCheck(wa, tuple(WorkaroundVerdict(v, s, "evidence") for v, s in pairs))


@pytest.mark.parametrize(
    ("pairs", "first"),
    [
        ([("0.21.0", NEEDED), ("0.22.0", REMOVABLE), ("0.32.0", REMOVABLE)], "0.22.0"),
        ([("0.21.0", NEEDED), ("0.22.0", REMOVABLE), ("0.23.0", NEEDED), ("0.32.0", REMOVABLE)], "0.32.0"),
        ([("0.21.0", NEEDED), ("0.22.0", REMOVABLE), ("0.32.0", NEEDED)], None),
        ([("0.21.0", NEEDED), ("0.22.0", REMOVABLE), ("0.32.0", BROKEN)], None),
        ([("0.21.0", NEEDED), ("0.22.0", REMOVABLE), ("0.32.0", UNKNOWN)], "0.22.0"),
        ([("0.21.0", NEEDED), ("0.22.0", UNKNOWN), ("0.32.0", REMOVABLE)], "0.32.0"),
        ([("0.21.0", REMOVABLE), ("0.22.0", REMOVABLE)], "0.21.0"),
        ([("0.21.0", NEEDED)], None),
        ([("0.21.0", UNKNOWN)], None),
        ([], None),
    ],
)
def test_first_removable(w: Workaround, pairs: list[tuple[str, WorkaroundStatus]], first: str | None) -> None:
    assert _check(w, *pairs).first_removable == first


@given(st.lists(st.sampled_from(list(WorkaroundStatus)), max_size=10))
def test_first_removable_rule(statuses: list[WorkaroundStatus]) -> None:
    w = load_ledger()[0]
    pairs = [(f"0.{20 + i}.0", s) for i, s in enumerate(statuses)]
    first = _check(w, *pairs).first_removable
    # The tail after the last NEEDED/BROKEN verdict; its first REMOVABLE version, if any.
    last_bad = max((i for i, s in enumerate(statuses) if s in (NEEDED, BROKEN)), default=-1)
    tail = pairs[last_bad + 1:]
    removable = [v for v, s in tail if s is REMOVABLE]
    assert first == (removable[0] if removable else None)
    if first is not None:
        i = [v for v, _ in pairs].index(first)
        assert all(s in (REMOVABLE, UNKNOWN) for s in statuses[i:])


def test_consistency(w: Workaround) -> None:
    assert _check(w, ("0.21.0", NEEDED), ("0.22.0", REMOVABLE), ("0.32.0", REMOVABLE)).consistency is None
    note = _check(w, ("0.21.0", REMOVABLE), ("0.32.0", REMOVABLE)).consistency
    assert note is not None and "0.21.0 is REMOVABLE" in note and "fixed in 0.22.0" in note
    note = _check(w, ("0.21.0", NEEDED), ("0.22.0", NEEDED)).consistency
    assert note is not None and "0.22.0 still NEEDS" in note and "fixed in 0.22.0" in note
    note = _check(w, ("0.21.0", NEEDED), ("0.22.0", REMOVABLE), ("0.32.0", NEEDED)).consistency
    assert note is not None and note.startswith("0.32.0 still NEEDS")
    # BROKEN and UNKNOWN say nothing about fixed_in.
    assert _check(w, ("0.21.0", BROKEN), ("0.22.0", UNKNOWN), ("0.32.0", BROKEN)).consistency is None
    # No fixed_in in the ledger: nothing to contradict.
    assert _check(w, ("0.21.0", REMOVABLE), ("0.32.0", NEEDED), fixed_in="").consistency is None


def test_consistency_compares_versions_numerically(w: Workaround) -> None:
    # As strings "0.9.0" > "0.10.0"; numerically 0.9.0 is before the fix.
    assert _check(w, ("0.9.0", NEEDED), ("0.10.0", REMOVABLE), fixed_in="0.10.0").consistency is None
    note = _check(w, ("0.9.0", REMOVABLE), fixed_in="0.10.0").consistency
    assert note is not None and note.startswith("0.9.0 is REMOVABLE")
    assert _check(w, ("0.22.0rc1", NEEDED), ("0.22.0", REMOVABLE)).consistency is None


def test_judge_end_to_end_consistency(w: Workaround) -> None:
    results = [ran("0.21.0", True, lose=RUNNING), ran("0.21.0", False), ran("0.22.0", True, lose=RUNNING),
               ran("0.22.0", False)]
    check = judge(w, ["0.21.0", "0.22.0"], results)
    assert _statuses(check) == {"0.21.0": NEEDED, "0.22.0": NEEDED}
    assert check.first_removable is None
    assert check.consistency == "0.22.0 still NEEDS the workaround although the ledger says fixed in 0.22.0"
