"""Tests of harness.bisect.framework and ``frameworks bisect``: the framework's release verdict as a bisect predicate.

The backend is a fake ``harness.run.context.Backend`` answering each cell from a table (version, scenario) ->
outcome; nothing starts an engine or builds an environment.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.bisect.framework import FRAMEWORK_BISECT_SCHEMA, FrameworkBisect, run_framework_bisect
from harness.bisect.search import ProbeRecord
from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.oracle import Outcome
from harness.envbuild.envs import IndexConfig
from harness.frontends.cli import main
from harness.run.context import BackendReport, CellSink, EngineWork, RunContext
from harness.run.spec import RunConfig
from harness.verdicts.frameworks import Recipe, load_recipes
from harness.verdicts.results import CellResult, ResultsLog, infra_result

pytestmark = pytest.mark.unit

VERSIONS = ["0.17.0", "0.18.0", "0.19.0", "0.20.0", "0.21.0", "0.22.0", "0.23.0", "0.25.1"]


def by(name: str) -> Recipe:
    return next(r for r in load_recipes() if r.name == name)


class TableBackend:
    """Every cell's outcome from ``table[(version, scenario)]`` (default ``default``); remembers what ran."""

    def __init__(self, table: dict[tuple[str, str], Outcome], default: Outcome = Outcome.OK) -> None:
        self.table, self.default = table, default
        self.runs: list[list[Cell]] = []

    def run(self, engines: Sequence[EngineWork], ctx: RunContext, record: CellSink) -> BackendReport:
        cells = [c for _, group in engines for c in group]
        self.runs.append(cells)
        for cell in cells:
            outcome = self.table.get((cell.version, cell.scenario), self.default)
            record(infra_result(cell, outcome, f"why {cell.id}") if outcome.is_infra
                   else CellResult(cell, outcome, f"{outcome.value} at {cell.version}"))
        return BackendReport({}, len(engines))


def _run(tmp_path: Path, recipe: Recipe, backend: TableBackend, find: str = "fix",
         versions: list[str] = VERSIONS) -> tuple[FrameworkBisect, list[ProbeRecord]]:
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "work", model_cache=tmp_path / "models")
    ctx = RunContext(cfg, IndexConfig(), tmp_path / "cache", ResultsLog(tmp_path / "results.jsonl"))
    seen: list[ProbeRecord] = []
    return run_framework_bisect(recipe, versions, find, ctx, on_probe=seen.append, backend=backend), seen


def test_trl_bisect_finds_the_first_safe_release_from_its_sequence(tmp_path: Path) -> None:
    trl = by("trl")
    # weight-sync loses a token up to 0.21.0; the control cell (pause) is OK everywhere: one fault is UNSAFE.
    table = {(v, "weight-sync"): Outcome.LOSS for v in VERSIONS[:5]}
    backend = TableBackend(table)
    run, seen = _run(tmp_path, trl, backend)
    assert run.error is None and run.result is not None
    assert (run.result.last_old, run.result.first_new) == ("0.21.0", "0.22.0")
    # Each probe ran the sequence's cells only, on the framework's own door: no stand-in, no workaround pair.
    for cells in backend.runs:
        assert {c.door for c in cells} == {"server"}
        assert sorted(c.scenario for c in cells) == ["pause", "weight-sync"]
        assert len({c.version for c in cells}) == 1
    d = run.to_dict()
    json.dumps(d)
    assert d["schema"] == FRAMEWORK_BISECT_SCHEMA and d["framework"] == "trl" and d["door"] == "server"
    assert (d["last_old"], d["first_new"]) == ("0.21.0", "0.22.0")
    bad = next(p for p in d["probes"] if p["candidate"] == "0.21.0")
    assert bad["verdict"] == "BAD" and bad["safety"] == "UNSAFE"
    assert "weight_sync-keep-clear[server] LOSS" in bad["detail"] and " keep-clear[server] OK" in bad["detail"]
    assert {c["cell"]["scenario"] for c in bad["cells"]} == {"pause", "weight-sync"}
    assert [p["candidate"] for p in d["probes"]] == [r.candidate for r in seen]


def test_an_unknown_release_is_stepped_around(tmp_path: Path) -> None:
    # 0.21.0's control cell could not run: UNKNOWN is SKIP, and the boundary it hides is reported as ambiguous.
    table = {(v, "weight-sync"): Outcome.LOSS for v in VERSIONS[:5]}
    table[("0.21.0", "pause")] = Outcome.ERROR
    run, _ = _run(tmp_path, by("trl"), TableBackend(table))
    assert run.result is not None
    skipped = [p for p in run.to_dict()["probes"] if p["verdict"] == "SKIP"]
    # A finding outweighs an unknown cell: 0.21.0 stays UNSAFE although its control errored.
    assert skipped == []
    assert run.result.first_new == "0.22.0"
    table = {(v, "weight-sync"): Outcome.LOSS for v in VERSIONS[:4]}
    table[("0.21.0", "weight-sync")] = Outcome.UNSUPPORTED
    run, _ = _run(tmp_path, by("trl"), TableBackend(table))
    assert (run.result.last_old, run.result.first_new) == ("0.20.0", "0.22.0")
    assert run.result.ambiguous == ("0.21.0",)


