"""Tests of the pure bisect search (harness.bisect.search) with fake probes only.

A fake probe maps candidate -> ProbeResult from a precomputed list and counts
its calls, so every test checks memoization and the on_probe callback too.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.bisect.search import (
    BisectError,
    BisectResult,
    ProbeRecord,
    ProbeResult,
    Verdict,
    bisect,
    monotone_check,
)
from harness.core.errors import BadInput, ReproError

# Marked per test: `unit` ones are pure and fast; the exhaustive bound check takes ~2 s (`slow`).

G, B, S = Verdict.GOOD, Verdict.BAD, Verdict.SKIP
STATES = {"fix": (B, G), "regression": (G, B)}  # (old state, new state)


class FakeProbe:
    """probe(candidate) from a verdict per candidate; records every call."""

    def __init__(self, candidates: list[str], verdicts: list[Verdict], details: dict[str, str] | None = None) -> None:
        self.table = dict(zip(candidates, verdicts, strict=True))
        self.details = details or {}
        self.calls: list[str] = []

    def __call__(self, candidate: str) -> ProbeResult:
        self.calls.append(candidate)
        v = self.table[candidate]
        return ProbeResult(v, self.details.get(candidate, f"{v.name.lower()} {candidate}"))


def names(n: int) -> list[str]:
    return [f"0.{i}.0" for i in range(n)]


def run(
    verdicts: list[Verdict], find: str = "fix", details: dict[str, str] | None = None, cands: list[str] | None = None
) -> tuple[BisectResult, FakeProbe, list[ProbeRecord]]:
    cands = cands or names(len(verdicts))
    probe = FakeProbe(cands, verdicts, details)
    seen: list[ProbeRecord] = []
    res = bisect(cands, probe, find=find, on_probe=seen.append)
    check_bookkeeping(res.probes, probe, seen)
    return res, probe, seen


def check_bookkeeping(probes: tuple[ProbeRecord, ...], probe: FakeProbe, seen: list[ProbeRecord]) -> None:
    # Each candidate probed at most once; on_probe saw every record, in order; steps are 1, 2, 3, ...
    assert max(Counter(probe.calls).values(), default=1) == 1
    assert list(probes) == seen
    assert [r.candidate for r in seen] == probe.calls
    assert [r.step for r in seen] == list(range(1, len(seen) + 1))


def raises_bisect(verdicts: list[Verdict], find: str, details: dict[str, str] | None = None) -> BisectError:
    cands = names(len(verdicts))
    probe = FakeProbe(cands, verdicts, details)
    seen: list[ProbeRecord] = []
    with pytest.raises(BisectError) as exc:
        bisect(cands, probe, find=find, on_probe=seen.append)
    check_bookkeeping(exc.value.probes, probe, seen)
    return exc.value


def tight_bound(n: int) -> int:
    # 2 endpoint probes + ceil(log2(gap)) halvings of the initial gap n - 1.
    return 2 + (n - 2).bit_length()


def spec_bound(n: int) -> int:
    return math.ceil(math.log2(n)) + 2


# --------------------------------------------------------------------------- no skips


@pytest.mark.unit
@given(n=st.integers(2, 200), data=st.data(), find=st.sampled_from(["fix", "regression"]))
def test_monotone_without_skips_finds_boundary_within_bound(n: int, data: st.DataObject, find: str) -> None:
    b = data.draw(st.integers(1, n - 1), label="boundary")
    old, new = STATES[find]
    res, probe, _ = run([old] * b + [new] * (n - b), find=find)
    cands = names(n)
    assert res.first_new == cands[b]
    assert res.last_old == cands[b - 1]
    assert res.ambiguous == () and res.skipped == ()
    assert res.find == find
    assert len(probe.calls) <= tight_bound(n) <= spec_bound(n)
    # The two endpoints come first, old end then new end.
    assert probe.calls[:2] == [cands[0], cands[-1]]


@pytest.mark.slow  # 20k bisects, every boundary up to N=200
def test_probe_bound_is_exact() -> None:
    # Over every boundary, the worst case equals 2 + ceil(log2(N - 1)) (so the bound is attained), <= ceil(log2 N) + 2.
    for n in range(2, 201):
        worst = 0
        for b in range(1, n):
            res, probe, _ = run([B] * b + [G] * (n - b))
            assert res.first_new == names(n)[b]
            worst = max(worst, len(probe.calls))
        assert worst == tight_bound(n) == 2 + math.ceil(math.log2(n - 1))
        assert worst <= spec_bound(n)


# --------------------------------------------------------------------------- skips


@st.composite
def skipped_sequences(draw: st.DrawFn) -> tuple[list[Verdict], int, str]:
    """(verdicts, boundary b, find): monotone around b with SKIPs sprinkled, >= 1 non-SKIP on each side."""
    n = draw(st.integers(2, 200))
    b = draw(st.integers(1, n - 1))
    find = draw(st.sampled_from(["fix", "regression"]))
    rate = draw(st.sampled_from([0.05, 0.3, 0.7, 0.95]))
    rng = draw(st.randoms(use_true_random=False))
    old, new = STATES[find]
    verdicts = [S if rng.random() < rate else (old if i < b else new) for i in range(n)]
    verdicts[draw(st.integers(0, b - 1))] = old
    verdicts[draw(st.integers(b, n - 1))] = new
    # Sometimes force skips right at the boundary (the ambiguous case).
    if draw(st.booleans()):
        width = draw(st.integers(1, 4))
        for i in range(max(0, b - width), min(n, b + width)):
            if any(v is old for v in verdicts[:i]) and any(v is new for v in verdicts[i + 1 :]):
                verdicts[i] = S
    return verdicts, b, find


@pytest.mark.unit
@given(case=skipped_sequences())
def test_skips_never_give_a_wrong_answer(case: tuple[list[Verdict], int, str]) -> None:
    verdicts, b, find = case
    old, new = STATES[find]
    n = len(verdicts)
    cands = names(n)
    res, probe, _ = run(verdicts, find=find)
    # The true boundary lies between the last non-SKIP old-state candidate L (< b)
    # and the first non-SKIP new-state candidate R (>= b); everything between them is SKIP.
    last_old = max(i for i in range(b) if verdicts[i] is old)
    first_new = min(i for i in range(b, n) if verdicts[i] is new)
    assert res.last_old == cands[last_old]
    assert res.first_new == cands[first_new]
    assert last_old < b <= first_new
    assert res.ambiguous == tuple(cands[last_old + 1 : first_new])
    if first_new == b and last_old == b - 1:
        assert res.ambiguous == ()
    # Everything reported skipped was probed and SKIP; every SKIP probe is reported.
    assert res.skipped == tuple(r.candidate for r in sorted(res.probes, key=lambda r: r.index) if r.result.verdict is S)
    assert len(probe.calls) <= n


@pytest.mark.unit
def test_skip_in_middle_tries_neighbours_alternately() -> None:
    # 0..10: BAD up to 6, GOOD from 7; 5 (the first middle) and 6 skipped.
    verdicts = [B, B, B, B, B, S, S, G, G, G, G]
    res, probe, _ = run(verdicts)
    cands = names(11)
    # endpoints, mid 5 (SKIP), then 6 (mid+1, SKIP), then 4 (mid-1), ...
    assert probe.calls[:5] == [cands[0], cands[10], cands[5], cands[6], cands[4]]
    assert res.first_new == cands[7] and res.last_old == cands[4]
    assert res.ambiguous == (cands[5], cands[6])


@pytest.mark.unit
def test_skipped_endpoints_are_stepped_around() -> None:
    verdicts = [S, S, B, B, B, G, G, S]
    details = {"0.0.0": "UNSUPPORTED: no keep-mode pause", "0.1.0": "UNSUPPORTED: no keep-mode pause"}
    res, probe, _ = run(verdicts, details=details)
    assert res.first_new == "0.5.0" and res.last_old == "0.4.0"
    assert res.ambiguous == ()
    assert res.skipped == ("0.0.0", "0.1.0", "0.7.0")
    assert probe.calls[:5] == ["0.0.0", "0.1.0", "0.2.0", "0.7.0", "0.6.0"]


@pytest.mark.unit
def test_regression_with_leading_skips_and_proper_boundary() -> None:
    verdicts = [S, S, G, G, B, B]
    res, _, _ = run(verdicts, find="regression")
    assert res.first_new == "0.4.0" and res.last_old == "0.3.0"
    assert res.summary.startswith("first bad release: 0.4.0 (0.3.0 GOOD: ")


# --------------------------------------------------------------------------- endpoint checks


@pytest.mark.unit
@pytest.mark.parametrize(
    ("verdicts", "find"),
    [
        ([G, G, G, G], "fix"),
        ([B, B, B, B], "fix"),
        ([G, B, B, B], "fix"),
        ([B, B, B, G], "regression"),
        ([G, G, G], "regression"),
        ([B, B], "regression"),
    ],
)
def test_ill_posed_range_names_both_endpoints(verdicts: list[Verdict], find: str) -> None:
    err = raises_bisect(verdicts, find)
    n = len(verdicts)
    msg = str(err)
    assert f"--find {find}" in msg
    assert f"0.0.0 is {verdicts[0].name} (" in msg
    assert f"0.{n - 1}.0 is {verdicts[-1].name} (" in msg
    assert [r.candidate for r in err.endpoints] == ["0.0.0", f"0.{n - 1}.0"]
    assert isinstance(err, ReproError)
    assert len(err.probes) == 2  # only the endpoints were probed


@pytest.mark.unit
def test_ill_posed_message_example() -> None:
    details = {"0.20.0": "OK 10/10", "0.32.0": "OK 10/10"}
    cands = ["0.20.0", "0.25.0", "0.32.0"]
    with pytest.raises(BisectError) as exc:
        bisect(cands, FakeProbe(cands, [G, G, G], details), find="fix")
    assert str(exc.value) == (
        "ill-posed range for --find fix: 0.20.0 is GOOD (OK 10/10) and 0.32.0 is GOOD (OK 10/10); "
        "the first release must be BAD and the last GOOD"
    )


@pytest.mark.unit
def test_all_skip_lists_every_candidate_with_detail() -> None:
    details = {c: f"UNSUPPORTED: reason {c}" for c in names(4)}
    err = raises_bisect([S, S, S, S], "fix", details)
    msg = str(err)
    assert msg.startswith("every candidate was skipped: ")
    for c in names(4):
        assert f"{c} (UNSUPPORTED: reason {c})" in msg
    assert [r.candidate for r in err.skipped] == names(4)
    assert err.endpoints == ()


@pytest.mark.unit
def test_new_end_all_skipped_raises() -> None:
    err = raises_bisect([B, B, S, S], "fix")
    msg = str(err)
    assert "no GOOD release" in msg and "0.1.0, the last release that could be tested, is BAD" in msg
    assert "0.2.0" in msg and "0.3.0" in msg
    assert [r.candidate for r in err.skipped] == ["0.2.0", "0.3.0"]


@pytest.mark.unit
def test_one_runnable_candidate_raises() -> None:
    err = raises_bisect([S, B, S], "fix")
    assert "0.1.0 is BAD" in str(err)
    assert [r.candidate for r in err.skipped] == ["0.0.0", "0.2.0"]


@pytest.mark.unit
@pytest.mark.parametrize("find", ["fix", "regression"])
def test_leading_skips_then_new_state_is_not_a_boundary(find: str) -> None:
    old, new = STATES[find]
    details = {"0.0.0": "UNSUPPORTED: no keep-mode pause", "0.1.0": "UNSUPPORTED: no keep-mode pause"}
    details |= {"0.2.0": "first runnable", "0.4.0": "last"}
    err = raises_bisect([S, S, new, new, new], find, details)
    msg = str(err)
    assert msg.startswith(f"no {old.name} release in the range for --find {find}")
    assert f"0.2.0, the first release that could be tested, is {new.name} (first runnable)" in msg
    assert "0.0.0 (UNSUPPORTED: no keep-mode pause), 0.1.0 (UNSUPPORTED: no keep-mode pause)" in msg
    assert f"0.4.0 is {new.name} (last)" in msg
    assert f"the bug is already {'fixed' if find == 'fix' else 'present'} in 0.2.0" in msg
    assert [r.candidate for r in err.skipped] == ["0.0.0", "0.1.0"]
    assert all(r.result.detail.startswith("UNSUPPORTED") for r in err.skipped)
    assert [(r.candidate, r.result.verdict) for r in err.endpoints] == [("0.2.0", new), ("0.4.0", new)]


@pytest.mark.unit
def test_regression_first_runnable_bad_example() -> None:
    details = {"0.18.0": "UNSUPPORTED: no keep-mode pause", "0.19.0": "LOSS(1) in 8/10 requests"}
    cands = ["0.18.0", "0.19.0", "0.20.0", "0.21.0"]
    with pytest.raises(BisectError) as exc:
        bisect(cands, FakeProbe(cands, [S, B, B, B], details), find="regression")
    msg = str(exc.value)
    assert "no GOOD release in the range for --find regression" in msg
    assert "0.18.0 (UNSUPPORTED: no keep-mode pause)" in msg
    assert "0.19.0, the first release that could be tested, is BAD (LOSS(1) in 8/10 requests)" in msg
    assert "the bug is already present in 0.19.0" in msg


@pytest.mark.unit
def test_trailing_skips_after_old_state_is_not_a_boundary() -> None:
    err = raises_bisect([B, B, B, S, S], "fix", {"0.3.0": "UNSUPPORTED: gone"})
    msg = str(err)
    assert msg.startswith("no GOOD release in the range for --find fix")
    assert "0.0.0 is BAD" in msg and "0.2.0, the last release that could be tested, is BAD" in msg
    assert "0.3.0 (UNSUPPORTED: gone)" in msg
    assert "still present in 0.2.0" in msg
    assert [r.candidate for r in err.skipped] == ["0.3.0", "0.4.0"]


@pytest.mark.unit
def test_reversed_range_with_skips_is_ill_posed() -> None:
    err = raises_bisect([S, G, B, S], "fix")
    msg = str(err)
    assert msg.startswith("ill-posed range for --find fix: 0.1.0 is GOOD")
    assert "0.2.0 is BAD" in msg and "skipped: 0.0.0" in msg


# --------------------------------------------------------------------------- bad input


@pytest.mark.unit
def test_bad_find_names_choices() -> None:
    with pytest.raises(BadInput, match=r"'sideways'.*fix, regression"):
        bisect(["a", "b"], FakeProbe(["a", "b"], [B, G]), find="sideways")


@pytest.mark.unit
@pytest.mark.parametrize("cands", [[], ["0.21.0"]])
def test_too_few_candidates(cands: list[str]) -> None:
    with pytest.raises(BadInput, match=f"got {len(cands)}"):
        bisect(cands, FakeProbe(cands, [B] * len(cands)))


@pytest.mark.unit
def test_duplicate_candidates() -> None:
    with pytest.raises(BadInput, match=re.escape("duplicate candidate '0.21.0'")):
        bisect(["0.20.0", "0.21.0", "0.21.0"], lambda c: ProbeResult(G))


@pytest.mark.unit
def test_string_or_non_string_candidates() -> None:
    with pytest.raises(BadInput, match="'abc'"):
        bisect("abc", lambda c: ProbeResult(G))
    with pytest.raises(BadInput, match="21"):
        bisect(["0.20.0", 21], lambda c: ProbeResult(G))  # type: ignore[list-item]


@pytest.mark.unit
def test_bad_input_is_checked_before_probing() -> None:
    calls: list[str] = []
    with pytest.raises(BadInput):
        bisect(["a", "a"], lambda c: calls.append(c) or ProbeResult(G))  # type: ignore[func-returns-value]
    assert calls == []


# --------------------------------------------------------------------------- summary


@pytest.mark.unit
def test_summary_fix_example() -> None:
    cands = ["0.21.0", "0.22.0"]
    res, _, _ = run([B, G], details={"0.21.0": "LOSS(1) 8/8", "0.22.0": "OK 10/10"}, cands=cands)
    assert res.summary == "first fixed release: 0.22.0 (0.21.0 BAD: LOSS(1) 8/8; 0.22.0 GOOD: OK 10/10)"


@pytest.mark.unit
def test_summary_regression_and_ambiguous() -> None:
    cands = ["0.20.0", "0.21.0", "0.22.0", "0.23.0"]
    details = {"0.20.0": "OK 10/10", "0.23.0": "LOSS(1) 8/8", "0.21.0": "UNSUPPORTED", "0.22.0": "UNSUPPORTED"}
    res, _, _ = run([G, S, S, B], find="regression", details=details, cands=cands)
    assert res.summary == (
        "first bad release: 0.23.0 (0.20.0 GOOD: OK 10/10; 0.23.0 BAD: LOSS(1) 8/8); "
        "boundary ambiguous: 0.21.0, 0.22.0 could not be tested"
    )


@pytest.mark.unit
def test_summary_noun_and_empty_detail() -> None:
    res = bisect(["abc1", "def2"], lambda c: ProbeResult(B if c == "abc1" else G), noun="commit")
    assert res.summary == "first fixed commit: def2 (abc1 BAD; def2 GOOD)"


# --------------------------------------------------------------------------- monotone_check


def rec(i: int, v: Verdict, step: int | None = None) -> ProbeRecord:
    return ProbeRecord(index=i, candidate=f"0.{i}.0", result=ProbeResult(v, v.name.lower()), step=step or i + 1)


@pytest.mark.unit
def test_monotone_check_quiet_for_monotone_and_bisect_output() -> None:
    assert monotone_check([rec(0, B), rec(1, S), rec(2, B), rec(3, G), rec(4, G)], find="fix") == []
    assert monotone_check([]) == []
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(2, 60)
        b = rng.randint(1, n - 1)
        res, _, _ = run([B] * b + [G] * (n - b))
        assert monotone_check(res.probes, find="fix") == []


@pytest.mark.unit
def test_monotone_check_warns_on_reversal() -> None:
    records = [rec(0, B), rec(1, G), rec(2, B), rec(3, G)]
    warnings = monotone_check(records, find="fix")
    assert len(warnings) == 1
    assert "0.2.0 BAD" in warnings[0] and "0.1.0 GOOD" in warnings[0]
    # Without find, the lowest index sets the old state.
    assert monotone_check(records) == warnings
    # Regression: GOOD after BAD is the reversal.
    assert len(monotone_check([rec(0, G), rec(1, B), rec(2, G)], find="regression")) == 1
    # A range wrong way round for its mode is non-monotone for that mode.
    assert monotone_check([rec(0, G), rec(1, B)], find="fix")


@pytest.mark.unit
def test_monotone_check_flags_inconsistent_reruns() -> None:
    warnings = monotone_check([rec(0, B), rec(1, B, step=2), rec(1, G, step=5), rec(2, G)])
    assert any("inconsistent" in w and "0.1.0" in w for w in warnings)


@pytest.mark.unit
def test_monotone_check_bad_find() -> None:
    with pytest.raises(BadInput, match="fix, regression"):
        monotone_check([], find="up")
