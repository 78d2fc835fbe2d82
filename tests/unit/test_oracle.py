"""Property tests of the oracle (harness.core.oracle): stream, request and cell verdicts.

Token streams are modelled the way the bigram-cycle model produces them: a
walk along a cycle of DISTINCT tokens.  ``full`` is that walk (longer than any
stream), the reference is ``full[:n + margin]`` and an observed stream has
``n`` tokens.  The harness today records its no-pause reference with exactly
``max_tokens`` tokens (margin 0); a margin of 8 is what a longer reference
run would give.  Both are tested.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.core.oracle import (
    SHIFTS,
    FaultEvent,
    Outcome,
    StreamVerdict,
    cell_verdict,
    classify_request,
    classify_stream,
    events_label,
    fit_losses,
    preempted_at_keep_clear,
)
from harness.core.recorded_streams import StreamRecord, stream_records
from repro.models.deterministic import cycle_permutation, expected_continuation

pytestmark = pytest.mark.unit
typed = StreamRecord.from_json  # the oracle judges typed request records

OUT_OF_REFERENCE = 10_000  # every reference token is < 1000


# --------------------------------------------------------------------------- strategies


@st.composite
def cycle_walks(draw: st.DrawFn, min_n: int = 1, max_n: int = 48) -> tuple[list[int], int, int]:
    """(full, n, margin): ``full`` has n + 8 distinct tokens from range(1000)."""
    n = draw(st.integers(min_n, max_n))
    margin = draw(st.sampled_from([0, 8]))
    # A random permutation prefix of range(1000), drawn from a Hypothesis-controlled RNG.
    full = draw(st.randoms(use_true_random=False)).sample(range(1000), n + 8)
    return full, n, margin


@st.composite
def no_adjacent_repeats(draw: st.DrawFn, length: int) -> list[int]:
    """A sequence over a small alphabet (2..5 symbols) where no token follows itself."""
    a = draw(st.integers(2, 5))
    toks = [draw(st.integers(0, a - 1))]
    for _ in range(length - 1):
        toks.append((toks[-1] + draw(st.integers(1, a - 1))) % a)
    return toks


# --------------------------------------------------------------------------- classify_stream


@given(cycle_walks())
def test_unchanged_stream_is_ok(case: tuple[list[int], int, int]) -> None:
    full, n, margin = case
    ref = full[: n + margin]
    v = classify_stream(ref, ref[:n], expected_len=n)
    assert v == StreamVerdict(Outcome.OK)
    assert v.label == "OK"


@given(cycle_walks(min_n=5), st.data())
def test_dropped_tokens_cut_from_reference_are_loss(
    case: tuple[list[int], int, int], data: st.DataObject
) -> None:
    """observed = (ref[:i] + ref[i+k:])[:n] with a post-drop token visible -> LOSS(k at i).

    With margin 8 the observed stream keeps all n tokens; with no margin it is
    k tokens short.  Once a deviation is visible, expected_len does not matter:
    both n and len(observed) give the same verdict.
    """
    full, n, margin = case
    ref = full[: n + margin]
    k = data.draw(st.integers(1, 4), label="k")
    visible = min(n, len(ref) - k)  # len(observed) for any i
    i = data.draw(st.integers(0, visible - 1), label="i")
    observed = (ref[:i] + ref[i + k :])[:n]
    assert len(observed) == visible > i
    for expected_len in (n, len(observed)):
        v = classify_stream(ref, observed, expected_len=expected_len)
        assert (v.outcome, v.at, v.k) == (Outcome.LOSS, i, k), expected_len
        assert v.label == f"LOSS({k} at {i})"
        assert v.detail == f"expected {ref[i]}, got {ref[i + k]}"


@given(cycle_walks(min_n=5), st.data())
def test_drop_past_the_end_of_a_short_reference_is_invisible(
    case: tuple[list[int], int, int], data: st.DataObject
) -> None:
    """No margin, drop in the last k positions: observed == ref[:i], no deviation to see.

    Against the stream's nominal length (expected_len=n) that is a TRUNCATED
    stream; if the caller passes expected_len=len(observed) the loss is
    invisible and the verdict is OK.  Only a visible post-drop token makes a LOSS.
    """
    full, n, _ = case
    ref = full[:n]
    k = data.draw(st.integers(1, 4), label="k")
    i = data.draw(st.integers(n - k, n - 1), label="i")
    observed = (ref[:i] + ref[i + k :])[:n]
    assert observed == ref[:i]
    v = classify_stream(ref, observed, expected_len=n)
    assert (v.outcome, v.at, v.label) == (Outcome.TRUNCATED, i, f"TRUNCATED(at {i})")
    assert classify_stream(ref, observed, expected_len=len(observed)) == StreamVerdict(Outcome.OK)


@given(cycle_walks(min_n=5), st.data())
def test_real_engine_drop_is_loss_only_if_the_reference_covers_the_resume_point(
    case: tuple[list[int], int, int], data: st.DataObject
) -> None:
    """A real engine that loses k tokens still emits n tokens: full[:i] + full[i+k : n+k].

    With an 8-token margin this is always LOSS(k at i).  With the reference
    exactly n long (what the harness records today) a drop with i + k >= n
    resumes beyond the reference, so nothing can confirm the shift: DIVERGED(at i).
    """
    full, n, margin = case
    ref = full[: n + margin]
    k = data.draw(st.integers(1, 4), label="k")
    i = data.draw(st.integers(0, n - 1), label="i")
    observed = (full[:i] + full[i + k :])[:n]
    assert len(observed) == n
    v = classify_stream(ref, observed, expected_len=n)
    if i + k < len(ref):
        assert (v.outcome, v.at, v.k) == (Outcome.LOSS, i, k)
    else:
        assert margin == 0
        assert (v.outcome, v.at, v.label) == (Outcome.DIVERGED, i, f"DIVERGED(at {i})")


@given(cycle_walks(min_n=2), st.data())
def test_repeated_tokens_are_duplicate(case: tuple[list[int], int, int], data: st.DataObject) -> None:
    full, n, margin = case
    ref = full[: n + margin]
    k = data.draw(st.integers(1, min(4, n - 1)), label="k")
    i = data.draw(st.integers(k, n - 1), label="i")
    observed = (ref[:i] + ref[i - k :])[:n]
    assert len(observed) == n
    v = classify_stream(ref, observed, expected_len=n)
    assert (v.outcome, v.at, v.k) == (Outcome.DUPLICATE, i, k)
    assert v.label == f"DUPLICATE({k} at {i})"


@given(cycle_walks(), st.data())
def test_foreign_token_is_diverged(case: tuple[list[int], int, int], data: st.DataObject) -> None:
    full, n, margin = case
    ref = full[: n + margin]
    i = data.draw(st.integers(0, n - 1), label="i")
    bad = OUT_OF_REFERENCE + data.draw(st.integers(0, 99), label="bad")
    observed = list(ref[:n])
    observed[i] = bad
    v = classify_stream(ref, observed, expected_len=n)
    assert (v.outcome, v.at, v.k) == (Outcome.DIVERGED, i, None)
    assert v.label == f"DIVERGED(at {i})"
    assert v.detail == f"expected {ref[i]}, got {bad}"


@given(cycle_walks(min_n=3), st.data())
def test_misplaced_reference_token_is_diverged(case: tuple[list[int], int, int], data: st.DataObject) -> None:
    """A single wrong token taken from elsewhere in the reference is not a shift.

    Its first token would fit a shift, but the rest of the stream does not: a
    shift is only accepted if the WHOLE overlap agrees.  (The overlap is kept
    at two or more tokens: a one-token overlap cannot tell the two apart.)
    """
    full, n, margin = case
    ref = full[: n + margin]
    i = data.draw(st.integers(0, n - 2), label="i")
    j = data.draw(st.integers(0, len(ref) - 2).filter(lambda j: j != i), label="j")
    observed = list(ref[:n])
    observed[i] = ref[j]
    v = classify_stream(ref, observed, expected_len=n)
    assert v.label == f"DIVERGED(at {i})"


@given(cycle_walks(), st.data())
def test_strict_prefix_is_truncated_unless_prefix_ok(
    case: tuple[list[int], int, int], data: st.DataObject
) -> None:
    full, n, margin = case
    ref = full[: n + margin]
    m = data.draw(st.integers(0, n - 1), label="m")
    v = classify_stream(ref, ref[:m], expected_len=n)
    assert (v.outcome, v.at) == (Outcome.TRUNCATED, m)
    assert v.label == f"TRUNCATED(at {m})"
    assert v.detail == f"{m} of {n} tokens"
    assert classify_stream(ref, ref[:m], expected_len=n, prefix_ok=True) == StreamVerdict(Outcome.OK)
    # Without an expected length, any prefix is complete.
    assert classify_stream(ref, ref[:m]).outcome is Outcome.OK


@given(cycle_walks())
def test_stream_longer_than_reference_is_diverged(case: tuple[list[int], int, int]) -> None:
    full, n, margin = case
    ref = full[: n + margin]
    v = classify_stream(ref, [*ref, OUT_OF_REFERENCE], expected_len=n)
    assert (v.outcome, v.at) == (Outcome.DIVERGED, len(ref))


@given(st.integers(4, 48), st.sampled_from([0, 8]), st.data())
def test_single_drop_without_adjacent_repeats_is_loss_1(n: int, margin: int, data: st.DataObject) -> None:
    """References that may be periodic but never repeat a token back to back: a drop of ONE is LOSS(1)."""
    ref = data.draw(no_adjacent_repeats(n + margin), label="ref")
    i = data.draw(st.integers(0, min(n, len(ref) - 1) - 1), label="i")
    observed = (ref[:i] + ref[i + 1 :])[:n]
    assert len(observed) > i
    v = classify_stream(ref, observed, expected_len=n)
    assert (v.outcome, v.at, v.k) == (Outcome.LOSS, i, 1)


def test_periodic_reference_hides_a_two_token_loss() -> None:
    """Why the model's permutation must be ONE cycle: on a period-2 walk a 2-token loss vanishes."""
    n, i = 20, 5
    long_ref = [1, 2] * 14  # margin 8
    observed = (long_ref[:i] + long_ref[i + 2 :])[:n]
    assert observed == long_ref[:n]  # the loss left no trace at all
    assert classify_stream(long_ref, observed, expected_len=n).outcome is Outcome.OK
    short_ref = long_ref[:n]  # no margin: the stream just looks short
    v = classify_stream(short_ref, (short_ref[:i] + short_ref[i + 2 :])[:n], expected_len=n)
    assert (v.outcome, v.at) == (Outcome.TRUNCATED, n - 2)
    # Period 3: the same 2-token loss reads as a 1-token duplicate.
    p3 = [1, 2, 3] * 10
    v3 = classify_stream(p3, (p3[:i] + p3[i + 2 :])[:n], expected_len=n)
    assert v3.label == f"DUPLICATE(1 at {i})"
    # A walk over distinct tokens (a single cycle) shows the truth.
    distinct = list(range(100, 128))
    vd = classify_stream(distinct, (distinct[:i] + distinct[i + 2 :])[:n], expected_len=n)
    assert vd.label == f"LOSS(2 at {i})"


