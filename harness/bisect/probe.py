"""The bisect driver: run one matrix cell per vLLM version (or commit) as the probe, GOOD, BAD or SKIP.

(``harness.bisect.search`` is the pure search; an engine's self-report is its "probe" event, a different thing.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.bisect.search import BisectError, BisectResult, ProbeRecord, ProbeResult, Verdict, answer_fields, bisect
from harness.core.pattern import CellTemplate
from harness.plan.matrix import plan_cells
from harness.run.context import Backend, RunContext
from harness.run.execute import execute_plan
from harness.verdicts.results import CellResult


def verdict_of(result: CellResult) -> ProbeResult:
    """BAD for a token fault, GOOD for OK, SKIP for anything that produced no streams."""
    detail = f"{result.outcome.value}: {result.summary}" if result.outcome.value not in result.summary \
        else result.summary
    if result.outcome.is_finding:
        return ProbeResult(Verdict.BAD, detail)
    if result.outcome.value == "OK":
        return ProbeResult(Verdict.GOOD, detail)
    return ProbeResult(Verdict.SKIP, f"{result.outcome.value}: {result.reason or result.summary}")


def make_probe(
    template: CellTemplate,
    ctx: RunContext,
    results: dict[str, CellResult] | None = None,
    backend: Backend | None = None,
) -> Callable[[str], ProbeResult]:
    """A probe that runs ``template`` on a candidate (one engine start) and judges the cell.

    ``ctx.recipe_for(candidate)`` builds the env recipe (per-commit wheel
    indexes); ``results`` collects every probed cell result.
    """

    def probe(candidate: str) -> ProbeResult:
        plan = plan_cells([template.at(candidate)], ctx.cfg.platform)
        (cell,) = execute_plan(plan, ctx, backend).cells
        if results is not None:
            results[candidate] = cell
        return verdict_of(cell)

    return probe


def probe_log_entry(candidate: str, result: ProbeResult, cell: CellResult | None) -> dict[str, Any]:
    return {
        "candidate": candidate,
        "verdict": result.verdict.value,
        "detail": result.detail,
        "cell": cell.to_dict() if cell is not None else None,
    }


BISECT_SCHEMA = "vllm-repro/bisect"
BISECT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class BisectRun:
    """A finished bisect: the answer (or the refusal) and every probe with its cell result."""

    candidates: tuple[str, ...]
    find: str
    template: CellTemplate
    result: BisectResult | None
    error: str | None
    probes: tuple[ProbeRecord, ...]
    cells: dict[str, CellResult]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": BISECT_SCHEMA,
            "schema_version": BISECT_SCHEMA_VERSION,
            "find": self.find,
            "cell": self.template.label,
            "candidates": list(self.candidates),
            **answer_fields(self.result, self.error, self.probes, self.find),
            "probes": [
                {"step": p.step, **probe_log_entry(p.candidate, p.result, self.cells.get(p.candidate))}
                for p in self.probes
            ],
        }


def run_bisect(
    candidates: list[str],
    template: CellTemplate,
    find: str,
    ctx: RunContext,
    on_probe: Callable[[ProbeRecord], None] | None = None,
    noun: str = "release",
    backend: Backend | None = None,
) -> BisectRun:
    """Bisect ``candidates`` with ``template`` as the predicate; a refused range is returned, not raised."""
    cells: dict[str, CellResult] = {}
    probes: list[ProbeRecord] = []

    def record(p: ProbeRecord) -> None:
        probes.append(p)
        if on_probe is not None:
            on_probe(p)

    probe = make_probe(template, ctx, cells, backend)
    try:
        result = bisect(candidates, probe, find, on_probe=record, noun=noun)
    except BisectError as exc:
        return BisectRun(tuple(candidates), find, template, None, str(exc), tuple(probes), cells)
    return BisectRun(tuple(candidates), find, template, result, None, tuple(probes), cells)
