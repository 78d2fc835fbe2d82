"""The matrix as a pytest suite: one item per cell, judged against the known-bug table.

``pytest -k post_resume`` runs the default matrix of the platform;
``-k "keep and async_on"`` etc. select cells by id.  An expected LOSS on
0.21.0 passes (and says so in the summary); an unexpected outcome fails with
the first post-resume token expected vs observed and the streams around the
pause.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.core.records import ExpectationRecord
from harness.frontends.pytest_summary import first_post_resume_tokens
from harness.verdicts.report.junit import request_lines
from harness.verdicts.results import CellResult

# Every default cell as an item: the nightly runs them all (tox -e nightly-tests, tox -e post-resume); tox -e tests
# keeps the pytest face through tests/integration/test_pytest_suite.py, which runs four of these items.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.nightly]


def test_post_resume(post_resume_cell: Cell, repro_run_cell: Callable[[Cell], CellResult],
                     record_property: Callable[[str, object], None]) -> None:
    result = repro_run_cell(post_resume_cell)
    exp = result.expectation or ExpectationRecord(None)
    record_property("outcome", result.summary)
    record_property("expectation", exp.message)
    record_property("first_post_resume", "; ".join(first_post_resume_tokens(result)))
    if result.outcome is Outcome.UNSUPPORTED:
        pytest.skip(f"UNSUPPORTED: {result.reason}")
    if result.outcome is Outcome.AMBIGUOUS:
        # A model whose streams repeat where a shift would show (--vllm-model): no verdict either way.
        pytest.skip(f"AMBIGUOUS: {result.reason}")
    if result.outcome.is_infra:
        pytest.fail(f"{result.id}: {result.outcome.value}: {result.reason}", pytrace=False)
    if exp.status != "as expected":
        lines = "\n  ".join(request_lines(result))
        pytest.fail(f"{result.id}: {exp.message}\n  {lines}", pytrace=False)
