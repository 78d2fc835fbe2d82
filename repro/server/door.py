"""The server door of an engine process: the cells of one engine config played over ``vllm serve``'s HTTP API.

``repro.engine.main`` calls :func:`run_server_door` for a spec whose ``door`` axis is ``server``: it starts one
server (``repro.server.serve_process``; its module per release: ``repro.core.server_layout``) with the engine door's own
engine arguments (``repro.engine.main.engine_kwargs``, as flags checked by vLLM's parser: ``repro.server.args``), waits
for it, proves its *effective* settings through
the harness's probe route exactly as the engine door proves its own
(``repro.settings.effective.effective_settings``), and
plays every scenario the server door can play (``repro.server.endpoints.SCENARIOS``; the others are UNSUPPORTED
with the reason) with the same drivers and ``run_cell`` as the engine door, on the HTTP adapter
(``repro.server.http_llm``); a gated spec first waits for its turn (harness.run.turns), so its scenarios decode
alone while the next engine starts up.  The server is ended with the engine process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from repro.core.rootcause import read_tail, tracebacks
from repro.core.server_layout import LayoutError, server_main
from repro.core.wire import Spec, stdin_scenarios, wait_go
from repro.models.kinds import LoadedModel
from repro.scenarios.cell_run import run_cell
from repro.scenarios.vocab import EngineContext
from repro.server.args import ArgMappingError, serve_argv
from repro.server.endpoints import scenario_problem
from repro.server.serve_process import Server, ServerDied, host, server_port
from repro.settings.core_view import plain_kwargs
from repro.settings.effective import effective_settings, read_view, refused_setting

Emit = Callable[..., None]
DEFAULT_STARTUP_TIMEOUT = 900.0  # harness.run.spec's engine_timeout default, for a spec that carries none


def _no_second_engine(_: Path) -> Any:
    raise RuntimeError("door=server starts no second engine in the engine process")


async def _play(llm: Any, sc: dict[str, Any], ctx: EngineContext, timeout: float, unsupported: str | None,
                version: str, emit: Emit) -> None:
    """One scenario through the door: UNSUPPORTED where the door or the release cannot play it; on the client
    door its event carries the client's precondition (``repro.client.door.ClientLLM.scenario_emit``)."""
    if guest_of(sc["id"]):
        # A server-door cell on the client door's server (harness.plan.shared_server): played under its own id by the
        # harness's HTTP adapter, as on a server of its own (the framework's client is not used), reported under
        # the id the harness gave it.
        llm, sc, emit = getattr(llm, "http", llm), {**sc, "id": sc["id"].partition(GUEST)[0]}, _as(sc["id"], emit)
    problem = unsupported or scenario_problem(sc["scenario"], version, sc.get("params") or {})
    if hasattr(llm, "scenario_emit"):
        emit = llm.scenario_emit(emit)
    await run_cell(llm, sc, ctx, timeout, problem, emit)


GUEST = "@"  # harness.plan.shared_server.played_id: "keep-clear@server", a server-door cell on a client-door server


def guest_of(scenario_id: str) -> str:
    """The door of a scenario played on another door's server ("server"), else ""."""
    return scenario_id.partition(GUEST)[2]


def _as(scenario_id: str, forward: Emit) -> Emit:
    """``forward`` with the scenario's event under ``scenario_id`` (the harness's id for it)."""
    def renamed(kind: str, **fields: Any) -> None:
        forward(kind, **{**fields, "id": scenario_id} if kind == "scenario" else fields)

    return renamed


def _refused_client(spec: Spec, refuse_all: Callable[[str], None]) -> bool:
    """``matrix --door client`` names no framework: its cells are UNSUPPORTED, and no server is started."""
    if spec.engine.axes.get("door") != "client" or spec.client:
        return False
    refuse_all("door=client needs a framework's client (vllm-repro frameworks check --door client --framework "
               "NAME builds its side environment)")
    return True


def _client_server_main(spec: Spec) -> str | None:
    """The client door of a framework whose own server drives vLLM (AReaL): its entry point's file, else None."""
    if spec.engine.axes.get("door") != "client" or not spec.client:
        return None
    return spec.client.get("server_main") or None


def http_adapter(spec: Spec, http: Any, url: str, log_dir: Path, emit: Emit) -> Any:
    """The server door's adapter: the scenarios drive the HTTP one itself.  (The client door passes
    ``repro.client.door.client_adapter``: the framework's own client around it.)"""
    return http


# What the scenarios drive, made from the HTTP adapter once the server's settings are proved; None: nothing
# can be played (the adapter has emitted every scenario's event itself).
Adapter = Callable[[Spec, Any, str, Path, Emit], Any]


def _context(spec: Spec, model: LoadedModel, llm: Any) -> EngineContext:
    vocab = model.vocab_size or int(getattr(llm.vllm_config.model_config, "vocab_size", 0) or 0)
    return EngineContext(
        model_spec=model.spec, model_dir=Path(model.source), perm=model.perm, model_cache=Path(spec.model_cache),
        work_dir=Path.cwd(), tensor_parallel_size=spec.engine.tensor_parallel_size,
        start_engine=_no_second_engine, model_kind=model.kind, vocab_size=vocab)


