"""The release watch (harness.watch, ``vllm-repro releases watch``) with a fake index and a fake runner: the mark
it starts from, the releases it names, and a harness incompatibility told apart from a finding about vLLM."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome
from harness.envbuild.index_releases import Release
from harness.frontends.cli import main
from harness.plan.matrix import MatrixPlan
from harness.verdicts.history.store import add_run
from harness.verdicts.results import CellResult, Results, infra_result
from harness.watch.judged import Judged, judged_from, newer_releases, newest_judged
from harness.watch.smoke import PROBES, Status, smoke_plan, status_of
from harness.watch.watch import WatchSetup, watch

pytestmark = pytest.mark.unit

TAGS = ("manylinux_2_28_x86_64", "manylinux_2_28_aarch64")
SCHED = "scheduler tier"
BUILD_FAILED_WHY = "environment build failed: flashinfer-python==0.7.3 is not on the index"


def fake_index(*versions: str, yanked: tuple[str, ...] = ()) -> Callable[[str, str | None], list[Release]]:
    """A package index holding ``versions`` for every package (no network)."""
    def fetch(package: str, index_url: str | None) -> list[Release]:
        return [Release(v, TAGS, ">=3.10", v in yanked) for v in versions]
    return fetch


def history(tmp_path: Path, cells: list[tuple[str, Outcome]], inject: tuple[str, ...] = ()) -> Path:
    """A history file of one run holding one keep-pause cell per (version, outcome), added as `history add` does."""
    report = tmp_path / f"results-{len(list(tmp_path.glob('results-*')))}.json"
    res = Results(tuple(CellResult(Cell(v, "mp", True, "keep", True), o, o.value) for v, o in cells),
                  {"created": f"2026-12-0{len(cells)}T00:00:00+00:00", "platform": "cpu", "inject": list(inject)})
    report.write_text(json.dumps(res.to_dict()))
    path = tmp_path / "history.jsonl"
    add_run(path, report)
    return path


def fake_runner(outcome_for: Callable[[Cell], tuple[Outcome, str]], calls: list[tuple[str, int]] | None = None):  # type: ignore[no-untyped-def]
    """A RunPlan stand-in: every planned cell gets ``outcome_for(cell)``, the plan's unsupported cells their reason."""
    def run(plan: MatrixPlan, folder: Path) -> Results:
        if calls is not None:
            calls.append((folder.name, len(plan.cells)))
        cells = [infra_result(c, Outcome.UNSUPPORTED, why) for c, why in plan.unsupported]
        for _, cs in plan.engines:
            for c in cs:
                outcome, why = outcome_for(c)
                cells.append(CellResult(c, outcome, why or outcome.value, reason=why or None))
        return Results(tuple(cells))
    return run


def _setup(tmp_path: Path, smoke_only: bool = True, wheels: str = "cuda") -> WatchSetup:
    return WatchSetup("vllm", "cpu", wheels, tmp_path / "watch", smoke_only)


# ------------------------------------------------------------------------------------- the mark and the releases


def test_a_history_stopping_at_0_33_0_names_0_34_0(tmp_path: Path) -> None:
    hist = history(tmp_path, [("0.32.0", Outcome.OK), ("0.33.0", Outcome.LOSS)])
    judged = judged_from(hist, ())
    assert judged.version == "0.33.0" and str(hist) in judged.sources[0]
    newest, newer = newer_releases(judged.version, "vllm", None, fake_index("0.32.0", "0.33.0", "0.34.0"))
    assert (newest, newer) == ("0.34.0", ("0.34.0",))
    # Nothing newer: nothing to watch.
    assert newer_releases("0.34.0", "vllm", None, fake_index("0.33.0", "0.34.0")) == ("0.34.0", ())
    # Yanked and pre-releases are not watched (pre-releases with pre=True).
    index = fake_index("0.33.0", "0.34.0", "0.35.0rc1", "0.35.1", yanked=("0.35.1",))
    assert newer_releases("0.33.0", "vllm", None, index)[1] == ("0.34.0",)
    assert newer_releases("0.33.0", "vllm", None, index, pre=True)[1] == ("0.34.0", "0.35.0rc1")


