"""The compatibility smoke of one release (one cell per tier and door), the release's default matrix, and what
each cell's outcome says about the harness and about vLLM.

A smoke cell is a default cell that every release the harness supports runs (executor mp, async on, a keep pause
with clear_cache), so its outcome is read by its typed fields alone:

* planned UNSUPPORTED (the plan's ``unsupported``: this platform cannot run that tier or door, whatever the
  release) -> not applicable, with the plan's reason;
* OK -> compatible; a finding (``Outcome.is_finding``: LOSS, DUPLICATE, DIVERGED, TRUNCATED, CRASH, STALL) -> a
  finding about vLLM, never a harness failure; AMBIGUOUS or FLAKY -> inconclusive;
* anything else on a cell the plan said runs -> the harness is incompatible with the release: BUILD-FAILED (its
  env), ERROR or TIMEOUT (the engine or the scheduler adapter died outside vLLM's code), or UNSUPPORTED at run
  time (vLLM refused a setting the harness sets, the adapter cannot drive its scheduler, the server door finds no
  server module).  The cell's reason is the cause.

In the default matrix a run-time UNSUPPORTED may be a release's own limit (a scenario needing an API it lacks,
an unmet precondition): counted as unsupported there; its infrastructure failures are incompatibilities.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from harness.core.cell import Cell, at_release
from harness.core.oracle import Outcome
from harness.plan.matrix import MatrixPlan, Selection, plan_cells, selection_axes
from harness.plan.platforms import engine_tier_refusal
from harness.verdicts.results import CellResult, Results


class Status(enum.Enum):
    """What one cell of the watch says."""

    COMPATIBLE = "compatible"  # OK: the harness drove the release here and judged the streams
    FINDING = "finding"  # a finding about vLLM: reported apart, never a harness failure
    INCONCLUSIVE = "inconclusive"  # ran, but no verdict: AMBIGUOUS, FLAKY
    INCOMPATIBLE = "harness incompatible"  # the harness could not build, start or drive the release
    UNSUPPORTED = "not applicable"  # this platform (or, in the matrix, the release) does not run the cell


@dataclass(frozen=True)
class Probe:
    """One tier and door the smoke covers."""

    tier: str
    door: str

    @property
    def name(self) -> str:
        return "scheduler tier" if self.tier == "scheduler" else f"{self.tier} tier, {self.door} door"

    def cell(self, version: str) -> Cell:
        """The default cell of this tier and door as ``version`` runs it (at_release: its own model runner)."""
        return at_release(Cell(version=version, executor="mp", async_on=True, mode="keep", clear_cache=True,
                               scenario="pause", tier=self.tier, door=self.door))


PROBES = (Probe("scheduler", "engine"), Probe("engine", "engine"), Probe("engine", "server"))


@dataclass(frozen=True)
class WatchedCell:
    """One cell's result as the watch reads it."""

    cell: str  # its id
    outcome: str  # the outcome word (UNSUPPORTED for a cell the platform does not run)
    label: str  # the oracle's short label, LOSS(1)
    status: Status
    cause: str  # the result's reason (or summary): why it is what it is
    probe: str = ""  # smoke cells: the tier and door

    def to_dict(self) -> dict[str, str]:
        return {"cell": self.cell, "probe": self.probe, "outcome": self.outcome, "label": self.label,
                "status": self.status.value, "cause": self.cause}


def status_of(result: CellResult, planned: bool, smoke: bool) -> Status:
    """What ``result`` says; ``planned``: the plan said the platform runs the cell; ``smoke``: a smoke cell,
    which every supported release runs (a run-time UNSUPPORTED is then the harness's)."""
    outcome = result.outcome
    if not planned:
        return Status.UNSUPPORTED
    if outcome is Outcome.OK:
        return Status.COMPATIBLE
    if outcome.is_finding:
        return Status.FINDING
    if outcome in (Outcome.AMBIGUOUS, Outcome.FLAKY):
        return Status.INCONCLUSIVE
    if outcome is Outcome.UNSUPPORTED and not smoke:
        return Status.UNSUPPORTED
    return Status.INCOMPATIBLE


def smoke_plan(version: str, platform: str, wheels: str, n_gpus: int | None = None) -> MatrixPlan:
    """The smoke cells of ``version``: those the platform runs as engines, the others unsupported with why."""
    refusal = engine_tier_refusal(platform, wheels)
    cells = [p.cell(version) for p in PROBES if not (refusal and p.tier != "scheduler")]
    skipped = tuple((p.cell(version), refusal) for p in PROBES if refusal and p.tier != "scheduler")
    plan = plan_cells(cells, platform, n_gpus)
    return MatrixPlan(plan.engines, plan.unsupported + skipped)


def default_plan(version: str, platform: str, wheels: str, n_gpus: int | None = None) -> MatrixPlan:
    """The default matrix of ``version`` (``vllm-repro matrix --versions VERSION`` with no axis option); the
    scheduler tier where the engine tier cannot run (a CUDA build on the cpu platform)."""
    axes = selection_axes({}, platform)
    if engine_tier_refusal(platform, wheels):
        axes["tiers"] = ("scheduler",)
    return plan_cells(Selection(versions=(version,), **axes).cells(), platform, n_gpus)


def smoke_cells(version: str, plan: MatrixPlan, results: Results) -> tuple[WatchedCell, ...]:
    """The smoke of ``version`` as the watch reads it, one cell per probe."""
    return read_cells(plan, results, tuple((p.cell(version), p.name) for p in PROBES), smoke=True)


def matrix_cells(plan: MatrixPlan, results: Results) -> tuple[WatchedCell, ...]:
    """The default matrix as the watch reads it, in report order."""
    return read_cells(plan, results, tuple((c, "") for c in sorted(plan.cells, key=lambda c: c.sort_key)),
                      smoke=False)


def read_cells(plan: MatrixPlan, results: Results, cells: tuple[tuple[Cell, str], ...],
               smoke: bool) -> tuple[WatchedCell, ...]:
    """``cells`` (each with its probe name) as the watch reads their results; a cell with no result is the
    harness's failure."""
    by_id: Mapping[str, CellResult] = {r.id: r for r in results.cells}
    unsupported = {c.id: why for c, why in plan.unsupported}
    out = []
    for cell, probe in cells:
        res = by_id.get(cell.id)
        if res is None:
            out.append(WatchedCell(cell.id, "", "", Status.INCOMPATIBLE, "the run recorded no result for this cell",
                                   probe))
            continue
        status = status_of(res, cell.id not in unsupported, smoke)
        cause = unsupported.get(cell.id) or res.reason or res.summary
        out.append(WatchedCell(cell.id, res.outcome.value, res.label, status, cause, probe))
    return tuple(out)