def test_max_shift_bounds_loss_detection() -> None:
    ref = list(range(40))
    observed = (ref[:3] + ref[3 + 9 :])[:20]
    assert classify_stream(ref, observed, expected_len=20).label == "DIVERGED(at 3)"
    assert classify_stream(ref, observed, expected_len=20, max_shift=9).label == "LOSS(9 at 3)"


@pytest.mark.parametrize(
    ("verdict", "label"),
    [
        (StreamVerdict(Outcome.LOSS, 12, 1), "LOSS(1 at 12)"),
        (StreamVerdict(Outcome.DUPLICATE, 5, 2), "DUPLICATE(2 at 5)"),
        (StreamVerdict(Outcome.DIVERGED, 3), "DIVERGED(at 3)"),
        (StreamVerdict(Outcome.TRUNCATED, 7), "TRUNCATED(at 7)"),
        (StreamVerdict(Outcome.TRUNCATED), "TRUNCATED"),
        (StreamVerdict(Outcome.OK), "OK"),
        (StreamVerdict(Outcome.ERROR, detail="boom"), "ERROR"),
    ],
)
def test_labels(verdict: StreamVerdict, label: str) -> None:
    assert verdict.label == label


def test_labels_from_classification() -> None:
    ref = list(range(100, 140))
    assert classify_stream(ref, ref[:12] + ref[13:30], expected_len=29).label == "LOSS(1 at 12)"
    assert classify_stream(ref, ref[:5] + ref[3:30], expected_len=32).label == "DUPLICATE(2 at 5)"
    assert classify_stream(ref, [*ref[:3], 7, *ref[4:10]], expected_len=10).label == "DIVERGED(at 3)"


