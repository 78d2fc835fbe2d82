"""The decode scenario's plan (repro.scenarios.decode): the pause scenario's requests, every one at the start, and no
event at all."""

from __future__ import annotations

import pytest

from repro.scenarios import SCENARIOS
from repro.scenarios.decode import DecodeParams, build

pytestmark = pytest.mark.unit


def test_every_request_starts_at_once_and_nothing_else_happens() -> None:
    plan = build("d", {"num_requests": 3, "extra_requests": 1, "max_tokens": 12}, 64, 7)
    assert [r.rid for r in plan.requests] == ["d-r00", "d-r01", "d-r02", "d-r03"]
    assert {r.max_tokens for r in plan.requests} == {12}
    assert plan.pauses == [] and not plan.inflight
    assert SCENARIOS["decode"] is build
    assert len(build("d", {}, 64, 7).requests) == DecodeParams().num_requests + DecodeParams().extra_requests


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown decode parameters"):
        build("d", {"pause_after": 8}, 64, 0)
    with pytest.raises(ValueError, match="must be at least 1"):
        build("d", {"num_requests": 0}, 64, 0)