@pytest.mark.parametrize(("cells", "expected"), [
    ([("0.33.0", "OK"), ("0.34.0", "ERROR")], "0.33.0"),  # a release whose cells all failed is not judged
    ([("0.33.0", "OK"), ("0.34.0", "BUILD-FAILED"), ("0.34.0", "UNSUPPORTED")], "0.33.0"),
    ([("0.33.0", "OK"), ("0.34.0", "LOSS")], "0.34.0"),  # a finding is a verdict
    ([("0.33.0", "OK"), ("0.34.0", "AMBIGUOUS")], "0.34.0"),
    ([("0.9.0", "OK"), ("0.33.0", "OK")], "0.33.0"),  # numeric order, not text
    ([("0.33.0", "OK"), ("123456789012", "OK"), ("0.34.1.dev3+gabc", "OK")], "0.33.0"),  # commit labels
    ([("0.33.0", "ERROR")], None),
])
def test_the_newest_judged_release_is_the_newest_with_a_verdict(cells: list[tuple[str, str]],
                                                               expected: str | None) -> None:
    assert newest_judged((v, o, False) for v, o in cells) == expected


def test_injected_runs_and_results_files_count_as_they_should(tmp_path: Path) -> None:
    hist = history(tmp_path, [("0.33.0", Outcome.OK)])
    history(tmp_path, [("0.34.0", Outcome.LOSS)], inject=("vllm#42043",))  # says nothing about upstream 0.34.0
    assert judged_from(hist, ()).version == "0.33.0"
    results = tmp_path / "new.json"
    results.write_text(json.dumps(Results((CellResult(Cell("0.34.0"), Outcome.OK, "OK"),)).to_dict()))
    assert judged_from(hist, (results,)).version == "0.34.0"


# ------------------------------------------------------------------------------------- the smoke and its reading


@pytest.mark.parametrize(("outcome", "planned", "smoke", "expected"), [
    (Outcome.OK, True, True, Status.COMPATIBLE),
    (Outcome.LOSS, True, True, Status.FINDING),
    (Outcome.CRASH, True, True, Status.FINDING),
    (Outcome.STALL, True, True, Status.FINDING),
    (Outcome.AMBIGUOUS, True, True, Status.INCONCLUSIVE),
    (Outcome.BUILD_FAILED, True, True, Status.INCOMPATIBLE),
    (Outcome.ERROR, True, True, Status.INCOMPATIBLE),
    (Outcome.TIMEOUT, True, True, Status.INCOMPATIBLE),
    (Outcome.UNSUPPORTED, True, True, Status.INCOMPATIBLE),  # refused at run time: a setting, the adapter
    (Outcome.UNSUPPORTED, False, True, Status.UNSUPPORTED),  # the platform's limit, known before the run
    (Outcome.UNSUPPORTED, True, False, Status.UNSUPPORTED),  # the matrix: a release's own limit may be legit
    (Outcome.ERROR, True, False, Status.INCOMPATIBLE),
])
def test_each_outcome_reads_by_its_fields(outcome: Outcome, planned: bool, smoke: bool, expected: Status) -> None:
    assert status_of(infra_result(Cell("0.34.0"), outcome, "why"), planned, smoke) is expected


def test_the_smoke_covers_every_tier_and_door_the_platform_runs() -> None:
    assert [p.name for p in PROBES] == [SCHED, "engine tier, engine door", "engine tier, server door"]
    cuda_on_cpu = smoke_plan("0.34.0", "cpu", "cuda")
    assert [c.tier for _, cs in cuda_on_cpu.engines for c in cs] == ["scheduler"]
    assert [c.door for c, why in cuda_on_cpu.unsupported if "scheduler tier only" in why] == ["engine", "server"]
    assert len(smoke_plan("0.32.0", "cpu", "cpu").engines) == 3 and not smoke_plan("0.32.0", "cpu", "cpu").unsupported


