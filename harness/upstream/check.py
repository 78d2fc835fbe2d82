"""Run a reproducer in a bare env and judge it: inside the window its bug tests must fail (and its controls
pass); on the releases before the window's first bad they must pass, or the feature they need must be absent
(skipped) while the controls pass.  A release that cannot be installed is reported as such, never as a pass.

``run_reproducer`` is the only part that starts a process; parsing and judging are pure (unit-tested with
fabricated JUnit files).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import BadInput
from harness.core.versions import release_key
from harness.envbuild.index_releases import Release
from harness.upstream.findings import CONTROL_PREFIX

PYTEST_TIMEOUT_S = 600
WALK_BACK = 4  # releases before the window probed at most, newest first, until one passes or lacks the feature

# Verdicts of one release.
REPRODUCED = "fails as expected"  # inside: every bug test failed, every control passed
NOT_REPRODUCED = "DID NOT REPRODUCE"  # inside: a bug test passed
GOOD = "passes"  # before: every test passed
ALSO_BAD = "fails too"  # before: a bug test failed: the window opens earlier than the row says
ABSENT = "feature absent"  # before: the bug tests skipped (the release lacks what they need), controls passed
NOT_INSTALLED = "could not be installed"
INCONCLUSIVE = "inconclusive"  # an error, a failed control, no tests


@dataclass(frozen=True)
class TestResult:
    name: str
    outcome: str  # "passed", "failed", "skipped", "error"
    message: str = ""

    @property
    def control(self) -> bool:
        return self.name.startswith(CONTROL_PREFIX)


@dataclass(frozen=True)
class Run:
    """One release's run of the reproducer."""

    version: str
    installed: bool
    error: str = ""  # why it was not installed, or why pytest gave no results
    vllm_version: str = ""  # what the bare env imports
    tests: tuple[TestResult, ...] = ()
    wall_s: float = 0.0
    output: str = ""  # pytest's output (the report keeps it)


@dataclass(frozen=True)
class Verdict:
    version: str
    status: str
    detail: str


@dataclass(frozen=True)
class CheckResult:
    inside: Verdict
    before: tuple[Verdict, ...]  # newest first, as probed
    edge: str  # one sentence on the window's lower edge
    ok: bool  # the reproducer fails inside, passes (or lacks the feature, controls passing) before, passes where fixed
    runs: tuple[Run, ...] = field(default=())
    fixed: Verdict | None = None  # the row's first fixed release, when it has one


