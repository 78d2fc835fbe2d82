"""Bisect one RL framework's call sequence over vLLM releases (issue 22): the predicate is the framework's own
release verdict, as ``frameworks check`` reads it, not one cell.

A probe runs every cell of the recipe's sequence on its own door at one candidate (one plan: the cells that
share an engine config share the engine) and judges the release with
:func:`harness.verdicts.framework_verdicts.release_verdict`: UNSAFE (a cell lost, repeated or shifted tokens, or
vLLM crashed) is BAD, SAFE (every cell OK) is GOOD, UNKNOWN (a cell UNSUPPORTED, ERROR, TIMEOUT ...) is SKIP
and stepped around. Engine-door stand-ins and the workaround's pair are not run: a bisect answers for the
framework's sequence only. The search itself is :func:`harness.bisect.search.bisect`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.bisect.search import BisectError, BisectResult, ProbeRecord, ProbeResult, Verdict, answer_fields, bisect
from harness.plan.matrix import plan_cells
from harness.run.context import Backend, RunContext
from harness.run.execute import execute_plan
from harness.verdicts.framework_verdicts import ReleaseVerdict, Safety, release_verdict
from harness.verdicts.frameworks import SEQUENCE, Recipe, recipe_cells
from harness.verdicts.results import CellResult

FRAMEWORK_BISECT_SCHEMA = "vllm-repro/framework-bisect"
FRAMEWORK_BISECT_SCHEMA_VERSION = 1
_VERDICT = {Safety.UNSAFE: Verdict.BAD, Safety.SAFE: Verdict.GOOD, Safety.UNKNOWN: Verdict.SKIP}


def verdict_of_release(rv: ReleaseVerdict) -> ProbeResult:
    """BAD for UNSAFE, GOOD for SAFE, SKIP for UNKNOWN; the detail names every cell's outcome."""
    cells = ", ".join(f"{o.label} {o.outcome}" + ("" if o.outcome in ("OK", "NOT RUN") else f" ({o.detail})")
                      for o in rv.cells)
    return ProbeResult(_VERDICT[rv.safety], f"{rv.safety.value}: {cells}")


@dataclass(frozen=True)
class FrameworkBisect:
    """A finished framework bisect: the answer (or the refusal), every probe, its release verdict and cells."""

    recipe: Recipe
    candidates: tuple[str, ...]
    find: str
    result: BisectResult | None
    error: str | None
    probes: tuple[ProbeRecord, ...]
    releases: dict[str, ReleaseVerdict]
    cells: dict[str, tuple[CellResult, ...]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": FRAMEWORK_BISECT_SCHEMA,
            "schema_version": FRAMEWORK_BISECT_SCHEMA_VERSION,
            "framework": self.recipe.name,
            "source": self.recipe.source(self.recipe.pin_at),
            "pin": self.recipe.pin,
            "door": self.recipe.door,
            "find": self.find,
            "candidates": list(self.candidates),
            **answer_fields(self.result, self.error, self.probes, self.find),
            "probes": [{"step": p.step, "candidate": p.candidate, "verdict": p.result.verdict.value,
                        "safety": self.releases[p.candidate].safety.value if p.candidate in self.releases else None,
                        "detail": p.result.detail,
                        "cells": [c.to_dict() for c in self.cells.get(p.candidate, ())]}
                       for p in self.probes],
        }


def sequence_probe(recipe: Recipe, ctx: RunContext, releases: dict[str, ReleaseVerdict],
                   cells: dict[str, tuple[CellResult, ...]],
                   backend: Backend | None = None) -> Callable[[str], ProbeResult]:
    """A probe that runs ``recipe``'s sequence on a candidate and judges the release; ``releases`` and ``cells``
    collect each probed release's verdict and cell results."""

    def probe(candidate: str) -> ProbeResult:
        wanted = [c.cell for c in recipe_cells(recipe, candidate, stand_ins=False) if c.role == SEQUENCE]
        done = execute_plan(plan_cells(list(dict.fromkeys(wanted)), ctx.cfg.platform), ctx, backend).cells
        cells[candidate] = tuple(done)
        releases[candidate] = rv = release_verdict(recipe, candidate, {r.id: r for r in done}, stand_ins=False)
        return verdict_of_release(rv)

    return probe


def run_framework_bisect(
    recipe: Recipe,
    candidates: list[str],
    find: str,
    ctx: RunContext,
    on_probe: Callable[[ProbeRecord], None] | None = None,
    backend: Backend | None = None,
) -> FrameworkBisect:
    """Bisect ``candidates`` with ``recipe``'s release verdict as the predicate; a refused range is returned (its
    endpoint probes kept), not raised."""
    releases: dict[str, ReleaseVerdict] = {}
    cells: dict[str, tuple[CellResult, ...]] = {}
    probes: list[ProbeRecord] = []

    def record(p: ProbeRecord) -> None:
        probes.append(p)
        if on_probe is not None:
            on_probe(p)

    probe = sequence_probe(recipe, ctx, releases, cells, backend)
    try:
        result: BisectResult | None = bisect(candidates, probe, find, on_probe=record)
        error = None
    except BisectError as exc:
        result, error = None, str(exc)
    return FrameworkBisect(recipe, tuple(candidates), find, result, error, tuple(probes), releases, cells)
