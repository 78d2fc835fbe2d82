"""The folder of one finding: ``ISSUE.md`` (vLLM's bug-report form: "Your current environment", "🐛 Describe the
bug", "Before submitting a new issue..."; read from vllm-project/vllm ``.github/ISSUE_TEMPLATE/400-bug-report.yml``),
the reproducer ``test_<finding>.py``, ``check.json`` and each probed release's pytest output under ``check/``.

Written into a temporary folder beside the target and renamed into place at the end: a failure leaves nothing
half-written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.core.errors import BadInput
from harness.upstream.check import CheckResult, Run
from harness.upstream.findings import Finding


@dataclass(frozen=True)
class Environment:
    """Where the finding was measured and where the reproducer ran."""

    collect_env: str  # `python -m vllm.collect_env` in the bare env of the release inside the window ("" if none)
    cell_env: str  # the project's env the cells ran in: name, vllm and torch versions ("" if not cached here)
    freeze: str  # `uv pip freeze` of that bare env


def _fence(text: str, lang: str = "text") -> str:
    return f"```{lang}\n{text.rstrip()}\n```"


def _env_section(env: Environment) -> list[str]:
    shown = env.collect_env or "(collect_env was not run: no bare env of the release inside the window)"
    lines = ["### Your current environment", "", "<details>",
             "<summary>The output of <code>python collect_env.py</code></summary>", "", _fence(shown), "",
             "</details>", ""]
    if env.cell_env:
        lines += [f"Found by vllm-repro in {env.cell_env}; the reproducer below ran in a bare env holding only "
                  "that release, its dependencies and pytest (`environment.txt`: its `pip freeze`).", ""]
    return lines


def _releases_table(check: CheckResult | None, finding: Finding) -> list[str]:
    if check is None:
        return ["The bare-env check was not run (`--no-check`): the releases below are the project's measurements "
                "only.", ""]
    rows = [(check.inside, "inside the window"), *((v, f"before {finding.first_bad}") for v in check.before),
            *([(check.fixed, "first fixed")] if check.fixed else [])]
    lines = ["| release | role | result |", "| --- | --- | --- |"]
    for v, role in rows:
        lines.append(f"| {finding.package} {v.version} | {role} | **{v.status}**: {v.detail[:300]} |")
    return [*lines, "", f"Lower edge: {check.edge}.", ""]


def _failure_output(check: CheckResult | None) -> list[str]:
    if check is None or not check.runs or not check.runs[0].tests:
        return []
    failed = [t for t in check.runs[0].tests if t.outcome == "failed"]
    if not failed:
        return []
    run = check.runs[0]
    return [f"On {run.version} (`pytest -q`, {run.wall_s:.0f} s):", "",
            _fence("\n".join(f"FAILED {t.name}: {t.message}" for t in failed)), ""]


def _window(finding: Finding) -> str:
    bug = finding.bug
    fixed = f"fixed in {finding.fixed_in}" if finding.fixed_in else "still open on the newest release measured"
    return (f"Window recorded by the project (known-bug row \"{bug.id}\"): `{bug.affected}`, first bad "
            f"{finding.first_bad or 'not bisected'}, {fixed}" + (f" ({bug.note})" if bug.note else "") + ".")


def issue_body(finding: Finding, env: Environment, check: CheckResult | None) -> str:
    """The issue body, in vLLM's bug-report form."""
    lines = [f"<!-- title: {finding.title} -->", f"# {finding.title}", ""]
    if finding.duplicate is not None:
        d = finding.duplicate
        lines += [f"> **Possible duplicate: {d.ref}** ({d.status}). {d.note}", ""]
    lines += _env_section(env)
    lines += ["### 🐛 Describe the bug", "", "**What happens.**", finding.happens, "", "**What was expected.**",
              finding.expected, "", f"**Reproducer** (`{finding.test_file}`, imports only vllm and pytest; CPU is "
              f"enough): `pytest -q {finding.test_file}`", "", _fence(finding.reproducer_text(), "python"), ""]
    lines += _failure_output(check)
    lines += ["**Releases.**", _window(finding), f"Measured: {finding.measured}.", ""]
    lines += _releases_table(check, finding)
    lines += ["**Suspected change.**", finding.suspected, ""]
    lines += ["### Searched before filing", "", "vLLM's issues and pull requests (the issue index of the `search` "
              "tool), before this report was written:", ""]
    lines += [f"- `{s.query}`: {s.found}" for s in finding.searched]
    lines += ["", "### Before submitting a new issue...", "",
              "- [x] Searched for relevant issues (the queries above); the documentation chatbot was not asked.", ""]
    return "\n".join(lines)


def _run_record(run: Run) -> dict[str, object]:
    return {k: v for k, v in asdict(run).items() if k != "output"}


def write_report(out: Path, finding: Finding, env: Environment, check: CheckResult | None) -> Path:
    """Write the finding's folder ``out/<name>`` (replacing an older one) and return it."""
    target = out / finding.name
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{finding.name}-", dir=out))
    except OSError as exc:
        raise BadInput(f"cannot write under {out}: {exc.strerror or exc}") from None
    try:
        (tmp / "ISSUE.md").write_text(issue_body(finding, env, check), encoding="utf-8")
        (tmp / finding.test_file).write_text(finding.reproducer_text(), encoding="utf-8")
        if env.freeze:
            (tmp / "environment.txt").write_text(env.freeze, encoding="utf-8")
        if check is not None:
            record = {"finding": finding.name, "ok": check.ok, "edge": check.edge,
                      "inside": asdict(check.inside), "before": [asdict(v) for v in check.before],
                      "fixed": asdict(check.fixed) if check.fixed else None,
                      "runs": [_run_record(r) for r in check.runs]}
            (tmp / "check.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            (tmp / "check").mkdir()
            for run in check.runs:
                (tmp / "check" / f"{finding.package}-{run.version}.txt").write_text(
                    run.output or run.error or "(no output)", encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
