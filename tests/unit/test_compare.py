"""compare: cell-by-cell agreement of two reports (CPU tier vs GPU tier), with every difference named."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from synthetic_runs import RUNNING, infra, ran, records, report

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from harness.verdicts.compare.pairs import compare, verdict_of
from harness.verdicts.compare.render import ACROSS_TIERS_NOTE, markdown, render_terminal
from harness.verdicts.known_bugs import annotate, load_known_bugs
from harness.verdicts.results import CellResult, Results, judged_result

pytestmark = pytest.mark.unit

KEEP = "vllm0.21.0-mp-async_on-keep-clear"
RAY = "Ray executors do not run on vLLM's CPU platform"


def cpu(*cells: object) -> Results:
    return report(tuple(cells), "2026-11-30T02:00:00+00:00", "cpu")  # type: ignore[arg-type]


def gpu(*cells: object) -> Results:
    return report(tuple(cells), "2026-11-30T03:00:00+00:00", "cuda")  # type: ignore[arg-type]


def g(version: str, async_on: bool = True, lose: int = 0, **kw: object) -> object:
    return ran(version, async_on, lose, platform="cuda", device="NVIDIA H100 80GB HBM3", **kw)  # type: ignore[arg-type]


def test_identical_verdicts_agree_100_percent() -> None:
    a = cpu(ran("0.21.0", True, RUNNING), ran("0.21.0", False), ran("0.22.0", True))
    b = gpu(g("0.21.0", True, RUNNING), g("0.21.0", False), g("0.22.0", True))
    cmp = compare(a, b, "cpu/results.json", "gpu/results.json")
    assert [c.agree for c in cmp.both] == [True, True, True]
    assert cmp.agreement == 100.0 and cmp.exit_code == 0
    assert not cmp.disagreements and not cmp.one_sided and not cmp.warnings
    assert cmp.headline == "A (cpu) and B (cuda) agree on 3/3 cells both ran (100.0 %)"
    assert cmp.a.platform == "cpu" and cmp.b.devices == ("NVIDIA H100 80GB HBM3",)
    assert cmp.a.versions == ("0.21.0", "0.22.0")
    # Same verdicts: no request is listed as judged differently.
    assert all(not c.first_tokens for c in cmp.both)


@pytest.mark.parametrize(("b_cell", "difference", "affected"), [
    (lambda: g("0.21.0", True, 0), "outcome LOSS vs OK", 8),
    (lambda: g("0.21.0", True, RUNNING, k=2), "label LOSS(1) vs LOSS(2)", 8),
    (lambda: g("0.21.0", True, 6), "affected requests 8/10 vs 6/10", 2),
])
def test_disagreements_are_named(b_cell: object, difference: str, affected: int) -> None:
    cmp = compare(cpu(ran("0.21.0", True, RUNNING)), gpu(b_cell()))  # type: ignore[operator]
    (c,) = cmp.both
    assert not c.agree and c.difference == difference
    assert cmp.agreement == 0.0 and cmp.exit_code == 1
    assert cmp.disagreements == (c,)
    # Every request judged differently, with both sides' first post-resume token and verdict.
    assert len(c.first_tokens) == affected
    t = c.first_tokens[-1]
    assert t.a is not None and t.a["expected"] != t.a["observed"] and t.a_label == "LOSS(1 at 8)"
    assert t.b is not None and t.b["index"] == 8
    md = markdown(cmp)
    assert f"**NO**: {difference}" in md and f"### `{KEEP}`" in md and "LOSS(1 at 8)" in md
    assert "agree on 0/1 cells both ran (0.0 %); 1 disagree: " + KEEP in md


def test_engine_facts_that_may_explain_a_disagreement() -> None:
    # The GPU side's cell asked for async but ran without it: that explains an OK where CPU lost a token.
    cmp = compare(cpu(ran("0.21.0", True, RUNNING)), gpu(g("0.21.0", True, 0, effective_async=False)))
    (c,) = cmp.both
    assert "effective async_scheduling: on vs off" in c.context
    assert "effective async_scheduling: on vs off" in markdown(cmp)


def test_cells_one_side_ran_are_listed_with_the_other_sides_reason() -> None:
    a = cpu(ran("0.21.0", True, RUNNING), infra("0.21.0", Outcome.UNSUPPORTED, RAY, executor="ray-v2"),
            infra("0.21.0", Outcome.ERROR, "engine core died", mode="abort"))
    b = gpu(g("0.21.0", True, RUNNING), g("0.21.0", True, executor="ray-v2"),
            infra("0.21.0", Outcome.TIMEOUT, "no event for 300 s", mode="abort"), g("0.22.0", True))
    cmp = compare(a, b)
    assert [c.id for c in cmp.both] == [KEEP]
    assert cmp.agreement == 100.0 and cmp.exit_code == 0  # one-sided cells are listed, not counted
    one = {o.id: o for o in cmp.one_sided}
    ray = one["vllm0.21.0-ray-v2-async_on-keep-clear"]
    assert ray.ran == "B" and ray.a is not None and ray.a.text == f"UNSUPPORTED: {RAY}"
    assert one["vllm0.22.0-mp-async_on-keep-clear"].a is None
    (neither,) = cmp.neither
    assert neither.id == "vllm0.21.0-mp-async_on-abort-clear"
    md = markdown(cmp)
    assert "## Cells only one side ran" in md and f"UNSUPPORTED: {RAY}" in md and "not in report" in md
    assert "## Cells neither side ran" in md and "TIMEOUT: no event for 300 s" in md


def test_nothing_in_common_is_not_agreement() -> None:
    cmp = compare(cpu(ran("0.21.0", True, RUNNING)), gpu(g("0.22.0", True)))
    assert cmp.agreement is None and cmp.exit_code == 1
    assert cmp.headline.startswith("no cell ran on both sides")
    assert any("no cell id in common" in w for w in cmp.warnings)


def test_injection_on_one_side_is_warned_about() -> None:
    a = cpu(ran("0.32.0", True))
    b = report((g("0.32.0", True, RUNNING, inject=["vllm#42043"]),), "2026-11-30T03:00:00+00:00", "cuda",
               inject=["vllm#42043"])
    cmp = compare(a, b)
    assert cmp.b.inject == ("vllm#42043",)
    assert any("fault injection vllm#42043" in w for w in cmp.warnings)
    assert "> warning: A ran with no fault injection, B with fault injection vllm#42043" in markdown(cmp)


def test_duplicate_cells_are_refused() -> None:
    a = cpu(ran("0.21.0", True, RUNNING), ran("0.21.0", True))
    with pytest.raises(BadInput, match=f"cpu.json has more than one result for cell '{KEEP}'"):
        compare(a, gpu(g("0.21.0")), "cpu.json", "gpu.json")


def test_verdict_of_counts_affected_requests() -> None:
    v = verdict_of(ran("0.21.0", True, 5))
    assert (v.outcome, v.label, v.affected, v.total, v.ran) == ("LOSS", "LOSS(1)", 5, 10, True)
    v = verdict_of(infra("0.21.0", Outcome.UNSUPPORTED, RAY))
    assert (v.ran, v.affected) == (False, None)


def test_terminal_rendering() -> None:
    cmp = compare(cpu(ran("0.21.0", True, RUNNING), ran("0.21.0", False)),
                  gpu(g("0.21.0", True, 0), g("0.21.0", False), g("0.22.0", True)))
    out = io.StringIO()
    render_terminal(cmp, Console(file=out, width=200))
    text = out.getvalue()
    assert "NO: outcome LOSS vs OK" in text and "only B ran" in text
    assert "agree on 1/2 cells both ran (50.0 %)" in text
    assert "keep-clear-r00: A LOSS(1 at 8): [8] expected" in text


def test_compare_does_not_depend_on_history() -> None:
    # Outcome categories, styles and injection ids live in harness.core; a comparison needs no history.
    import ast
    import inspect

    import harness.verdicts.compare.pairs
    import harness.verdicts.compare.render

    imported = {n.module for m in (harness.verdicts.compare.pairs, harness.verdicts.compare.render)
                for n in ast.walk(ast.parse(inspect.getsource(m))) if isinstance(n, ast.ImportFrom)}
    assert not any(m and m.startswith("harness.verdicts.history") for m in imported)
    assert "harness.core.outcome_groups" in imported


# --------------------------------------------------------------------------- across tiers

SCHED_REQUESTS = 4  # the scheduler tier's drained reset: 4 requests, all running at the reset


def sched(version: str, async_on: bool = True, lose: int = 0) -> CellResult:
    """A scheduler-tier cell judged by the oracle: 4 requests running at the reset, the first ``lose`` losing."""
    cell = Cell(version, "mp", async_on, "keep", True, tier="scheduler")
    recs = records(cell, lose)[:SCHED_REQUESTS]
    info = {"tier": "scheduler", "vllm_version": version, "torch_version": "2.13.0+cpu",
            "effective": {"async_scheduling": async_on, "executor_class": "AsyncScheduler" if async_on
                          else "Scheduler"}}
    return judged_result(cell, cell_verdict(stream_records(recs)), stream_records(recs), info, duration_s=0.1)


def annotated(*cells: CellResult) -> Results:
    return cpu(*(annotate(c, load_known_bugs()) for c in cells))


def test_tiers_pair_by_id_without_the_tier_segment() -> None:
    a = annotated(sched("0.21.0", True, SCHED_REQUESTS), sched("0.21.0", False), sched("0.32.0", True))
    b = annotated(ran("0.21.0", True, RUNNING), ran("0.21.0", False), ran("0.22.0", True))
    assert a.cells[0].id == KEEP + "-sched"
    cmp = compare(a, b, "sched.json", "engine.json")
    assert cmp.across_tiers and compare(a, b, "sched.json", "engine.json", across_tiers=True) == cmp
    assert [c.id for c in cmp.both] == [KEEP, "vllm0.21.0-mp-async_off-keep-clear"]
    assert all(c.agree for c in cmp.both) and cmp.exit_code == 0
    # 4/4 and 8/10: every request running at the pause on both tiers; no request is paired across workloads.
    assert cmp.both[0].a.scope == cmp.both[0].b.scope == "every request running at the pause"
    assert all(not c.first_tokens for c in cmp.both)
    # The scheduler and executor classes, and the request counts, differ by construction: not listed.
    assert cmp.both[0].context == ()
    assert [o.id for o in cmp.one_sided] == ["vllm0.32.0-mp-async_on-keep-clear", "vllm0.22.0-mp-async_on-keep-clear"]
    assert cmp.headline == ("A (cpu, scheduler tier) and B (cpu, engine tier) agree on 2/2 cells both ran "
                            "(100.0 %)")
    md = markdown(cmp)
    assert md.startswith("# vllm-repro: scheduler tier vs engine tier comparison") and ACROSS_TIERS_NOTE in md
    # Same-tier reports keep exact ids and the titles they always had.
    same = compare(b, b)
    assert not same.across_tiers and same.a.title == "A (cpu)" and same.both[0].id == KEEP


def test_across_tiers_the_requests_hit_are_compared_not_counted() -> None:
    cmp = compare(annotated(sched("0.21.0", True, 2)), annotated(ran("0.21.0", True, RUNNING)))
    (c,) = cmp.both
    assert not c.agree and not c.expected_difference and cmp.exit_code == 1
    assert c.difference == ("affected some requests (LOSS(1) in 2/4 requests (2/4 running at pause)) vs every "
                            "request running at the pause (LOSS(1) in 8/10 requests (8/8 running at pause))")


def test_a_difference_each_tiers_known_bug_rules_expect_is_named_not_failed() -> None:
    # 0.16.0: the scheduler tier's drained reset loses the token (its #42043 window starts at 0.12.0); the engine
    # tier's keep pause does not reset the cache with requests running before 0.17.0: OK there, as its rule says.
    a = annotated(sched("0.16.0", True, SCHED_REQUESTS), sched("0.22.0", True, SCHED_REQUESTS))
    b = annotated(ran("0.16.0", True, 0), ran("0.22.0", True, 0))
    cmp = compare(a, b)
    old, new = cmp.both
    assert not old.agree and old.difference == "outcome LOSS vs OK"
    assert old.expected_difference.startswith(
        "the known-bug table expects scheduler tier LOSS(1) (vllm#42043); engine tier OK (vllm#42043 is listed for "
        "the engine tier on ")
    assert "vllm#42043 is listed for the scheduler tier on " in old.expected_difference
    # Each window's note (known_bugs.toml) says why the tiers' windows differ.
    assert "keep mode arrived in 0.16.0 without the forced preemption" in old.expected_difference
    # 0.22.0 has the fix on both tiers: a LOSS there is no expected difference.
    assert not new.agree and not new.expected_difference
    assert cmp.expected_differences == (old,) and cmp.disagreements == (new,) and cmp.exit_code == 1
    assert "1 differ as the known-bug table expects per tier: vllm0.16.0-mp-async_on-keep-clear" in cmp.headline
    assert "| expected difference: the known-bug table expects scheduler tier LOSS(1)" in markdown(cmp)
    only_old = compare(annotated(sched("0.16.0", True, SCHED_REQUESTS)), annotated(ran("0.16.0", True, 0)))
    assert only_old.exit_code == 0 and only_old.agreement == 0.0


def test_a_report_of_both_tiers_cannot_be_paired_across_them() -> None:
    mixed = annotated(sched("0.21.0", True, SCHED_REQUESTS), ran("0.21.0", True, RUNNING))
    assert not compare(mixed, mixed).across_tiers
    with pytest.raises(BadInput, match=r"holds more than one tier of cell 'vllm0\.21\.0-mp-async_on-keep-clear'"):
        compare(mixed, annotated(ran("0.21.0")), "mixed.json", across_tiers=True)


def server(c: CellResult) -> CellResult:
    """``c`` as the server door ran it (same records: the doors play one workload)."""
    from dataclasses import replace

    return replace(c, cell=c.cell.replace(door="server"))


def test_doors_pair_by_id_without_the_door_segment() -> None:
    eng = cpu(ran("0.21.0", True, RUNNING), ran("0.22.0", True))
    srv = cpu(server(ran("0.21.0", True, RUNNING)), server(ran("0.22.0", True, RUNNING)))
    assert srv.cells[0].id == KEEP + "-server"
    cmp = compare(eng, srv, "engine.json", "server.json")
    assert cmp.across_doors and not cmp.across_tiers
    assert [c.id for c in cmp.both] == [KEEP, "vllm0.22.0-mp-async_on-keep-clear"]
    assert [c.agree for c in cmp.both] == [True, False] and cmp.agreement == 50.0 and cmp.exit_code == 1
    # Same workload through both doors: the requests pair, and the ones judged differently are named.
    assert cmp.both[1].first_tokens and not cmp.both[0].first_tokens
    assert markdown(cmp).startswith("# vllm-repro: engine door vs server door comparison (cpu)")
    assert not compare(eng, eng).across_doors
    # One report of both doors (a --door all run): its engine-door cells against its server-door cells.
    both = cpu(*eng.cells, *srv.cells)
    assert [c.agree for c in compare(both, both, "r.json", "r.json", across_doors=True).both] == [True, False]