def test_request_outcomes_rank_from_best_to_worst() -> None:
    order = [Outcome.OK, Outcome.TRUNCATED, Outcome.LOGPROB_SHIFT, Outcome.GROUP_BROKEN, Outcome.DUPLICATE,
             Outcome.LOSS, Outcome.STALE_KV, Outcome.DIVERGED, Outcome.ERROR]
    assert [o.rank for o in order] == sorted(o.rank for o in order)
    assert len({o.rank for o in Outcome}) == len(Outcome)
    assert {o for o in Outcome if o.is_token_fault} == {
        Outcome.TRUNCATED,
        Outcome.LOGPROB_SHIFT,
        Outcome.GROUP_BROKEN,
        Outcome.DUPLICATE,
        Outcome.LOSS,
        Outcome.DIVERGED,
        Outcome.STALE_KV,
    }


# --------------------------------------------------------------------------- classify_request

PERM = cycle_permutation(512, 0)
PROMPT = [5, 17, 42, 99]


def walk(n: int, last: int = PROMPT[-1]) -> list[int]:
    return expected_continuation(PERM, last, n)


def pause(
    client_tokens: int, mode: str = "keep", frozen: bool = True, clear_cache: bool = True
) -> dict[str, Any]:
    return {
        "k": 0,
        "mode": mode,
        "clear_cache": clear_cache,
        "client_tokens": client_tokens,
        "engine_tokens": client_tokens + (1 if frozen else 0),
        "frozen": frozen,
    }


