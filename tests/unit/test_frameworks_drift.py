"""Tests of ``vllm-repro frameworks drift`` (harness.verdicts.drift, harness.verdicts.drift_fetch): cited lines
found, moved or gone in a fake source tree; releases through a fake downloader (never the network)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from harness.core.errors import BadInput
from harness.frontends.cli import main
from harness.verdicts.drift import CHANGED, MOVED, OK, UNQUOTED, check_recipe, parse_at
from harness.verdicts.drift_fetch import FetchFailed, check_drift, release_tree
from harness.verdicts.frameworks import Recipe, load_recipes

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here reaches the index: the real downloader fails loudly if one tries."""
    def refuse(package: str, dest: Path) -> Path:
        raise AssertionError(f"a unit test tried to download {package}")
    monkeypatch.setattr("harness.verdicts.drift_fetch.pip_download", refuse)

RECIPE = '''[[framework]]
name = "x"
title = "X"
repo = "o/x"
package = "xpkg"
commit = "0123456789abcdef0123456789abcdef01234567"
pin = ">=0.20.0"
door = "engine"
[[framework.call]]
call = "pause"
at = "x/client.py:3"
quote = "llm.pause_generation(mode=\\"keep\\")"
[[framework.call]]
call = "resume"
at = "x/client.py:5-6"
quote = "llm.resume_generation()"
[[framework.cell]]
scenario = "pause"
mode = "keep"
clear_cache = true
match = "same"
why = "because"
'''
SOURCE = ["import llm", "def cycle():", '    llm.pause_generation(mode="keep")', "    swap()",
          "    # resume", "    llm.resume_generation()"]


def _recipes(tmp_path: Path) -> Path:
    p = tmp_path / "recipes.toml"
    p.write_text(RECIPE)
    return p


def _tree(root: Path, lines: list[str]) -> Path:
    (root / "x").mkdir(parents=True, exist_ok=True)
    (root / "x" / "client.py").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize(("at", "path", "lines", "is_range"), [
    ("a/b.py:80", "a/b.py", (80,), False), ("a.py:1113-1141", "a.py", (1113, 1141), True),
    ("a.py:234,250", "a.py", (234, 250), False), ("conf/base.yaml:66-67", "conf/base.yaml", (66, 67), True)])
def test_parse_at(at: str, path: str, lines: tuple[int, ...], is_range: bool) -> None:
    c = parse_at(at)
    assert (c.path, c.lines, c.is_range) == (path, lines, is_range)


def test_parse_at_refuses_a_citation_without_a_line() -> None:
    with pytest.raises(BadInput, match="not PATH:LINE"):
        parse_at("a/b.py")


def test_no_drift_when_every_quote_is_on_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = _tree(tmp_path / "src", SOURCE)
    assert main(["frameworks", "drift", "--recipes", str(_recipes(tmp_path)), "--framework", "x",
                 "--checkout", str(tree)]) == 0
    out = capsys.readouterr().out
    assert "x: no drift against checkout" in out and "2 OK" in out and out.strip().endswith("no drift")


