"""One ``vllm serve`` for the server door's and the client door's cells of one engine config (issue 39's cut for
``frameworks check --door client``).

The client door of a framework whose client talks to vLLM's own server (TRL's ``VLLMClient``, SkyRL's weight-sync
client: ``repro.client.door``) starts the same server, with the same engine arguments, as the server door: the
door axis changes which code makes the pause and resume calls, not the engine.  Each door was an engine of its
own, so a client-door check started two servers per release where one does (on two CPU cores a server door's
start-up is 40-120 s: docs/performance.md).  :func:`share_server` moves the server door's cells onto the client
door's engine of the same config; there each server-door scenario is played by the harness's HTTP adapter itself
(its id says ``@server``: :func:`played_id`, ``repro.server.door``), one scenario after the other as on any engine, so a
client-door cell's precondition still reads only its own calls in the server's access log.

A framework whose client door runs its *own* server entry point (AReaL's ``areal_vllm_server.py``:
``server_main`` in the client spec) keeps two servers: the recipe's server-door cells must run on vLLM's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from harness.core.cell import Cell, EngineKey
from harness.plan.matrix import MatrixPlan

SERVER, CLIENT = "server", "client"


def shares_server(client: Mapping[str, Any] | None) -> bool:
    """Whether the run's client door drives vLLM's own server: a side environment built, no server of its own."""
    if not client:
        return False
    return bool(client.get("python")) and not client.get("server_main") and not client.get("error")


def share_server(plan: MatrixPlan, client: Mapping[str, Any] | None) -> MatrixPlan:
    """``plan`` with every server-door engine whose config has a client-door engine folded into that one."""
    if not shares_server(client):
        return plan
    groups: dict[EngineKey, tuple[Cell, ...]] = dict(plan.engines)
    for key in list(groups):
        host = cast(EngineKey, replace(cast(Any, key), door=CLIENT)) if key.door == SERVER else None
        if host is not None and host in groups:
            groups[host] = (*groups[host], *groups.pop(key))
    return replace(plan, engines=tuple(groups.items()))


def played_id(scenario_id: str, engine: EngineKey, cell: Cell) -> str:
    """The id a scenario of ``cell`` has in ``engine``'s spec and events: its own (``keep-clear``, ``#2`` for a
    repeat), and for a server-door cell on the client door's server ``@server`` after it, so the two doors' cells of
    one scenario stay apart.  The engine plays it under its own id (``repro.server.door``: the same request ids and
    seed as on a server of its own) and reports it under this one."""
    return f"{scenario_id}{GUEST}{cell.door}" if cell.door != engine.door else scenario_id


GUEST = "@"  # repro.server.door.GUEST