def test_safe_at_both_ends_is_refused_with_both_verdicts(tmp_path: Path) -> None:
    run, seen = _run(tmp_path, by("pipelinerl"), TableBackend({}))
    assert run.result is None
    assert run.error is not None
    assert "0.17.0 is GOOD (SAFE" in run.error and "0.25.1 is GOOD (SAFE" in run.error
    assert [r.candidate for r in seen] == ["0.17.0", "0.25.1"]


def test_regression_mode(tmp_path: Path) -> None:
    table = {(v, "weight-sync"): Outcome.DUPLICATE for v in VERSIONS[3:]}
    run, _ = _run(tmp_path, by("openrlhf"), TableBackend(table), find="regression")
    assert (run.result.last_old, run.result.first_new) == ("0.19.0", "0.20.0")


@pytest.mark.parametrize(("extra", "says"), [
    (["--framework", "trl,skyrl", "--versions", "0.21.0..0.22.0"], "exactly one --framework NAME; valid choices: trl"),
    (["--versions", "0.21.0..0.22.0"], "exactly one --framework NAME; valid choices: trl"),
    (["--framework", "nope", "--versions", "0.21.0..0.22.0"], "unknown framework 'nope'; valid choices: trl"),
    (["--framework", "trl"], "needs --versions, e.g. 0.22.0..0.31.0 (trl pins vllm >=0.22.0,<=0.31.0)"),
    (["--framework", "trl", "--versions", "0.21.0..0.22.0", "--find", "both"], "valid choices: fix, regression"),
    (["--framework", "trl", "--versions", "0.21.0..0.22.0", "--wheelhouse", "MISSING"], "does not exist"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, extra: list[str], says: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    argv = ["frameworks", "bisect", "--platform", "cpu", "--reports", str(reports), *extra]
    assert main([a.replace("MISSING", str(tmp_path / "none")) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not reports.exists()


# --------------------------------------------------------------------------- the windows recipes carry


REPO = Path(__file__).resolve().parents[2]


def _evidence(path: str) -> dict[str, object]:
    import lzma

    raw = (REPO / path).read_bytes()
    return json.loads(lzma.decompress(raw) if path.endswith(".xz") else raw)


def test_every_shipped_window_is_the_answer_of_its_committed_bisect() -> None:
    # A window is never typed in: each [[framework.bisect]] says what its committed probe log found.
    for recipe in load_recipes():
        for b in recipe.bisects:
            doc = _evidence(b.evidence)
            assert doc["schema"] == FRAMEWORK_BISECT_SCHEMA and doc["framework"] == recipe.name, b.evidence
            assert doc["find"] == b.find, b.evidence
            old, new = b.range.split("..")
            candidates = doc["candidates"]
            assert isinstance(candidates, list) and candidates[0] == old, b.evidence
            assert new in ("latest", candidates[-1]), b.evidence
            argv = " ".join(map(str, doc["argv"]))
            # A CUDA bisect says so on its command line; a CPU one ran on the default (this CPU-only machine's).
            assert ("--platform cuda" in argv) == (b.platform == "cuda"), b.evidence
            if b.refused:
                assert doc["error"] and doc["first_new"] is None, b.evidence
            else:
                assert (doc["last_old"], doc["first_new"]) == (b.last_old, b.first_new), b.evidence


def _recipe_file(tmp_path: Path, bisect: str) -> Path:
    text = (REPO / "harness/verdicts/frameworks.toml").read_text("utf-8")
    head, sep, rest = text.partition('[[framework]]\nname = "skyrl"')
    assert sep
    path = tmp_path / "frameworks.toml"
    path.write_text(head + bisect + "\n" + sep + rest, "utf-8")
    return path


def test_a_window_renders_and_a_half_window_is_refused(tmp_path: Path) -> None:
    entry = ('[[framework.bisect]]\nfind = "fix"\nrange = "0.17.0..0.25.1"\nplatform = "cpu"\nlast_old = "0.21.0"\n'
             'first_new = "0.22.0"\nevidence = "docs/x.json"\n')
    (trl,) = (r for r in load_recipes(_recipe_file(tmp_path, entry)) if r.name == "trl")
    assert trl.bisects[-1].text == \
        "first safe release 0.22.0 (last unsafe 0.21.0), bisected over 0.17.0..0.25.1 on cpu"
    refused = entry.replace('last_old = "0.21.0"\nfirst_new = "0.22.0"\n', 'refused = "SAFE at both ends"\n')
    (trl,) = (r for r in load_recipes(_recipe_file(tmp_path, refused)) if r.name == "trl")
    assert trl.bisects[-1].text == "no boundary: SAFE at both ends (bisected over 0.17.0..0.25.1 on cpu)"
    for bad in (entry.replace('first_new = "0.22.0"\n', ""), entry.replace("evidence", "#"),
                entry.replace('range = "0.17.0..0.25.1"', 'range = "0.17.0"'),
                refused.replace("refused", 'last_old = "0.21.0"\nrefused')):
        with pytest.raises(BadInput) as exc:
            load_recipes(_recipe_file(tmp_path, bad))
        assert "\n" not in str(exc.value) and "bisect" in str(exc.value)