def record(
    rid: str,
    observed: list[int],
    reference: list[int],
    *,
    max_tokens: int | None = None,
    submit: Any = "start",
    pauses: list[dict[str, Any]] | None = None,
    finish_reason: str | None = "length",
    error: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "rid": rid,
        "submit": submit,
        "prompt": PROMPT,
        "max_tokens": len(reference) if max_tokens is None else max_tokens,
        "observed": observed,
        "reference": reference,
        "finish_reason": finish_reason,
        "error": error,
        "pauses": pauses or [],
        **extra,
    }


def lossy_keep_record(rid: str, n: int, i: int) -> dict[str, Any]:
    """A request frozen by a keep pause after i tokens that lost token i (what #42043 does)."""
    full = walk(n + 1)
    return record(rid, full[:i] + full[i + 1 : n + 1], full[:n], pauses=[pause(i)])


@given(st.integers(4, 40), st.data())
def test_frozen_keep_request_losing_its_pause_token(n: int, data: st.DataObject) -> None:
    i = data.draw(st.integers(0, n - 2), label="i")
    rec = lossy_keep_record("r0", n, i)
    ref = rec["reference"]
    rv = classify_request(typed(rec))
    assert rv.verdict.label == f"LOSS(1 at {i})"
    assert rv.running_at_pause is True
    assert rv.pause_index == i
    assert rv.first_post_resume == {"index": i, "expected": ref[i], "observed": ref[i + 1]}
    d = rv.to_dict()
    assert (d["rid"], d["outcome"], d["label"], d["at"], d["k"]) == ("r0", "LOSS", f"LOSS(1 at {i})", i, 1)


