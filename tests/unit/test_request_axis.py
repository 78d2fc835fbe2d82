"""The request axis (issue 34): ids, the CLI, where sampled cells run, the spec they send, the engine side's
seeds and logprob table, and the workaround verdict per request kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.axes import REQUESTS
from harness.core.cell import Cell, parse_cell_id
from harness.core.oracle import Outcome
from harness.core.profiles import REQUEST_PROFILES
from harness.frontends.cli import build_parser, main
from harness.frontends.commands.matrix import matrix_axes, matrix_explicit
from harness.plan.matrix import MatrixPlan, Selection, parse_option, plan_cells, unsupported_reason
from harness.run.spec import RunConfig, scenario_spec
from harness.verdicts.results import CellResult
from harness.verdicts.workarounds import WorkaroundStatus, workaround_verdicts
from repro.models.deterministic import BigramCycleSpec, build_checkpoint, cycle_permutation
from repro.scenarios.sampling import (
    GROUP_SIZE,
    REQUEST_KINDS,
    SEED_STRIDE,
    engine_ids_match,
    logprob_table,
    model_logprobs,
    sampling_kwargs,
)

pytestmark = pytest.mark.unit

GREEDY = Cell("0.21.0", "mp", True, "keep", True)
SAMPLED = GREEDY.replace(request="sampled")


def test_ids_keep_greedy_unchanged_and_spell_sampled() -> None:
    assert GREEDY.id == "vllm0.21.0-mp-async_on-keep-clear"
    assert SAMPLED.id == "vllm0.21.0-mp-async_on-keep-clear-sampled"
    assert parse_cell_id(SAMPLED.id) == SAMPLED and Cell.from_dict(SAMPLED.to_dict()) == SAMPLED
    assert "request" not in GREEDY.to_dict()


def test_sampled_cells_share_the_greedy_engine() -> None:
    plan = plan_cells([GREEDY, SAMPLED, GREEDY.replace(mode="wait", request="sampled")], "cpu")
    assert [(k.id, len(cs)) for k, cs in plan.engines] == [(GREEDY.engine.id, 3)]


def test_bad_request_kind_exits_2_naming_the_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--request", "nonsense"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'nonsense'" in err
    assert all(k in err for k in ("greedy", "sampled", "penalties", "structured"))


@pytest.mark.parametrize(("cell", "words"), [
    (SAMPLED.replace(tier="scheduler"), "scripts the model's outputs"),
    (SAMPLED.replace(scenario="weight-sync"),
     "realised by the pause, spec-draft, unseeded-prefill, seeded-prefill and decode"),
    (SAMPLED.replace(door="client"), "engine and server doors"),
])
def test_where_sampled_cannot_run_it_is_unsupported_with_the_reason(cell: Cell, words: str) -> None:
    reason = unsupported_reason(cell, "cpu")
    assert reason is not None and words in reason
    assert unsupported_reason(SAMPLED, "cpu") is None
    # The built-in checkpoints carry a tokenizer (repro.models.tokenizer): the server door returns logprobs.
    assert unsupported_reason(SAMPLED.replace(door="server"), "cpu") is None


def test_the_spec_names_the_request_kind_only_off_greedy(tmp_path: Path) -> None:
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path)
    assert scenario_spec(SAMPLED, cfg).params["request"] == "sampled"
    assert "request" not in scenario_spec(GREEDY, cfg).params
    assert scenario_spec(SAMPLED, cfg).id == "keep-clear-sampled"


def test_every_child_seed_is_distinct_across_the_requests_of_a_scenario() -> None:
    seeds = [sampling_kwargs("sampled", i, 4321)["seed"] + k for i in range(64) for k in range(GROUP_SIZE)]
    assert len(set(seeds)) == len(seeds) and SEED_STRIDE > GROUP_SIZE
    # What the stride avoids: base + i seeds share child seeds across prompts (vLLM seeds child k with seed + k).
    naive = [1000 + i + k for i in range(4) for k in range(GROUP_SIZE)]
    assert len(set(naive)) < len(naive)
    assert sampling_kwargs("greedy", 3, 1) == {"temperature": 0.0}
    with pytest.raises(ValueError, match="greedy, sampled"):
        sampling_kwargs("nonsense", 0, 0)


def test_engine_child_ids_match_their_stream() -> None:
    assert engine_ids_match("2_keep-r03-1a2b3c4d", "keep-r03", 2)
    assert engine_ids_match("2_keep-r03", "keep-r03", 2)
    assert not engine_ids_match("2_keep-r03-1a2b3c4d", "keep-r03", 1)
    assert not engine_ids_match("2_keep-r03-1a2b3c4d", "keep-r03", None)
    assert engine_ids_match("keep-r03-1a2b3c4d", "keep-r03", None)


def test_the_logprob_table_is_the_models_spread_distribution(tmp_path: Path) -> None:
    spec = BigramCycleSpec()  # the cells' model: 512 tokens (a smaller vocabulary is far more peaked)
    table = logprob_table(build_checkpoint(spec, tmp_path))
    perm = cycle_permutation(spec.vocab_size, spec.seed)
    import numpy as np

    assert np.allclose(np.exp(table).sum(axis=1), 1.0)
    assert [int(row.argmax()) for row in table] == perm  # greedy walks the cycle
    top = np.exp(table.max(axis=1))
    assert top.min() > 0.7 and top.max() < 0.85  # spread: sampling leaves the cycle about once in five tokens
    assert model_logprobs(table, [5, 7], [perm[7], 9]) == [round(float(table[7][perm[7]]), 6),
                                                            round(float(table[perm[7]][9]), 6)]


def _cr(cell: Cell, outcome: Outcome) -> CellResult:
    return CellResult(cell, outcome, "LOSS(1) in 32/40 requests" if outcome is Outcome.LOSS else "OK", label="x")


def _default_plan(*argv: str) -> MatrixPlan:
    """The plan of ``vllm-repro matrix --versions 0.21.0,0.32.0 ARGV`` on cpu."""
    args = build_parser().parse_args(["matrix", *argv])
    sel = Selection(versions=("0.21.0", "0.32.0"), explicit=matrix_explicit(args, "cpu"),
                    **matrix_axes(args, "cpu"))
    return plan_cells(sel.cells(), "cpu")


def test_the_default_matrix_sends_sampled_where_a_scenario_realises_it_and_nowhere_else() -> None:
    """`tox -e repro` (issue 34 item 5): sampled cells on the pause scenario's engines, no UNSUPPORTED row for a
    request kind nobody named (the other scenarios, the scheduler tier, the client door)."""
    plan = _default_plan()
    runnable = [c for _, cs in plan.engines for c in cs]
    sampled = [c for c in runnable if c.request == "sampled"]
    # 2 versions x async on/off x (keep, wait, abort) x clear_cache true/false, all on the mp engines
    assert len(sampled) == 24 and {c.scenario for c in sampled} == {"pause"}
    assert {c.engine for c in sampled} <= {c.engine for c in runnable if c.request == "greedy"}
    assert not [r for _, r in plan.unsupported if "request" in r]
    assert {c.scenario for c in runnable if c.request == "greedy"} > {"pause", "weight-sync", "preempt"}
    assert not [c for c in _default_plan("--tier", "scheduler").cells if c.request != "greedy"]
    server = _default_plan("--door", "server", "--scenario", "pause").cells
    assert {c.request for c in server} == {"greedy", "sampled"}
    assert {c.request for c in _default_plan("--request", "greedy").cells} == {"greedy"}


def test_a_named_request_kind_is_unsupported_where_no_scenario_sends_it() -> None:
    plan = _default_plan("--request", "sampled", "--scenario", "pause,weight-sync", "--executor", "mp")
    assert {c.scenario for _, cs in plan.engines for c in cs} == {"pause"}
    reasons = {c.scenario: r for c, r in plan.unsupported}
    assert set(reasons) == {"weight-sync"}
    assert "realised by the pause, spec-draft, unseeded-prefill, seeded-prefill and decode" in reasons["weight-sync"]


def test_the_pytest_items_stay_greedy_unless_named() -> None:
    """The plugin's suite test counts its items (tests/integration/test_pytest_suite.py): no sampled ones."""
    a = Cell.table().by_name["request"]
    assert parse_option(a, None, "cpu", per_platform=False) == ("greedy",)
    assert parse_option(a, None, "cpu") == parse_option(a, None, "cuda") == ("greedy", "sampled")


