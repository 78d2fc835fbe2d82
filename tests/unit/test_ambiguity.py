"""The oracle on models whose streams repeat (harness.core.oracle.shift_ambiguity) or whose references depend on
batch composition (reference_split): AMBIGUOUS with the reason, never a wrong OK or LOSS."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from synthetic import request_record

from harness.core.cell import Cell
from harness.core.oracle import Outcome, cell_verdict, classify_request, explanations
from harness.core.recorded_streams import StreamRecord, stream_records
from harness.verdicts.known_bugs import check, load_known_bugs
from harness.verdicts.results import judged_result
from harness.verdicts.workarounds import WorkaroundStatus, judge_pair

pytestmark = pytest.mark.unit
typed = StreamRecord.from_json  # the oracle judges typed request records

PAUSE = 6
N = 24


def _frozen(rid: str, observed: list[int], reference: list[int], **kw: Any) -> dict[str, Any]:
    return request_record(rid, observed, reference, running=True, pause_at=PAUSE, max_tokens=N, **kw)


def _lose(ref: list[int], at: int, k: int = 1) -> list[int]:
    return (ref[:at] + ref[at + k:])[:N]


def _dup(ref: list[int], at: int, k: int = 1) -> list[int]:
    return (ref[:at] + ref[at - k:])[:N]


DISTINCT = list(range(100, 100 + N + 8))
# A random model that falls into a loop of one token from index 4 on, or alternates two from index 3 on.
STUCK = [11, 12, 13, 14] + [7] * (N + 4)
ALTERNATING = [11, 12, 13] + [7, 8] * ((N + 5) // 2 + 1)


def test_a_stream_stuck_on_one_token_cannot_show_a_loss() -> None:
    for observed in (STUCK[:N], _lose(STUCK, PAUSE)):  # no loss, and one lost token: the same stream
        v = classify_request(typed(_frozen("r", observed, STUCK))).verdict
        assert v.outcome is Outcome.AMBIGUOUS, v
        assert "fits OK, LOSS(1,2,3,4,5,6,7,8), DUPLICATE(1,2) alike" in v.detail
        assert "repeats itself where a shift would show (from index 6" in v.detail


def test_in_a_two_token_loop_a_lost_token_is_a_repeated_one() -> None:
    v = classify_request(typed(_frozen("r", _lose(ALTERNATING, PAUSE), ALTERNATING))).verdict
    assert v.outcome is Outcome.AMBIGUOUS
    assert {"LOSS(1)", "DUPLICATE(1)"} <= explanations(ALTERNATING, _lose(ALTERNATING, PAUSE), [PAUSE])
    # The unchanged stream excludes a lost token but not two lost ones (a period-2 stream shifted by 2 is
    # itself): no verdict either.
    assert explanations(ALTERNATING, ALTERNATING[:N], [PAUSE]) == {"OK", "LOSS(2)", "LOSS(4)", "LOSS(6)",
                                                                    "LOSS(8)", "DUPLICATE(2)"}
    assert classify_request(typed(_frozen("r", ALTERNATING[:N], ALTERNATING))).verdict.outcome is Outcome.AMBIGUOUS


def test_a_repeat_that_a_shift_crosses_still_proves_the_shift() -> None:
    # ... 5 5 5 9 ...: losing one of the 5s shows where the 9 comes early; only the index is uncertain.
    ref = [1, 2, 3, 4, 5, 6, 5, 5, 5, 9, *range(20, 20 + N)]
    v = classify_request(typed(_frozen("r", _lose(ref, PAUSE), ref))).verdict
    assert v.outcome is Outcome.LOSS and v.k == 1


def test_a_loss_at_each_of_two_pauses_is_proven_on_varied_tokens_and_not_in_a_loop() -> None:
    twice = _lose(_lose(DISTINCT, PAUSE), 15)
    rec = _frozen("r", twice, DISTINCT)
    rec["pauses"].append({**rec["pauses"][0], "k": 1, "client_tokens": 15, "engine_tokens": 15})
    assert classify_request(typed(rec)).verdict.label == "LOSS(1 at 6; 1 at 15)"
    looped = [*DISTINCT[:12], *([7] * (N + 8))]  # stuck on one token from index 12: the second loss is invisible
    rec = {**rec, "observed": _lose(_lose(looped, PAUSE), 15), "reference": looped}
    v = classify_request(typed(rec)).verdict
    assert v.outcome is Outcome.AMBIGUOUS and "OK" not in v.detail and "LOSS(1)" in v.detail


def test_a_request_with_no_post_resume_token_is_not_questioned() -> None:
    # Finished before the pause (no pauses recorded, submitted at start): nothing can have shifted.
    rec = request_record("r", STUCK[:N], STUCK, running=False, max_tokens=N)
    rec["submit"] = "start"
    assert classify_request(typed(rec)).verdict.outcome is Outcome.OK


@given(st.lists(st.integers(0, 2), min_size=N + 8, max_size=N + 8), st.integers(0, N - 1),
       st.sampled_from(["OK", "LOSS", "DUPLICATE"]), st.integers(1, 3))
def test_never_a_wrong_verdict_on_streams_full_of_repeats(ref: list[int], at: int, truth: str, k: int) -> None:
    """Whatever happened at the fault index of a stream over three tokens, the verdict is it or AMBIGUOUS."""
    if truth == "DUPLICATE" and at < k:
        truth = "OK"
    observed = {"OK": ref[:N], "LOSS": _lose(ref, at, k), "DUPLICATE": _dup(ref, at, k)}[truth]
    rec = request_record("r", observed, ref, running=True, pause_at=at, max_tokens=N)
    v = classify_request(typed(rec)).verdict
    want = "OK" if truth == "OK" else f"{truth}({k})"
    got = "OK" if v.outcome is Outcome.OK else f"{v.outcome.value}({v.k})"
    assert v.outcome is Outcome.AMBIGUOUS or got == want, (v, want)


@given(st.lists(st.integers(0, 999), min_size=N + 8, max_size=N + 8, unique=True), st.integers(0, N - 2),
       st.integers(1, 3))
def test_streams_without_repeats_are_never_ambiguous(ref: list[int], at: int, k: int) -> None:
    for observed in (ref[:N], _lose(ref, at, k)):
        rec = request_record("r", observed, ref, running=True, pause_at=at, max_tokens=N)
        assert classify_request(typed(rec)).verdict.outcome is not Outcome.AMBIGUOUS


# --------------------------------------------------------------------------- references that depend on batching


def _split(observed: list[int], ref: list[int], repeat: list[int]) -> dict[str, Any]:
    return {**_frozen("r", observed, ref), "reference_repeat": repeat}


OTHER = [*DISTINCT[:15], 999, *DISTINCT[16:]]  # the same model batched otherwise: differs from index 15


def test_a_stream_equal_to_either_no_pause_run_is_ok() -> None:
    for observed in (DISTINCT[:N], OTHER[:N]):
        r = classify_request(typed(_split(observed, DISTINCT, OTHER)))
        assert r.outcome is Outcome.OK and r.reference_split == 15


def test_an_exact_shift_of_both_references_is_still_a_loss() -> None:
    late = DISTINCT[:N + 2] + [555] * 6  # the references differ only past what the stream shows
    r = classify_request(typed(_split(_lose(DISTINCT, PAUSE), DISTINCT, late)))
    assert r.verdict.label == "LOSS(1 at 6)" and r.reference_split == N + 2


def test_a_stream_the_two_references_read_differently_is_ambiguous_naming_batch_invariance() -> None:
    r = classify_request(typed(_split(_lose(DISTINCT, PAUSE), DISTINCT, OTHER)))
    assert r.outcome is Outcome.AMBIGUOUS
    assert "differ from index 15" in r.verdict.detail and "--batch-invariant on" in r.verdict.detail


def test_a_cell_whose_engine_is_nondeterministic_does_not_call_a_divergence_a_finding() -> None:
    diverged = DISTINCT[:10] + [4242] * (N - 10)
    records = [_split(DISTINCT[:N], DISTINCT, OTHER), _frozen("d", diverged, DISTINCT)]
    verdict = cell_verdict(stream_records(records))
    assert verdict.outcome is Outcome.AMBIGUOUS
    assert verdict.reason is not None and "1/2 requests differ between batch compositions" in verdict.reason
    # Without the nondeterminism evidence the same divergence is a finding.
    assert cell_verdict(stream_records([_frozen("d", diverged, DISTINCT)])).outcome is Outcome.DIVERGED


def test_a_loss_in_some_requests_outranks_ambiguous_ones_and_the_summary_counts_them() -> None:
    records = [_frozen("a", _lose(DISTINCT, PAUSE), DISTINCT), _frozen("b", STUCK[:N], STUCK)]
    v = cell_verdict(stream_records(records))
    assert v.outcome is Outcome.LOSS
    assert v.summary == "LOSS(1) in 1/2 requests (1/2 running at pause); 1 AMBIGUOUS"


# --------------------------------------------------------------------------- what an AMBIGUOUS cell means downstream


def _result(cell: Cell, records: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    return judged_result(cell, cell_verdict(stream_records(records)), stream_records(records), None, 1.0)


def test_known_bugs_call_an_ambiguous_cell_inconclusive_and_skip_ambiguous_requests() -> None:
    bugs = load_known_bugs()
    cell = Cell("0.21.0", "mp", True, "keep", True)
    ambiguous = _result(cell, [_frozen("b", STUCK[:N], STUCK)])
    assert check(ambiguous, bugs).status == "inconclusive"
    mixed = _result(cell, [_frozen("a", _lose(DISTINCT, PAUSE), DISTINCT), _frozen("b", STUCK[:N], STUCK)])
    assert check(mixed, bugs).status == "as expected"


def test_an_ambiguous_cell_leaves_the_workaround_unknown() -> None:
    on = _result(Cell("0.22.0", "mp", True, "keep", True), [_frozen("b", STUCK[:N], STUCK)])
    off = _result(Cell("0.22.0", "mp", False, "keep", True), [_frozen("a", DISTINCT[:N], DISTINCT)])
    assert judge_pair("0.22.0", "mp", on, off).status is WorkaroundStatus.UNKNOWN
