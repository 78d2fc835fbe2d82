"""Per-commit vLLM wheels as bisect candidates.

vLLM publishes a wheel for every main commit under an index per commit and
variant (``https://wheels.vllm.ai/<commit>/<variant>``, variants such as
``cpu`` or ``cu130``; only uv can use those indexes).  A commit list comes
from a file (``SHA [ISO-DATE]`` per line, oldest first) or from a local vLLM
checkout (``git rev-list``); each commit becomes an env recipe that installs
the package from its own index, resolving the other dependencies as of the
commit date + 7 days when the date is known.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from harness.core.errors import BadInput
from harness.envbuild.index import IndexConfig, as_of_after
from harness.envbuild.recipe import EnvRecipe, RecipeFor

DEFAULT_WHEEL_INDEX = "https://wheels.vllm.ai/{commit}/{variant}"
_SHA = re.compile(r"^[0-9a-fA-F]{7,40}$")


@dataclass(frozen=True)
class Commit:
    sha: str
    date: datetime | None = None


def parse_commit_file(path: Path) -> list[Commit]:
    """``SHA [ISO-DATE]`` per line, oldest first; ``#`` starts a comment."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadInput(f"cannot read commit list {path}: {exc.strerror}") from exc
    out: list[Commit] = []
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        sha, *rest = line.split()
        if not _SHA.match(sha):
            raise BadInput(f"{path}:{n}: {sha!r} is not a commit hash (7-40 hex digits)")
        date = None
        if rest:
            try:
                date = datetime.fromisoformat(rest[0].replace("Z", "+00:00"))
            except ValueError as exc:
                raise BadInput(f"{path}:{n}: bad date {rest[0]!r}; use ISO 8601 such as 2026-05-15") from exc
        out.append(Commit(sha, date))
    if len(out) < 2:
        raise BadInput(f"{path}: a bisect needs at least two commits, found {len(out)}")
    return out


def commits_from_repo(repo: Path, span: str) -> list[Commit]:
    """``A..B`` in a local vLLM checkout: A, then every first-parent commit after it up to B, oldest first."""
    start, sep, end = span.partition("..")
    if not sep or not start or not end:
        raise BadInput(f"bad --commits {span!r}; give OLD..NEW, e.g. 1a2b3c4..5d6e7f8")

    def git(*args: str) -> str:
        try:
            proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
        except OSError as exc:
            raise BadInput(f"cannot run git in {repo}: {exc.strerror}") from exc
        if proc.returncode:
            reason = " ".join(proc.stderr.strip().splitlines()[:2]) or f"exit code {proc.returncode}"
            raise BadInput(f"git {' '.join(args)} failed in {repo}: {reason}")
        return proc.stdout

    fmt = "--format=%H %cI"
    first = git("log", "-1", fmt, start).split()
    rest = git("rev-list", "--reverse", "--first-parent", fmt, f"{start}..{end}").splitlines()
    commits = [Commit(first[0], datetime.fromisoformat(first[1]))]
    for line in rest:
        if line.startswith("commit "):  # rev-list prints a header line per commit with --format
            continue
        sha, date = line.split()
        commits.append(Commit(sha, datetime.fromisoformat(date)))
    if len(commits) < 2:
        raise BadInput(f"--commits {span}: no commits after {start} on the first-parent path to {end}")
    return commits


def commit_recipe(
    commit: Commit, label: str, template: str, variant: str, package: str, platform: str, python: str,
    base: IndexConfig, cpu_torch: bool = False,
) -> EnvRecipe:
    """The env recipe that installs ``package`` from the commit's own wheel index (``cpu_torch``: a CUDA build
    onto a CPU torch, for the scheduler tier on a CPU-only machine; see ``harness.envbuild.cputorch``)."""
    try:
        url = template.format(commit=commit.sha, variant=variant)
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise BadInput(f"bad --wheel-index {template!r}: use the fields {{commit}} and {{variant}}") from exc
    as_of = base.resolve_as_of
    if as_of == "release":
        # The commit date stands in for a release's upload date (none known: today's dependencies).
        as_of = "none" if commit.date is None else as_of_after(commit.date)
    index = replace(base, extra_index_urls=(url, *base.extra_index_urls), resolve_as_of=as_of)
    return EnvRecipe(package, label, platform, python, index, requirement=package, cpu_torch=cpu_torch)


def commit_recipes(
    commits: list[Commit], template: str, variant: str, package: str, platform: str, python: str,
    base: IndexConfig, cpu_torch: bool = False,
) -> RecipeFor:
    """Label (see ``labels``) -> the recipe of that commit's wheel: the ``recipe_for`` of a commit bisect."""
    by_label = dict(zip(labels(commits), commits, strict=True))
    return lambda label: commit_recipe(by_label[label], label, template, variant, package, platform, python, base,
                                       cpu_torch)


def labels(commits: list[Commit]) -> list[str]:
    """Short, unique labels for cell ids (12 hex digits, longer if needed)."""
    for n in (12, 16, 40):
        out = [c.sha[:n] for c in commits]
        if len(set(out)) == len(out):
            return out
    raise BadInput("duplicate commits in the list")
