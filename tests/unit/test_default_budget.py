"""The default cells' prompts fit their engine's step budget, so no prefill of theirs is chunked whatever the timing:
a chunked seeded request kills vLLM's CPU worker ("CPU Generator does not use offset", repro.scenarios.seeded_prefill),
which a busy machine used to provoke in the keep + clear_cache sampled cells (docs/upstream-bugs.md)."""

from __future__ import annotations

import pytest

from harness.core.profiles import PROFILES
from harness.core.scenarios import SCENARIO_TABLE, default_scenarios
from harness.frontends.commands.options import add_run_options
from harness.run.spec import SAMPLED_SHAPE
from repro.engine.main import engine_kwargs
from repro.scenarios._common import SinglePauseParams
from repro.scenarios.sampling import GROUP_SIZE
from repro.scenarios.vocab import MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS

pytestmark = pytest.mark.unit


def _cli_defaults() -> dict[str, int]:
    import argparse

    p = argparse.ArgumentParser()
    add_run_options(p, "reports")
    args = p.parse_args([])
    return {"num_requests": args.num_requests, "max_tokens": args.max_tokens}


def worst_prefill(shape: dict[str, int], max_tokens: int, group: int) -> int:
    """Tokens a keep + clear_cache resume may prefill in one step: every child of every group recomputing its prompt
    and all it can have generated (the extra groups too, as if they had run)."""
    prompt = SinglePauseParams().prompt_len
    return (shape["num_requests"] + shape["extra_requests"]) * group * (prompt + max_tokens)


def test_the_sampled_pause_cells_fit_the_engine_budget() -> None:
    cli = _cli_defaults()
    sampled = [s for s in SCENARIO_TABLE if "sampled" in s.requests and s.name in default_scenarios("cpu")]
    assert [s.name for s in sampled] == ["pause"]  # the default run's only seeded cells
    for s in sampled:
        budget = PROFILES[s.profile].args.get("max_num_batched_tokens", MAX_NUM_BATCHED_TOKENS)
        need = worst_prefill(SAMPLED_SHAPE, cli["max_tokens"], GROUP_SIZE)
        assert need == 864
        assert need <= budget, (s.name, need, budget)
        assert SinglePauseParams().prompt_len + cli["max_tokens"] <= MAX_MODEL_LEN


def test_the_old_budget_did_not_hold_a_late_pause() -> None:
    # What the load showed: 12 running children paused at 14+ tokens and 4 new ones exceed 256 tokens.
    assert 12 * (SinglePauseParams().prompt_len + 14) + 4 * SinglePauseParams().prompt_len > 256
    assert worst_prefill(SAMPLED_SHAPE, _cli_defaults()["max_tokens"], GROUP_SIZE) > 256


def test_the_engine_starts_with_the_budget() -> None:
    from types import SimpleNamespace

    eng = SimpleNamespace(axes={}, gpu_memory_utilization=None, extra={})
    model = SimpleNamespace(source="/m", defaults={})
    kwargs = engine_kwargs(SimpleNamespace(engine=eng), model)  # type: ignore[arg-type]
    assert kwargs["max_num_batched_tokens"] == MAX_NUM_BATCHED_TOKENS == 1024
    assert kwargs["max_num_seqs"] <= MAX_NUM_BATCHED_TOKENS  # vLLM requires it
