"""Shared test set-up: Hypothesis profiles, and how tests import their helpers.

Hypothesis profiles are registered here, once, and the one named by ``VLLM_REPRO_HYPOTHESIS_PROFILE``
is loaded before any test module is imported (default ``ci``)::

    VLLM_REPRO_HYPOTHESIS_PROFILE=nightly pytest tests/integration/test_schedules.py

* ``ci``: 100 examples per property.  ``deadline=None`` because the machines that run these (2-core CI
  runners, a loaded laptop) make per-example timings noise; ``derandomize=False`` so that every run
  explores new examples (Hypothesis' own built-in ``ci`` profile, which it loads when ``CI`` is set,
  would fix the seed); ``print_blob`` so that a CI failure can be replayed with ``@reproduce_failure``.
* ``nightly``: the same, with six times the examples.

A test keeps a ``@settings(...)`` of its own only where it truly differs (fewer examples because each
one writes files; health checks it knowingly trips), and says why next to it.

Helpers (``synthetic.py``, ``synthetic_runs.py``, ``ci_files.py`` in ``tests/unit``; ``loss_checks.py``
in ``tests/integration``) are plain modules beside the tests that use them, imported by their bare name
(``from synthetic import request_record``).  The test directories are not packages (no
``__init__.py``), so pytest's default ``prepend`` import mode puts each test file's own directory first
on ``sys.path`` before importing it; that is what makes the bare names importable, under plain
``pytest`` and under tox alike.  ``from tests.unit.synthetic import ...`` would need the repository
root on ``sys.path``, which tox's ``pytest`` does not have (it tests the installed package).  The same
mechanism means test file basenames must be unique across ``tests/unit`` and ``tests/integration``:
pytest imports both as top-level modules.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

HYPOTHESIS_PROFILE_VAR = "VLLM_REPRO_HYPOTHESIS_PROFILE"

settings.register_profile("ci", max_examples=100, deadline=None, derandomize=False, print_blob=True)
settings.register_profile("nightly", parent=settings.get_profile("ci"), max_examples=600)
settings.load_profile(os.environ.get(HYPOTHESIS_PROFILE_VAR, "ci"))

# `-m unit` is the fast set (no processes, no venvs, no network, well under a second each); everything else is
# `integration` (starts processes, builds environments, runs engines) or, for a pure but long check, `slow`.
# A test with no such marker would silently drop out of both selections, and one marked `unit` as well would
# still be picked by `-m unit`, so both are refused when collecting.
_KINDS = ("unit", "integration", "slow")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    wrong = []
    for item in items:
        kinds = [k for k in _KINDS if item.get_closest_marker(k)]
        if not kinds or ("unit" in kinds and len(kinds) > 1):
            wrong.append(f"{item.nodeid}: marked {kinds or 'nothing'}")
    if wrong:
        raise pytest.UsageError("each test needs `unit`, or `integration`/`slow` without `unit`:\n" + "\n".join(wrong))