def prompt_tokens_details(spec: Spec) -> list[str]:
    """``--enable-prompt-tokens-details`` when a scenario judges requests by their prefix-cache hit (stale-kv):
    the usage chunk then says it (``repro.server.http_llm.chunk_cached_tokens``); a front-end flag, no engine one."""
    return ["--enable-prompt-tokens-details"] if any(sc.scenario.startswith("stale_kv_") for sc in spec.scenarios) \
        else []


async def run_server_door(spec: Spec, model: LoadedModel, kwargs: dict[str, Any], info: dict[str, Any],
                          requested: dict[str, Any], emit: Emit, refuse_all: Callable[[str], None],
                          log_dir: Path, sources: dict[str, str] | None = None,
                          adapter: Adapter = http_adapter) -> None:
    """Start the server for ``spec``, prove its settings, play the scenarios; the server ends with it."""
    import httpx

    from repro.server.http_llm import HttpLLM, ServerError

    if _refused_client(spec, refuse_all):
        return
    port = server_port()
    try:
        module = server_main()
        flags = serve_argv(kwargs, host(), port) + prompt_tokens_details(spec)
    except (ArgMappingError, LayoutError) as exc:
        refuse_all(f"door=server: {exc}")
        return
    t0 = time.monotonic()
    server = Server.start(module, flags, port, log_dir / "server.log", script=_client_server_main(spec))
    facts = {"url": server.url, "pid": server.proc.pid, "log": str(server.log), "argv": server.argv}
    try:
        # No proxy from the environment: the server is on loopback, and a proxy would see the dev endpoints.
        async with httpx.AsyncClient(trust_env=False, timeout=None) as client:
            try:
                await server.wait_healthy(client, spec.startup_timeout or DEFAULT_STARTUP_TIMEOUT)
            except ServerDied as exc:
                refused = refused_setting(requested, exc, tracebacks(read_tail(server.log)))
                if refused is None:
                    raise RuntimeError(str(exc)) from None
                refuse_all(f"{refused} (server log: {server.log})")
                return
            http = HttpLLM(client, server.url, str(info["vllm_version"]), model.source, lambda: server.alive)
            llm = http
            startup = round(time.monotonic() - t0, 3)
            try:
                probe = await llm.probe()
            except ServerError as exc:
                # No probe route (the shim not loaded in the server?): the settings are not proved, so every
                # cell is UNSUPPORTED with effective_settings' reason, which names this.
                probe = {"probe_error": str(exc)}
            view, view_error = await read_view(llm)  # the engine core's settings view, over the utility route
            eff, reason = effective_settings(requested, probe, view, plain_kwargs(kwargs), sources, view_error)
            emit("engine", **info, requested=requested, effective=eff, probe=probe, startup_s=startup,
                 unsupported_reason=reason, server=facts)
            scenarios = spec.scenarios
            if reason is None:
                llm, scenarios = _adapt(adapter, spec, http, server.url, log_dir, emit)
            await _wait_turn(server, emit, spec.gate)
            ctx = _context(spec, model, llm)
            version = str(info["vllm_version"])
            for sc in scenarios:
                await _play(llm, sc.to_json(), ctx, spec.scenario_timeout, reason, version, emit)
            if spec.interactive:
                await _serve_stdin(llm, ctx, spec.scenario_timeout, reason, version, emit)
            await llm.close()
    finally:
        server.stop()


def _adapt(adapter: Adapter, spec: Spec, http: Any, url: str, log_dir: Path, emit: Emit) -> tuple[Any, Sequence[Any]]:
    """What the scenarios drive, and the scenarios left to play.  An adapter that cannot run (a client door whose
    client did not start) has emitted its own door's scenarios; the server-door cells sharing its server
    (harness.plan.shared_server) are still played, by the HTTP adapter, as on a server of their own."""
    guests = tuple(sc for sc in spec.scenarios if guest_of(sc.id))
    llm = adapter(replace(spec, scenarios=tuple(sc for sc in spec.scenarios if sc not in guests)), http, url, log_dir,
                  emit)
    return (http, guests) if llm is None else (llm, spec.scenarios)


async def _wait_turn(server: Server, emit: Emit, gated: bool = True) -> None:
    """A gated engine (``Spec.gate``, harness.run.turns): its server started up and its client opened beside other
    engines; the scenarios run when the harness gives it its turn, so they decode alone as on the engine door."""
    if not gated:
        return
    waited = time.monotonic()
    await wait_go()
    emit("turn", waited_s=round(time.monotonic() - waited, 3))
    if not server.alive:
        raise RuntimeError(f"the server died while it waited for its turn: {server.death()}")


async def _serve_stdin(llm: Any, ctx: EngineContext, timeout: float, unsupported: str | None, version: str,
                       emit: Emit) -> None:
    """Session mode, as ``repro.engine.main._serve_stdin``: scenarios as JSON lines on stdin until EOF or STOP."""
    async for sc in stdin_scenarios():
        await _play(llm, sc.to_json(), ctx, sc.timeout if sc.timeout is not None else timeout, unsupported,
                    version, emit)