def test_frozen_keep_request_losing_its_last_token_is_diverged_with_an_exact_reference() -> None:
    """Limitation pinned: with the reference exactly max_tokens long, losing the LAST token is DIVERGED."""
    n = 10
    rv = classify_request(typed(lossy_keep_record("r0", n, n - 1)))
    assert rv.verdict.label == f"DIVERGED(at {n - 1})"


@given(st.integers(2, 40), st.data())
def test_intact_frozen_keep_request_is_ok(n: int, data: st.DataObject) -> None:
    i = data.draw(st.integers(0, n - 1), label="i")
    ref = walk(n)
    rv = classify_request(typed(record("r1", list(ref), ref, pauses=[pause(i)])))
    assert rv.outcome is Outcome.OK
    assert rv.first_post_resume == {"index": i, "expected": ref[i], "observed": ref[i]}


@given(st.integers(2, 40), st.data())
def test_aborted_request_with_prefix_is_ok(n: int, data: st.DataObject) -> None:
    m = data.draw(st.integers(0, n - 1), label="m")
    ref = walk(n)
    rec = record("a0", ref[:m], ref, pauses=[pause(m, mode="abort", frozen=False)], finish_reason="abort")
    rv = classify_request(typed(rec))
    assert rv.verdict == StreamVerdict(Outcome.OK)
    assert rv.running_at_pause is True
    assert rv.pause_index == m
    assert rv.first_post_resume is None


def test_aborted_request_that_did_not_finish_as_abort_is_truncated() -> None:
    ref = walk(16)
    rec = record("a1", ref[:6], ref, pauses=[pause(6, mode="abort", frozen=False)], finish_reason="stop")
    v = classify_request(typed(rec)).verdict
    assert (v.outcome, v.at) == (Outcome.TRUNCATED, 6)
    assert "'stop'" in v.detail


def test_aborted_request_that_lost_a_token_is_still_loss() -> None:
    full = walk(17)
    rec = record(
        "a2",
        full[:4] + full[5:8],
        full[:16],
        pauses=[pause(4, mode="abort", frozen=False)],
        finish_reason="abort",
    )
    assert classify_request(typed(rec)).verdict.label == "LOSS(1 at 4)"


def test_request_with_error_is_error() -> None:
    ref = walk(16)
    rv = classify_request(typed(record("e0", ref[:3], ref, error="EngineDeadError: boom", finish_reason=None)))
    assert rv.outcome is Outcome.ERROR
    assert rv.verdict.label == "ERROR"
    assert rv.verdict.detail == "EngineDeadError: boom"


def test_request_submitted_during_pause_is_judged_from_token_0() -> None:
    ref = walk(16)
    rv = classify_request(typed(record("d0", list(ref), ref, submit=["during", 0])))
    assert rv.outcome is Outcome.OK
    assert rv.running_at_pause is False
    assert rv.pause_index is None
    assert rv.first_post_resume == {"index": 0, "expected": ref[0], "observed": ref[0]}
    # If it loses its first token, the post-resume token shows it.
    full = walk(17)
    rv = classify_request(typed(record("d1", full[1:17], full[:16], submit=["during", 0])))
    assert rv.verdict.label == "LOSS(1 at 0)"
    assert rv.first_post_resume == {"index": 0, "expected": full[0], "observed": full[1]}


def test_request_from_start_without_pause_has_no_post_resume_token() -> None:
    ref = walk(8)
    rv = classify_request(typed(record("s0", list(ref), ref)))
    assert (rv.outcome, rv.running_at_pause, rv.pause_index, rv.first_post_resume) == (
        Outcome.OK,
        False,
        None,
        None,
    )