def test_the_workaround_verdict_is_per_request_kind() -> None:
    greedy = [_cr(GREEDY, Outcome.OK), _cr(GREEDY.replace(async_on=False), Outcome.OK)]
    sampled = [_cr(SAMPLED, Outcome.LOSS), _cr(SAMPLED.replace(async_on=False), Outcome.OK)]
    for cells in (greedy + sampled, sampled + greedy):
        g, s = workaround_verdicts(cells)
        assert (g.request, g.status) == ("greedy", WorkaroundStatus.REMOVABLE)
        assert (s.request, s.status, s.where) == ("sampled", WorkaroundStatus.NEEDED, "0.21.0 sampled")
        assert set(s.cell_ids) == {SAMPLED.id, SAMPLED.replace(async_on=False).id}
    (only,) = workaround_verdicts(greedy)
    assert only.where == "0.21.0"
    pen = [_cr(c.replace(request="penalties"), o) for c, o in ((GREEDY, Outcome.LOSS), (GREEDY.replace(async_on=False),
                                                                                       Outcome.OK))]
    assert [v.request for v in workaround_verdicts(pen + sampled + greedy)] == ["greedy", "sampled", "penalties"]


class _LP:
    def __init__(self, logprob: float) -> None:
        self.logprob = logprob


class _Comp:
    def __init__(self, index: int, token: int, last: bool) -> None:
        self.index, self.token_ids = index, [token]
        self.logprobs = [{token: _LP(-0.1 * token)}]
        self.finish_reason = "length" if last else None


