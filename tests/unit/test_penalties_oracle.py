"""The penalties request kind (issue 34): the processed logprob of every delivered token computed from the weights on
the delivered history (repro.scenarios.sampling.TableModel), and the oracle failing when vLLM penalised a stale
history (the async ``-1`` placeholder of the token in flight, which vLLM's penalties ignore)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from harness.core.cell import Cell
from harness.core.oracle import Outcome, cell_verdict
from harness.core.oracle.sampled import LOGPROB_TOL
from harness.core.recorded_streams import stream_records
from harness.plan.matrix import plan_cells
from repro.models.deterministic import BigramCycleSpec, build_checkpoint
from repro.scenarios.sampling import PENALTIES, TableModel, logit_table, penalised, sampling_kwargs

pytestmark = pytest.mark.unit

N, LEN, PAUSE = 4, 40, 8
PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> TableModel:
    return TableModel(logit_table(build_checkpoint(BigramCycleSpec(), tmp_path_factory.mktemp("m"))), processed=True)


def _log_softmax(x: Any) -> Any:
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def _sample(model: TableModel, sampling: dict[str, Any], seed: int) -> list[int]:
    """A stream sampled from the penalised distribution on its own (true) history."""
    rng, toks = np.random.default_rng(seed), []
    for _ in range(LEN):
        prev = toks[-1] if toks else PROMPT[-1]
        p = np.exp(_log_softmax(penalised(model.logits[prev], PROMPT, toks, sampling)))
        toks.append(int(rng.choice(len(p), p=p / p.sum())))
    return toks


def _stale(model: TableModel, tokens: list[int], sampling: dict[str, Any]) -> list[float]:
    """What vLLM would return had it penalised each step without the token before it (an unresolved placeholder)."""
    prev = [PROMPT[-1], *tokens[:-1]]
    return [float(_log_softmax(penalised(model.logits[p], PROMPT, tokens[:max(i - 1, 0)], sampling))[t])
            for i, (p, t) in enumerate(zip(prev, tokens, strict=True))]


def _child(model: TableModel, k: int, delivered: list[float] | None = None) -> dict[str, Any]:
    sampling = sampling_kwargs("penalties", 0, 7)
    toks = _sample(model, sampling, k)
    table = model.logprobs(PROMPT, toks, sampling)
    return {"rid": f"r00.c{k}", "prompt": PROMPT, "max_tokens": LEN, "submit": "start", "observed": toks,
            "reference": toks, "reference_repeat": list(toks), "finish_reason": "length", "error": None,
            "pauses": [{"k": 0, "mode": "keep", "clear_cache": True, "client_tokens": PAUSE, "frozen": True}],
            "group": "r00", "child": k, "n": N, "sampling": sampling,
            "logprobs": list(table) if delivered is None else delivered, "model_logprobs": table,
            "reference_logprobs": list(table), "reference_model_logprobs": table}


def test_penalties_requests_carry_the_penalties_of_a_sampled_group() -> None:
    kw = sampling_kwargs("penalties", 2, 5)
    assert {k: kw[k] for k in PENALTIES} == PENALTIES and kw["n"] == N and kw["logprobs"] == 1
    assert {k: v for k, v in kw.items() if k not in PENALTIES} == sampling_kwargs("sampled", 2, 5)


def test_the_processed_logprob_follows_vllms_penalty_rules(model: TableModel) -> None:
    """repetition over prompt and output (divide where positive, multiply where not), frequency per count, presence
    once, on the raw logits (vllm/model_executor/layers/utils.py apply_penalties, vllm/_custom_ops.py)."""
    row = model.logits[5]
    hist = [7, 7, 9]
    out = penalised(row, [3, 4], hist, PENALTIES)
    rep = PENALTIES["repetition_penalty"]
    for t in (3, 7, 9):
        raw = row[t] / rep if row[t] > 0 else row[t] * rep
        assert out[t] == pytest.approx(raw - PENALTIES["frequency_penalty"] * hist.count(t)
                                       - PENALTIES["presence_penalty"] * (t in hist))
    assert out[100] == row[100]
    assert model.logprobs([3, 4], [7], {}) == TableModel(model.logits, processed=False).logprobs([3, 4], [7], {})


def test_penalties_on_the_true_history_pass(model: TableModel) -> None:
    # vLLM's float32 arithmetic: measured within 2.8e-6 of the table for raw logprobs; allow the same here.
    group = [_child(model, k) for k in range(N)]
    group[1]["logprobs"] = [x + 3e-6 for x in group[1]["model_logprobs"]]
    v = cell_verdict(stream_records(group))
    assert v.outcome is Outcome.OK, v


def test_penalties_applied_to_a_stale_history_are_logprob_shift(model: TableModel) -> None:
    """The proof that the oracle can fail: the same tokens, their logprobs penalised without the last token."""
    sampling = sampling_kwargs("penalties", 0, 7)
    stale = _stale(model, _sample(model, sampling, 2), sampling)
    group = [_child(model, k) for k in range(N)]
    group[2] = _child(model, 2, delivered=stale)
    diffs = [abs(a - b) for a, b in zip(stale, group[2]["model_logprobs"], strict=True)]
    assert max(diffs) > 10 * LOGPROB_TOL  # the fault is far above the tolerance somewhere in the stream
    v = cell_verdict(stream_records(group))
    assert v.outcome is Outcome.LOGPROB_SHIFT, v
    (bad,) = [r for r in v.requests if r.outcome is not Outcome.OK]
    first = next(i for i, d in enumerate(diffs) if d > LOGPROB_TOL)
    assert bad.rid == "r00.c2" and bad.verdict.at == first and "another history" in bad.verdict.detail


def test_penalties_cells_run_on_an_engine_with_processed_logprobs() -> None:
    greedy = Cell("0.21.0", "mp", True, "keep", True)
    plan = plan_cells([greedy, greedy.replace(request="sampled"), greedy.replace(request="penalties")], "cpu")
    profiles = {k.profile: [c.request for c in cs] for k, cs in plan.engines}
    assert profiles == {"default": ["greedy", "sampled"], "processed-logprobs": ["penalties"]}