# --------------------------------------------------------------------------- cell_verdict


def test_keep_cell_with_8_lossy_running_requests_and_2_late_ok_requests() -> None:
    n = 16
    running = [lossy_keep_record(f"r{j}", n, 4) for j in range(8)]
    ref = walk(n)
    late = [record(f"late{j}", list(ref), ref, submit=["during", 0]) for j in range(2)]
    cv = cell_verdict(stream_records(running + late))
    assert cv.outcome is Outcome.LOSS
    assert cv.summary == "LOSS(1) in 8/10 requests (8/8 running at pause)"
    assert cv.counts == {"LOSS(1)": 8, "OK": 2}
    assert [r.rid for r in cv.requests] == [f"r{j}" for j in range(8)] + ["late0", "late1"]
    assert cv.reason is None


def test_all_ok_cell() -> None:
    ref = walk(8)
    cv = cell_verdict(stream_records([record(f"r{j}", list(ref), ref, pauses=[pause(3)]) for j in range(3)]))
    assert (cv.outcome, cv.summary, cv.counts) == (Outcome.OK, "OK 3/3", {"OK": 3})


def test_cell_without_requests_is_error() -> None:
    cv = cell_verdict(stream_records([]))
    assert cv.outcome is Outcome.ERROR
    assert cv.reason


def test_failed_model_check_makes_the_cell_error() -> None:
    ref = walk(8)
    good = record("r0", list(ref), ref, reference_matches_model=True)
    bad = record("r1", list(ref), ref, reference_matches_model=False)
    cv = cell_verdict(stream_records([good, bad]))
    assert cv.outcome is Outcome.ERROR
    assert cv.summary == "model check failed"
    assert cv.reason is not None and "r1" in cv.reason
    assert cell_verdict(stream_records([good])).outcome is Outcome.OK


KINDS = ("ok", "truncated", "duplicate", "loss", "diverged", "error")
KIND_OUTCOME = {
    "ok": Outcome.OK,
    "truncated": Outcome.TRUNCATED,
    "duplicate": Outcome.DUPLICATE,
    "loss": Outcome.LOSS,
    "diverged": Outcome.DIVERGED,
    "error": Outcome.ERROR,
}


def synthetic(rid: str, kind: str, running: bool, n: int = 12, i: int = 4) -> dict[str, Any]:
    full = walk(n + 2)
    ref = full[:n]
    obs = {
        "ok": list(ref),
        "truncated": ref[: n - 3],
        "duplicate": (ref[:i] + ref[i - 1 :])[:n],
        "loss": full[:i] + full[i + 1 : n + 1],
        "diverged": [*ref[:i], OUT_OF_REFERENCE, *ref[i + 1 :]],
        "error": ref[:2],
    }[kind]
    return record(
        rid,
        obs,
        ref,
        pauses=[pause(i)] if running else [],
        submit="start" if running else ["after", 0],
        error="boom" if kind == "error" else None,
    )


@given(st.lists(st.tuples(st.sampled_from(KINDS), st.booleans()), min_size=1, max_size=12))
def test_cell_takes_the_worst_request_outcome(kinds: list[tuple[str, bool]]) -> None:
    records = [synthetic(f"r{j}", kind, running) for j, (kind, running) in enumerate(kinds)]
    cv = cell_verdict(stream_records(records))
    expected = [KIND_OUTCOME[kind] for kind, _ in kinds]
    worst = max(expected, key=lambda o: o.rank)
    assert [r.outcome for r in cv.requests] == expected
    assert cv.outcome is worst
    assert sum(cv.counts.values()) == len(records)
    assert list(cv.counts) == sorted(cv.counts)
    n_bad = expected.count(worst)
    if worst is Outcome.OK:
        assert cv.summary == f"OK {len(records)}/{len(records)}"
    else:
        m = re.fullmatch(r"(\S+) in (\d+)/(\d+) requests(?: \((\d+)/(\d+) running at pause\))?", cv.summary)
        assert m, cv.summary
        assert m.group(1).startswith(worst.value)
        assert (int(m.group(2)), int(m.group(3))) == (n_bad, len(records))
        n_running = sum(running for _, running in kinds)
        if n_running:
            bad_running = sum(running for (kind, running) in kinds if KIND_OUTCOME[kind] is worst)
            assert (int(m.group(4)), int(m.group(5))) == (bad_running, n_running)
        else:
            assert m.group(4) is None