class _Out:
    def __init__(self, comp: _Comp) -> None:
        self.outputs = [comp]


class _Params:
    def __init__(self, **kw: object) -> None:
        self.kw = kw


class _GroupEngine:
    """Yields each child's tokens as AsyncLLM does for an n > 1 request: one output per child and step."""

    def __init__(self) -> None:
        self.engine_core = self
        self.params: list[dict[str, object]] = []

    async def call_utility_async(self, name: str) -> dict[str, dict[str, int]]:
        return {"1_g-r00-1a2b3c4d": {"num_output_tokens": 3}}

    async def generate(self, prompt: dict[str, list[int]], sp: _Params, request_id: str):  # type: ignore[no-untyped-def]
        self.params.append(sp.kw)
        n, max_tokens = int(str(sp.kw["n"])), int(str(sp.kw["max_tokens"]))
        for i in range(max_tokens):
            for k in range(n):
                yield _Out(_Comp(k, 10 * k + i, i + 1 == max_tokens))


def test_the_driver_records_each_child_with_its_logprobs_and_maps_the_engine_ids() -> None:
    import asyncio

    from repro.scenarios.driver import Driver
    from repro.scenarios.vocab import Plan, RequestSpec

    engine = _GroupEngine()
    spec = RequestSpec("g-r00", [1, 2], 3, sampling=sampling_kwargs("sampled", 0, 7))
    driver = Driver(engine, Plan([spec], []), 5.0, _Params, "DELTA")
    records = asyncio.run(driver.run())
    assert [r["rid"] for r in records] == [f"g-r00.c{k}" for k in range(GROUP_SIZE)]
    assert records[2]["observed"] == [20, 21, 22] and records[2]["logprobs"] == [-2.0, -2.1, -2.2]
    assert {(r["group"], r["n"], r["finish_reason"]) for r in records} == {("g-r00", GROUP_SIZE, "length")}
    assert engine.params[0]["seed"] == 7_000_000 and engine.params[0]["temperature"] == 1.0
    assert asyncio.run(driver._engine_progress()) == {"g-r00.c1": {"num_output_tokens": 3}}


@pytest.mark.parametrize("kind", REQUESTS[1:])
def test_every_request_kind_of_the_axis_reaches_ids_the_spec_the_engine_side_and_an_engine(kind: str,
                                                                                          tmp_path: Path) -> None:
    """The axis (harness.core.axes.REQUESTS) is the one table; each kind it names is spelled in ids, sent in the
    spec, known to the engine side (repro.scenarios.sampling) and planned onto its profile's engine."""
    cell = GREEDY.replace(request=kind)
    assert cell.id == f"{GREEDY.id}-{kind}" and parse_cell_id(cell.id) == cell
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path)
    assert scenario_spec(cell, cfg).params["request"] == kind
    assert kind in REQUEST_KINDS
    assert sampling_kwargs(kind, 0, 1, perm=[*range(1, 512), 0])["n"] == GROUP_SIZE
    [(key, _)] = plan_cells([cell], "cpu").engines
    assert key.profile == REQUEST_PROFILES.get(kind, "default")
    shared = len(plan_cells([GREEDY, cell], "cpu").engines) == 1
    assert shared is (kind not in REQUEST_PROFILES)  # on the greedy cells' engine unless its profile differs
