"""The test tree's own rule (tests/conftest.py): pytest imports tests/unit and tests/integration as top-level modules,
so two test files with one basename make collection fail for the whole suite (it did once, with test_client_door.py
in both folders: `tox -e tests` would have stopped at collection)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_basename_is_unique_across_the_test_folders() -> None:
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "__init__.py" and "fixtures" not in p.parts)
    assert [n for n, k in names.items() if k > 1] == []