def parse_junit(text: str) -> tuple[TestResult, ...]:
    """The test cases of a pytest ``--junitxml`` file."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise BadInput(f"unreadable JUnit XML: {exc}") from None
    out = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message") or "").strip()
                break
        out.append(TestResult(case.get("name", "?"), outcome, message))
    return tuple(out)


def _summary(tests: tuple[TestResult, ...]) -> str:
    """``bug tests: 2 FAILED (first message); controls: 2 PASSED``: per kind, the count of each outcome (every test's
    own result is in the run's record)."""
    parts = []
    for kind, group in (("bug tests", [t for t in tests if not t.control]),
                        ("controls", [t for t in tests if t.control])):
        counts = []
        for outcome in ("failed", "error", "skipped", "passed"):
            hit = [t for t in group if t.outcome == outcome]
            if hit:
                why = " ".join(next((t.message for t in hit if t.message), "").split())  # one line: a table cell
                counts.append(f"{len(hit)} {outcome.upper()}" + (f" ({why[:110]}…)" if len(why) > 110 else
                                                                  f" ({why})" if why else ""))
        if counts:
            parts.append(f"{kind}: {', '.join(counts)}")
    return "; ".join(parts)


def judge_inside(run: Run) -> Verdict:
    if not run.installed:
        return Verdict(run.version, NOT_INSTALLED, run.error)
    bug = [t for t in run.tests if not t.control]
    controls = [t for t in run.tests if t.control]
    if not bug or any(t.outcome in ("error", "skipped") for t in run.tests):
        return Verdict(run.version, INCONCLUSIVE, run.error or _summary(run.tests) or "no tests ran")
    if any(t.outcome == "passed" for t in bug):
        return Verdict(run.version, NOT_REPRODUCED, _summary(run.tests))
    if any(t.outcome != "passed" for t in controls):
        return Verdict(run.version, INCONCLUSIVE, "a control failed: " + _summary(run.tests))
    return Verdict(run.version, REPRODUCED, _summary(run.tests))


def judge_before(run: Run) -> Verdict:
    if not run.installed:
        return Verdict(run.version, NOT_INSTALLED, run.error)
    bug = [t for t in run.tests if not t.control]
    controls = [t for t in run.tests if t.control]
    if not bug or not controls or any(t.outcome == "error" for t in run.tests) \
            or any(t.outcome != "passed" for t in controls):
        return Verdict(run.version, INCONCLUSIVE, run.error or _summary(run.tests) or "no tests ran")
    if any(t.outcome == "failed" for t in bug):
        return Verdict(run.version, ALSO_BAD, _summary(run.tests))
    if all(t.outcome == "skipped" for t in bug):
        return Verdict(run.version, ABSENT, _summary(run.tests))
    if all(t.outcome == "passed" for t in bug):
        return Verdict(run.version, GOOD, _summary(run.tests))
    return Verdict(run.version, INCONCLUSIVE, _summary(run.tests))


def releases_before(first_bad: str, releases: list[Release], limit: int = WALK_BACK) -> list[str]:
    """The final releases before ``first_bad`` (none yanked), newest first, at most ``limit``."""
    older = sorted({r.version for r in releases if not r.yanked and release_key(r.version) < release_key(first_bad)
                    and "rc" not in r.version and "dev" not in r.version}, key=release_key, reverse=True)
    return older[:limit]


def edge_sentence(first_bad: str | None, before: tuple[Verdict, ...], feature: str) -> tuple[str, bool]:
    """What the probes before the window say about its lower edge, and whether that supports the window."""
    if first_bad is None:
        return "the known-bug row gives no first bad release; nothing before the window was probed", False
    if not before:
        return f"no release of the package precedes {first_bad}: no last good release to check", False
    last = before[-1]
    bad = [v.version for v in before if v.status == ALSO_BAD]
    earlier = (f"; {', '.join(bad)} fail{'s' if len(bad) == 1 else ''} too, so the window opens before {first_bad}, "
               f"at {bad[-1]}" if bad else "")
    if last.status == GOOD:
        return f"last good release {last.version}: the reproducer passes{earlier}", True
    if last.status == ABSENT:
        return (f"no last good release: {last.version} lacks {feature} (the bug tests skip) and its control "
                f"passes{earlier}", True)
    if last.status == ALSO_BAD:
        return (f"every release probed before {first_bad} fails too ({', '.join(bad)}): the window opens earlier "
                "than probed", False)
    return f"last good release unknown: {last.version} {last.status} ({last.detail[:200]}){earlier}", False


Runner = Callable[[str], Run]  # version -> its run


def check(inside: str, first_bad: str | None, candidates: list[str], run: Runner, feature: str,
          fixed_in: str | None = None) -> CheckResult:
    """Run inside the window, then walk back through ``candidates`` (newest first) until one passes, lacks the
    feature, or cannot say (not installed, inconclusive); then, for a fixed bug, its first fixed release, which
    must pass."""
    runs = [run(inside)]
    inside_v = judge_inside(runs[0])
    before: list[Verdict] = []
    for version in candidates:
        runs.append(run(version))
        before.append(judge_before(runs[-1]))
        if before[-1].status != ALSO_BAD:
            break
    edge, edge_ok = edge_sentence(first_bad, tuple(before), feature)
    fixed = None
    if fixed_in is not None:
        runs.append(run(fixed_in))
        fixed = judge_before(runs[-1])  # the same judgement: every test passes
    fixed_ok = fixed is None or fixed.status == GOOD
    return CheckResult(inside_v, tuple(before), edge, inside_v.status == REPRODUCED and edge_ok and fixed_ok,
                       tuple(runs), fixed)


def run_reproducer(python: Path, version: str, vllm_version: str, test_file: str, text: str,
                   timeout: float = PYTEST_TIMEOUT_S) -> Run:
    """``python -m pytest`` on the reproducer in a fresh folder, with no PYTHONPATH (nothing of this project's can be
    imported), JUnit results parsed."""
    work = Path(tempfile.mkdtemp(prefix="upstream-report-"))
    try:
        (work / test_file).write_text(text, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        t0 = time.monotonic()
        try:
            proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                                   "--junitxml=junit.xml", test_file], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=timeout)
            output = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            return Run(version, True, f"pytest ran past {timeout:.0f} s", vllm_version,
                       wall_s=round(time.monotonic() - t0, 1))
        wall = round(time.monotonic() - t0, 1)
        junit = work / "junit.xml"
        if not junit.exists():
            return Run(version, True, f"pytest wrote no results (exit {proc.returncode})", vllm_version,
                       wall_s=wall, output=output)
        return Run(version, True, "", vllm_version, parse_junit(junit.read_text(encoding="utf-8")), wall, output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