def test_a_harness_incompatibility_is_reported_apart_from_a_finding(tmp_path: Path) -> None:
    # 0.34.0: the env does not build (the harness's); 0.35.0: the scheduler tier loses a token (vLLM's).
    def outcome_for(cell: Cell) -> tuple[Outcome, str]:
        if cell.version == "0.34.0":
            return Outcome.BUILD_FAILED, BUILD_FAILED_WHY
        return Outcome.LOSS, "LOSS(1) in 8/8 requests"

    judged = Judged("0.33.0", ("h",))
    result = watch(_setup(tmp_path), judged, "0.35.0", ("0.34.0", "0.35.0"), fake_runner(outcome_for))
    broken, lossy = result.releases
    assert broken.status is Status.INCOMPATIBLE and not broken.findings
    assert [(c.probe, c.outcome, c.cause) for c in broken.incompatibilities] == [(SCHED, "BUILD-FAILED",
                                                                                  BUILD_FAILED_WHY)]
    assert lossy.status is Status.COMPATIBLE and not lossy.incompatibilities
    assert [(c.probe, c.label) for c in lossy.findings] == [(SCHED, "LOSS")]
    # The engine tier is not applicable with a CUDA build on the cpu platform: neither a failure nor a pass.
    assert {c.status for c in broken.smoke[1:]} == {Status.UNSUPPORTED}
    assert result.exit_code == 1 and result.incompatible == (broken,)
    # A finding alone does not fail the watch.
    only_finding = watch(_setup(tmp_path), judged, "0.35.0", ("0.35.0",), fake_runner(outcome_for))
    assert only_finding.exit_code == 0
    doc = result.to_dict()
    assert [r["status"] for r in doc["releases"]] == ["harness incompatible", "compatible"]
    assert doc["releases"][0]["incompatibilities"][0]["cause"] == BUILD_FAILED_WHY
    assert doc["releases"][1]["findings"][0]["outcome"] == "LOSS" and not doc["releases"][1]["incompatibilities"]


def test_the_default_matrix_runs_after_a_compatible_smoke_only(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []

    def outcome_for(cell: Cell) -> tuple[Outcome, str]:
        if cell.version == "0.34.0" and cell.scenario == "pause":
            return Outcome.OK, ""
        if cell.version == "0.34.0":  # another scenario of the matrix: the release's own limit, not the harness's
            return Outcome.UNSUPPORTED, "this release has no such API"
        return Outcome.ERROR, "AttributeError: 'SchedulerOutput' object has no attribute 'scheduled_resumed_reqs'"

    result = watch(_setup(tmp_path, smoke_only=False), Judged("0.33.0", ()), "0.35.0", ("0.34.0", "0.35.0"),
                   fake_runner(outcome_for, calls))
    assert [name for name, _ in calls] == ["smoke", "matrix", "smoke"]  # 0.35.0's smoke failed: no matrix
    ok, broken = result.releases
    assert ok.matrix is not None and ok.status is Status.COMPATIBLE
    assert {c.status for c in ok.matrix} == {Status.COMPATIBLE, Status.UNSUPPORTED}
    assert broken.matrix is None and "incompatible" in broken.matrix_note
    assert "scheduled_resumed_reqs" in broken.incompatibilities[0].cause


def test_a_matrix_infrastructure_failure_is_an_incompatibility(tmp_path: Path) -> None:
    def outcome_for(cell: Cell) -> tuple[Outcome, str]:
        return (Outcome.OK, "") if cell.scenario == "pause" else (Outcome.TIMEOUT, "engine outlived 900 s")

    (release,) = watch(_setup(tmp_path, smoke_only=False), Judged("0.33.0", ()), "0.34.0", ("0.34.0",),
                       fake_runner(outcome_for)).releases
    assert release.status is Status.INCOMPATIBLE
    assert release.incompatibilities and all(c.outcome == "TIMEOUT" for c in release.incompatibilities)


# ------------------------------------------------------------------------------------- the command


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[Cell], tuple[Outcome, str]]], None]:
    """The index holds 0.33.0 and 0.34.0; execute_plan judges each planned cell with the outcome given."""
    import harness.envbuild.index_releases
    import harness.run.execute

    monkeypatch.setattr(harness.envbuild.index_releases, "fetch_releases", fake_index("0.32.0", "0.33.0", "0.34.0"))

    def use(outcome_for: Callable[[Cell], tuple[Outcome, str]]) -> None:
        inner = fake_runner(outcome_for)

        def execute_plan(plan, ctx, backend=None):  # type: ignore[no-untyped-def]
            res = inner(plan, ctx.cfg.work_dir)
            for c in res.cells:
                ctx.log.append(c)
            return res

        monkeypatch.setattr(harness.run.execute, "execute_plan", execute_plan)

    return use