def test_summary_count_agrees_with_its_label_when_losses_differ_in_size() -> None:
    n = 16
    one = lossy_keep_record("r0", n, 4)
    full = walk(n + 2)
    two = record("r1", full[:4] + full[6 : n + 2], full[:n], pauses=[pause(4)])
    cv = cell_verdict(stream_records([one, two]))
    assert [r.verdict.label for r in cv.requests] == ["LOSS(1 at 4)", "LOSS(2 at 4)"]
    assert cv.counts == {"LOSS(1)": 1, "LOSS(2)": 1}
    # Every distinct size is named, so the count matches the label.
    assert cv.summary == "LOSS(1,2) in 2/2 requests (2/2 running at pause)"


# --------------------------------------------------------------------------- several faults in one stream


@st.composite
def faulted_streams(draw: st.DrawFn) -> tuple[list[int], list[int], tuple[FaultEvent, ...]]:
    """(reference, observed, events): a stream made from a reference of DISTINCT tokens by 1-5 random losses and
    duplicates of 1-4 tokens at random observed indices.

    Unambiguous by construction: every token has one place in the reference, each event is followed by at
    least two tokens before the next one (one suffices when both are of one kind, e.g. two #42043 losses one
    token apart) and by at least one before the stream ends, and a duplicate never reaches before the
    reference's start.  (Ambiguity rule, oracle docstring: one token between shifts of opposite kinds is read
    as a wrong token, DIVERGED.)
    """
    events: list[FaultEvent] = []
    at, pos = draw(st.integers(0, 12), label="first index"), 0
    for _ in range(draw(st.integers(1, 5), label="events")):
        kind = draw(st.sampled_from(SHIFTS))
        if events:
            at += draw(st.integers(1 if kind is events[-1].kind else 2, 12))
        pos_here = pos + at - (events[-1].at if events else 0)  # reference position the stream reached at ``at``
        k = draw(st.integers(1, 4))
        if kind is Outcome.DUPLICATE:
            assume(pos_here >= k)
        events.append(FaultEvent(kind, k, at))
        pos = pos_here + events[-1].shift
    n = at + draw(st.integers(1, 12), label="tokens after the last event")
    observed_positions, off, unshifted = [], 0, []
    for i in range(n):
        if any(e.at == i for e in events):
            unshifted.append(i + off)  # where the stream would have gone on: the reference must hold it
        off += sum(e.shift for e in events if e.at == i)
        observed_positions.append(i + off)
    margin = draw(st.sampled_from([0, 8]))
    length = max(observed_positions + unshifted) + 1 + margin
    full = draw(st.randoms(use_true_random=False)).sample(range(1000), length)
    return full, [full[p] for p in observed_positions], tuple(events)


@given(faulted_streams())
def test_every_loss_and_duplicate_is_recovered(case: tuple[list[int], list[int], tuple[FaultEvent, ...]]) -> None:
    ref, obs, events = case
    v = classify_stream(ref, obs, expected_len=len(obs))
    assert v.events == events
    assert v.label == events_label(events)
    first = events[0]
    if len(events) == 1:
        assert (v.outcome, v.at, v.k, v.label) == (first.kind, first.at, first.k, first.label)
        assert v.short == f"{first.kind.value}({first.k})"
    else:
        worst = Outcome.LOSS if any(e.kind is Outcome.LOSS for e in events) else Outcome.DUPLICATE
        assert (v.outcome, v.at, v.k) == (worst, first.at, None)
        assert v.label.count(" at ") == len(events)


