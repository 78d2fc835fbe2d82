"""The house's floors (issue 35 item 2): no package imports one beside or above it, as docs/architecture.md says.

The floors are read from the two tables of docs/architecture.md, so the picture in words and this check cannot
drift apart; every import counts, a lazy one inside a function too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (\d+) \| `(\w+)` \|")


def floors(doc: str) -> dict[str, dict[str, int]]:
    """``{tree: {package: floor}}`` from the tables under ``### `harness/``` and ``### `repro/```."""
    out: dict[str, dict[str, int]] = {}
    tree = ""
    for line in doc.splitlines():
        if line.startswith("### `"):
            tree = line.split("`")[1].rstrip("/")
            out[tree] = {}
        elif tree and (m := ROW.match(line)):
            out[tree][m.group(2)] = int(m.group(1))
    return out


def imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, absolute names, lazy imports included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def violations(root: Path, tree: str, floor_of: Mapping[str, int]) -> list[str]:
    """Every import of ``root/tree`` that climbs to a package on its own floor or higher, every package the
    table does not place, and every module loose beside the packages (``__init__.py`` aside)."""
    found = []
    for path in sorted((root / tree).rglob("*.py")):
        rel = path.relative_to(root / tree)
        if len(rel.parts) == 1:
            if rel.name != "__init__.py":
                found.append(f"{tree}/{rel}: a module loose beside the packages")
            continue
        pkg = rel.parts[0]
        if pkg not in floor_of:
            found.append(f"{tree}/{pkg}: a package the table does not place")
            continue
        for name in imports(path):
            parts = name.split(".")
            if parts[0] == "harness" and tree == "repro":
                found.append(f"{tree}/{rel} imports {name}: repro never imports the harness")
            if parts[0] != tree or len(parts) < 2 or parts[1] == pkg or parts[1] not in floor_of:
                continue
            if floor_of[parts[1]] >= floor_of[pkg]:
                found.append(f"{tree}/{rel} (floor {floor_of[pkg]}) imports {name} (floor {floor_of[parts[1]]})")
    return sorted(set(found))


TABLES = floors((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))


@pytest.mark.parametrize("tree", ["harness", "repro"])
def test_no_import_climbs_a_floor(tree: str) -> None:
    assert TABLES.get(tree), f"docs/architecture.md has no table for {tree}/"
    assert violations(ROOT, tree, TABLES[tree]) == []


@pytest.mark.parametrize("tree", ["harness", "repro"])
def test_every_package_in_the_table_exists(tree: str) -> None:
    assert sorted(p for p in TABLES[tree] if not (ROOT / tree / p / "__init__.py").is_file()) == []


def _house(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_an_import_up_a_floor_fails(tmp_path: Path) -> None:
    root = _house(tmp_path, {"h/__init__.py": "", "h/low/__init__.py": "", "h/high/__init__.py": "",
                             "h/low/a.py": "def f():\n    from h.high import b\n", "h/high/b.py": "import h.low.a\n"})
    assert violations(root, "h", {"low": 1, "high": 2}) == ["h/low/a.py (floor 1) imports h.high (floor 2)",
                                                           "h/low/a.py (floor 1) imports h.high.b (floor 2)"]


def test_an_import_beside_a_loose_module_and_an_unplaced_package_fail(tmp_path: Path) -> None:
    root = _house(tmp_path, {"h/__init__.py": "", "h/loose.py": "", "h/x/__init__.py": "", "h/y/__init__.py": "",
                             "h/x/a.py": "from h.y import b\n", "h/z/__init__.py": ""})
    assert violations(root, "h", {"x": 1, "y": 1}) == ["h/loose.py: a module loose beside the packages",
                                                       "h/x/a.py (floor 1) imports h.y (floor 1)",
                                                       "h/x/a.py (floor 1) imports h.y.b (floor 1)",
                                                       "h/z: a package the table does not place"]


# Module names used more than once, each for one concept seen from two places (issue 35: one name, one concept).
# A new duplicate must either get a name that says what it holds or a line here saying why it is the same thing.
SAME_CONCEPT = {
    "__main__.py": "a package's `python -m` entry (repro.engine, repro.sched)",
    "admission.py": "the max-seqs-admission scenario: harness oracle (sched/) and engine-side play (repro/sched/)",
    "inflight.py": "the inflight-add-abort scenario: harness oracle and engine-side play",
    "reset_connector.py": "the reset-connector scenario: harness oracle and engine-side play",
    "kv_loan.py": "vLLM 0.34's KV loan: its scenario and the worker-side evidence it reads",
    "stale_kv.py": "stale KV after a weight update: its oracle and its scenario",
    "door.py": "a door of the engine process: the server door and the client door",
    "fuzz.py": "the scheduler-tier fuzzer: its command, its benchmark and its state machine",
    "plan.py": "a pause schedule replayed: its command and its scenario",
    "matrix.py": "the matrix: its command and its planning",
    "releases.py": "vLLM releases: the `releases watch` command and the releases a run covers",
    "envs.py": "cached vLLM environments: the `envs` command and the library",
    "frameworks.py": "RL framework recipes: the `frameworks` command and the library",
    "wheelhouse.py": "wheelhouses: the `wheelhouse` command and the library",
    "windows.py": "bug windows: the `windows` command and the library",
    "workarounds.py": "workarounds: the `workarounds` command and the library",
}


def test_a_module_name_names_one_concept() -> None:
    names: dict[str, list[str]] = {}
    for tree in ("harness", "repro"):
        for path in (ROOT / tree).rglob("*.py"):
            names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twice = {n: sorted(p) for n, p in names.items() if len(p) > 1 and n != "__init__.py"}
    assert {n: p for n, p in twice.items() if n not in SAME_CONCEPT} == {}
    assert sorted(n for n in SAME_CONCEPT if n not in twice) == [], "a line for a name no longer used twice"
