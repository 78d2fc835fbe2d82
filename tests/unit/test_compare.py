"""compare: cell-by-cell agreement of two reports (CPU tier vs GPU tier), with every difference named."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from synthetic_runs import RUNNING, infra, ran, report

from harness.compare import compare, markdown, render_terminal, verdict_of
from harness.errors import BadInput
from harness.oracle import Outcome
from harness.results import Results

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

    import harness.compare

    tree = ast.parse(inspect.getsource(harness.compare))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "harness.history" not in imported and "harness.core.outcomes" in imported