def test_one_changed_cited_line_is_drift_with_the_nearest_line(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    changed = [*SOURCE[:2], '    llm.pause_generation(mode="abort")', *SOURCE[3:]]
    tree = _tree(tmp_path / "src", changed)
    assert main(["frameworks", "drift", "--recipes", str(_recipes(tmp_path)), "--framework", "x",
                 "--checkout", str(tree)]) == 1
    out = capsys.readouterr().out
    assert "CHANGED  x/client.py:3" in out and 'was: llm.pause_generation(mode="keep")' in out
    assert 'nearest line 3: llm.pause_generation(mode="abort")' in out and out.strip().endswith("drift in: x")


def test_a_moved_line_is_reported_with_its_new_line_and_is_no_drift(tmp_path: Path) -> None:
    (r,) = load_recipes(_recipes(tmp_path))
    d = check_recipe(r, _tree(tmp_path / "src", ["# new header", "", *SOURCE]), "test")
    assert [(c.status, c.line) for c in d.checks] == [(MOVED, 5), (MOVED, 8)] and not d.drift


def test_a_missing_file_is_drift_and_an_unquoted_call_is_not_compared(tmp_path: Path) -> None:
    (r,) = load_recipes(_recipes(tmp_path).with_name("recipes.toml"))
    d = check_recipe(r, tmp_path / "empty", "test")
    assert [c.status for c in d.checks] == [CHANGED, CHANGED] and "is not in the source" in d.checks[0].nearest
    text = RECIPE.replace('quote = "llm.resume_generation()"\n', "")
    (tmp_path / "unquoted.toml").write_text(text)
    (u,) = load_recipes(tmp_path / "unquoted.toml")
    d = check_recipe(u, _tree(tmp_path / "src", SOURCE), "test")
    assert [c.status for c in d.checks] == [OK, UNQUOTED] and not d.drift


def _quoted_tree(root: Path, recipe: Recipe) -> Path:
    files: dict[str, dict[int, str]] = {}
    for c in recipe.calls:
        cited = parse_at(c.at)
        files.setdefault(cited.path, {})[cited.first] = c.quote
    for path, by_line in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("\n".join(by_line.get(i, "") for i in range(1, max(by_line) + 1)) + "\n")
    return root


def test_the_shipped_recipes_quote_their_cited_lines_consistently(tmp_path: Path) -> None:
    """A tree holding each quote at its cited line shows no drift: the recipes' at and quote agree (and a
    recipe with a package quotes every call)."""
    for r in load_recipes():
        d = check_recipe(r, _quoted_tree(tmp_path / r.name, r), "fake")
        assert not d.drift, (r.name, d)
        assert not r.package or all(c.quote for c in r.calls), r.name
        assert bool(r.package) != bool(r.no_release), r.name


def _fake_download(calls: list[str], lib: str = "") -> object:
    def download(package: str, dest: Path) -> Path:
        calls.append(package)
        if package != "xpkg":
            raise FetchFailed(package, "ERROR: No matching distribution found for " + package)
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / "xpkg-2.0.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"{lib}x/client.py", "\n".join(SOURCE) + "\n")
            z.writestr("xpkg-2.0.0.dist-info/METADATA", "Name: xpkg\nRequires-Dist: vllm==0.30.0; extra == \"v\"\n")
        return wheel
    return download


def test_a_release_comes_through_the_downloader_and_is_unpacked_in_the_cache(tmp_path: Path) -> None:
    calls: list[str] = []
    tree = release_tree("xpkg", tmp_path / "cache", _fake_download(calls))  # type: ignore[arg-type]
    assert tree.version == "2.0.0" and tree.vllm_pins == ("==0.30.0",) and calls == ["xpkg"]
    assert tree.root.is_relative_to(tmp_path / "cache" / "drift") and (tree.root / "x" / "client.py").is_file()
    (r,) = load_recipes(_recipes(tmp_path))
    (d,) = check_drift([r], tmp_path / "cache", download=_fake_download(calls))  # type: ignore[arg-type]
    assert d.source.startswith("xpkg 2.0.0") and [c.status for c in d.checks] == [OK, OK]
    assert d.pin_drift and d.drift  # the recipe pins >=0.20.0, the release ==0.30.0
    assert not check_drift([Recipe(**{**r.__dict__, "pin": "==0.30.0"})], tmp_path / "cache",
                           download=_fake_download(calls))[0].drift  # type: ignore[arg-type]


def test_a_platform_wheels_purelib_is_where_the_paths_start(tmp_path: Path) -> None:
    lib = "xpkg-2.0.0.data/purelib/"
    tree = release_tree("xpkg", tmp_path / "cache", _fake_download([], lib))  # type: ignore[arg-type]
    assert (tree.root / "x" / "client.py").is_file()


def test_a_failed_download_or_no_package_skips_with_the_reason(tmp_path: Path) -> None:
    (r,) = load_recipes(_recipes(tmp_path))
    other = Recipe(**{**r.__dict__, "package": "nope"})
    bare = Recipe(**{**r.__dict__, "package": "", "no_release": "ships from its repository"})
    got = check_drift([other, bare], tmp_path / "cache", download=_fake_download([]))  # type: ignore[arg-type]
    assert [d.skipped for d in got] == ["download failed: ERROR: No matching distribution found for nope",
                                        "ships from its repository"]
    assert not any(d.drift for d in got)


@pytest.mark.parametrize(("extra", "says"), [
    (["--framework", "trl,nope"], "unknown framework 'nope'; valid choices: trl, skyrl"),
    (["--checkout", "TMP"], "name that framework with --framework"),
    (["--framework", "trl", "--checkout", "TMP/none"], "not a folder"),
])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, extra: list[str], says: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["frameworks", "drift", "--cache-dir", str(tmp_path / "cache"), *extra]
    assert main([a.replace("TMP", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "cache").exists()