@pytest.mark.parametrize(("outcome", "why", "rc", "status"), [
    (Outcome.BUILD_FAILED, BUILD_FAILED_WHY, 1, "harness incompatible"),
    (Outcome.UNSUPPORTED, "ValueError: VLLM_USE_V2_MODEL_RUNNER=0 is not supported", 1, "harness incompatible"),
    (Outcome.LOSS, "", 0, "compatible"),
    (Outcome.OK, "", 0, "compatible"),
])
def test_releases_watch_names_0_34_0_and_its_status(outcome: Outcome, why: str, rc: int, status: str,
                                                    tmp_path: Path, offline, capsys) -> None:  # type: ignore[no-untyped-def]
    offline(lambda cell: (outcome, why))
    hist = history(tmp_path, [("0.32.0", Outcome.OK), ("0.33.0", Outcome.OK)])
    out = tmp_path / "reports"
    argv = ["releases", "watch", "--platform", "cpu", "--wheels", "cuda", "--history", str(hist), "--smoke-only",
            "--reports", str(out)]
    assert main(argv) == rc
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1].startswith(f"0.34.0 {status}")  # the summary line names it
    doc = json.loads((out / "watch.json").read_text())
    assert (doc["judged"]["version"], doc["newest"], doc["exit_code"]) == ("0.33.0", "0.34.0", rc)
    (release,) = doc["releases"]
    assert release["version"] == "0.34.0" and release["status"] == status
    assert [c["cause"] for c in release["incompatibilities"]] == ([why] if rc else [])
    assert len(release["findings"]) == (1 if outcome is Outcome.LOSS else 0)
    assert json.loads((out / "0.34.0" / "smoke" / "results.json").read_text())["cells"]
    md = (out / "watch.md").read_text()
    assert f"**0.34.0 {status} (" in md and ("### 0.34.0: harness incompatibilities" in md) is bool(rc)
    assert why in md


def test_nothing_newer_exits_0(tmp_path: Path, offline, capsys) -> None:  # type: ignore[no-untyped-def]
    offline(lambda cell: (Outcome.ERROR, "never run"))
    hist = history(tmp_path, [("0.34.0", Outcome.OK)])
    assert main(["releases", "watch", "--platform", "cpu", "--wheels", "cuda", "--history", str(hist),
                 "--reports", str(tmp_path / "r")]) == 0
    assert "nothing newer than 0.34.0" in capsys.readouterr().out
    assert json.loads((tmp_path / "r" / "watch.json").read_text())["releases"] == []


@pytest.mark.parametrize(("extra", "says"), [
    (["--wheels", "gpu"], "valid choices: cpu, cuda"),
    (["--platform", "tpu"], "valid choices: cpu, cuda"),
    (["--history", "{tmp}/missing.jsonl"], "does not exist"),
    (["--retry-infra", "-1"], "--retry-infra must be 0 or more"),
])
def test_bad_input_exits_2_and_writes_nothing(extra: list[str], says: str, tmp_path: Path, offline,  # type: ignore[no-untyped-def]
                                              capsys) -> None:
    offline(lambda cell: (Outcome.OK, ""))
    hist = history(tmp_path, [("0.33.0", Outcome.OK)])
    argv = ["releases", "watch", "--platform", "cpu", "--history", str(hist), "--reports", str(tmp_path / "r"),
            *[e.replace("{tmp}", str(tmp_path)) for e in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_history_with_no_verdict_is_bad_input(tmp_path: Path, offline, capsys) -> None:  # type: ignore[no-untyped-def]
    offline(lambda cell: (Outcome.OK, ""))
    hist = history(tmp_path, [("0.33.0", Outcome.BUILD_FAILED)])
    assert main(["releases", "watch", "--platform", "cpu", "--history", str(hist),
                 "--reports", str(tmp_path / "r")]) == 2
    assert "no release has a verdict" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_an_index_that_cannot_be_listed_is_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.envbuild.index_releases

    def unreachable(package: str, index_url: str | None) -> list[Release]:
        raise BadInput(f"cannot list versions of {package}")

    monkeypatch.setattr(harness.envbuild.index_releases, "fetch_releases", unreachable)
    hist = history(tmp_path, [("0.33.0", Outcome.OK)])
    assert main(["releases", "watch", "--platform", "cpu", "--history", str(hist),
                 "--reports", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()