@given(faulted_streams(), st.data())
def test_a_foreign_token_after_the_faults_is_diverged_there(
    case: tuple[list[int], list[int], tuple[FaultEvent, ...]], data: st.DataObject
) -> None:
    """The events before the foreign token are kept when at least two tokens confirm each; an event followed
    by only one token before the divergence is withdrawn (and so on back), the divergence then starting there."""
    ref, obs, events = case
    assume(len(obs) > events[-1].at + 1)
    x = data.draw(st.integers(events[-1].at + 1, len(obs) - 1), label="foreign at")
    broken = [*obs[:x], OUT_OF_REFERENCE, *obs[x + 1:]]
    v = classify_stream(ref, broken, expected_len=len(obs))
    kept, at = list(events), x
    while kept and at - kept[-1].at < 2:
        at = kept.pop().at
    assert (v.outcome, v.at, v.events) == (Outcome.DIVERGED, at, tuple(kept))
    assert v.label == (f"{events_label(kept)}; " if kept else "") + f"DIVERGED(at {at})"


def test_one_token_between_opposite_shifts_is_a_wrong_token() -> None:
    ref = list(range(100, 140))
    # ref[9] in place of ref[6]: "LOSS(3 at 6); DUPLICATE(3 at 7)" would fit as well; the oracle says DIVERGED.
    assert classify_stream(ref, [*ref[:6], ref[9], *ref[7:30]]).label == "DIVERGED(at 6)"
    # Two losses one token apart are two losses.
    assert classify_stream(ref, [*ref[:6], ref[7], *ref[9:30]]).label == "LOSS(1 at 6; 1 at 7)"
    # With two tokens between, a loss and a duplicate are both believed.
    assert classify_stream(ref, [*ref[:6], *ref[7:9], *ref[6:30]]).label == "LOSS(1 at 6); DUPLICATE(3 at 8)"


def test_the_plan_of_issue_14_reads_one_loss_per_pause() -> None:
    """Two keep+clear pauses on 0.21.0 (after 6 and 18 tokens): once DIVERGED(at 6), now one loss at each."""
    full = walk(48 + 8)
    obs = full[:6] + full[7:19] + full[20:50]
    rec = record("r0", obs, full[:56], max_tokens=48, pauses=[pause(6), pause(18)])
    rv = classify_request(typed(rec))
    assert rv.verdict.label == "LOSS(1 at 6; 1 at 18)"
    assert rv.to_dict()["events"] == [{"kind": "LOSS", "k": 1, "at": 6}, {"kind": "LOSS", "k": 1, "at": 18}]
    assert (rv.to_dict()["at"], rv.to_dict()["k"]) == (6, None)
    assert fit_losses(rec["reference"], obs, 48, preempted_at_keep_clear(typed(rec).pauses)) is None  # no counts
    cv = cell_verdict(stream_records([rec, record("late", full[:48], full[:56], max_tokens=48, submit=["during", 1])]))
    assert cv.summary == "LOSS(1; 1) in 1/2 requests (1/1 running at pause)"
    assert cv.counts == {"LOSS(1; 1)": 1, "OK": 1}


def test_cell_label_names_each_shape_when_requests_differ() -> None:
    full = walk(48 + 8)
    two = record("r0", full[:6] + full[7:19] + full[20:50], full[:56], max_tokens=48, pauses=[pause(6), pause(18)])
    one = record("r1", full[:6] + full[7:49], full[:56], max_tokens=48, pauses=[pause(6)])
    cv = cell_verdict(stream_records([two, one]))
    assert (cv.outcome, cv.label) == (Outcome.LOSS, "LOSS(1) | LOSS(1; 1)")
    assert cv.summary == "LOSS(1) | LOSS(1; 1) in 2/2 requests (2/2 running at pause)"
