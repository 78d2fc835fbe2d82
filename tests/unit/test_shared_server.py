"""One server for the server door's and the client door's cells of one engine config (harness.plan.shared_server,
issue 39's cut for ``frameworks check --door client``): which engines fold, what the spec tells the engine, and how
the engine plays a server-door cell on the client door's server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.plan.matrix import plan_cells
from harness.plan.shared_server import share_server
from harness.run.spec import RunConfig, build_spec

pytestmark = pytest.mark.unit

TRL = {"framework": "trl", "version": "1.16.0", "python": "/env/bin/python"}
AREAL = {**TRL, "framework": "areal", "server_main": "/env/areal_vllm_server.py"}
CELLS = [Cell(version=v, door=d, scenario=s) for v in ("0.21.0", "0.22.0") for d in ("client", "server", "engine")
         for s in ("pause", "weight-sync")]


def _doors(plan: Any) -> list[tuple[str, str, list[str]]]:
    return [(k.version, k.door, sorted({c.door for c in cs})) for k, cs in plan.engines]


def test_the_server_doors_cells_fold_into_the_client_doors_engine_of_the_same_config() -> None:
    plan = share_server(plan_cells(CELLS, "cpu"), TRL)
    assert _doors(plan) == [("0.21.0", "client", ["client", "server"]), ("0.21.0", "engine", ["engine"]),
                            ("0.22.0", "client", ["client", "server"]), ("0.22.0", "engine", ["engine"])]
    assert sorted(plan.cells) == sorted(CELLS)  # every cell still runs, once


@pytest.mark.parametrize("client", [None, AREAL, {"framework": "trl", "error": "installing trl failed"}])
def test_no_fold_without_a_client_on_vllms_own_server(client: dict[str, str] | None) -> None:
    """AReaL's client door runs AReaL's own server entry point: the recipe's server-door cells need vLLM's."""
    assert len(share_server(plan_cells(CELLS, "cpu"), client).engines) == 6


def test_a_server_door_cell_on_the_client_engine_keeps_its_seed_and_is_told_apart_by_its_id(tmp_path: Path) -> None:
    """The slow path's scenario (parameters, seed, and the id the engine plays it under), reported as ``@server``;
    the run's results map each event back to its own cell (harness.run.runner's ``by_scenario``)."""
    from harness.run.spec import scenario_spec

    ((key, cells), *_) = share_server(plan_cells(CELLS, "cpu"), TRL).engines
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path, client=TRL, repeat=2)
    spec = build_spec(key, cells, cfg)
    assert len({sc.id for sc in spec.scenarios}) == len(spec.scenarios) == 2 * len(cells)
    for c in cells:
        alone = scenario_spec(c, cfg, 2)  # on a server of its own (the slow path)
        shared = scenario_spec(c, cfg, 2, key)
        assert (shared.scenario, shared.params, shared.seed) == (alone.scenario, alone.params, alone.seed)
        assert shared.id == (f"{alone.id}@server" if c.door == "server" else alone.id)
    assert {sc.id for sc in spec.scenarios if "@" in sc.id} == {"keep-clear@server", "keep-clear#2@server",
                                                                 "weight_sync-keep-clear@server",
                                                                 "weight_sync-keep-clear#2@server"}
    assert spec.client == TRL
    from harness.run.runner import _EngineCells

    by_scenario = _EngineCells(key, cells, cfg, None).by_scenario
    assert sorted(by_scenario) == sorted(sc.id for sc in spec.scenarios)
    assert by_scenario["keep-clear@server"].door == "server" and by_scenario["keep-clear"].door == "client"


class _Http:
    def __init__(self) -> None:
        self.played: list[str] = []


class _ClientLLM:
    """As repro.client.door.ClientLLM: the HTTP adapter under ``http``, a precondition added to its events."""

    def __init__(self, http: _Http) -> None:
        self.http = http

    def scenario_emit(self, forward: Any) -> Any:
        return lambda kind, **f: forward(kind, precondition="client", **f)


def _play(monkeypatch: pytest.MonkeyPatch, sid: str) -> tuple[bool, dict[str, Any]]:
    from repro.server import door as server_door

    seen: dict[str, Any] = {}

    async def run_cell(llm: Any, sc: dict[str, Any], ctx: Any, timeout: float, problem: str | None, emit: Any
                       ) -> None:
        seen.update(llm=llm, played=sc["id"])
        emit("scenario", id=sc["id"])

    monkeypatch.setattr(server_door, "run_cell", run_cell)
    http = _Http()
    events: list[dict[str, Any]] = []
    asyncio.run(server_door._play(_ClientLLM(http), {"id": sid, "scenario": "keep", "params": {}}, None, 1.0,
                                  None, "0.21.0", lambda kind, **f: events.append(f)))
    return seen["llm"] is http, {**seen, "event": events[0]}


def test_the_engine_plays_a_server_door_cell_with_the_harness_adapter_not_the_framework_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    by_http, seen = _play(monkeypatch, "keep-clear#2@server")
    assert by_http and seen["played"] == "keep-clear#2" and seen["event"] == {"id": "keep-clear#2@server"}
    by_http, seen = _play(monkeypatch, "keep-clear")
    assert not by_http and seen["event"] == {"id": "keep-clear", "precondition": "client"}


def test_a_client_that_cannot_start_leaves_the_server_door_cells_to_the_http_adapter(tmp_path: Path) -> None:
    from repro.server import door as server_door

    ((key, cells), *_) = share_server(plan_cells(CELLS, "cpu"), TRL).engines
    spec = build_spec(key, cells, RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path, client=TRL))
    given: list[tuple[str, ...]] = []

    def failing(s: Any, http: Any, url: str, log: Path, emit: Any) -> None:
        given.append(tuple(sc.id for sc in s.scenarios))  # it answers (UNSUPPORTED/ERROR) only its own door's

    http = _Http()
    llm, left = server_door._adapt(failing, spec, http, "u", Path("."), print)
    assert llm is http and [sc.id for sc in left] == ["keep-clear@server", "weight_sync-keep-clear@server"]
    assert given == [("keep-clear", "weight_sync-keep-clear")]
    assert server_door._adapt(lambda *a: "client", spec, http, "u", Path("."), print) == ("client", spec.scenarios)
