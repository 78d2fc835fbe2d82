"""The harness's probe routes inside a ``vllm serve`` it started (the server door): not a framework door.

Installed by ``repro.patches.shim`` in the API-server process when ``VLLM_REPRO_SERVER_PROBE=1`` (set only by
``repro.server.serve_process`` for the server it starts, which binds 127.0.0.1 only).  vLLM's HTTP API has no way to ask
the engine core what the engine door asks it (``repro.settings.effective.probe_engine``: the scheduler class, the
effective async setting; ``repro_request_progress`` at a pause, to synchronise the driver), so these routes
forward exactly those calls to the server's own ``AsyncLLM`` (``app.state.engine_client``):

* ``GET /repro/probe``: ``repro.settings.effective.probe_engine`` of the server's engine, plus the config sections the
  scenarios read (``vllm_config.cache_config``/``scheduler_config``/``model_config``, JSON-able fields only);
* ``POST /repro/utility/{name}``: ``engine_core.call_utility_async(name)`` for the shim's ``repro_*``
  utilities only (no other engine-core method is reachable through it).

They are added by wrapping ``build_app`` in the server's main module (``repro.core.server_layout.SERVER_MAIN``:
``vllm.entrypoints.openai.api_server`` 0.12-0.28, ``vllm.entrypoints.launchers.api_server.entry`` 0.29-0.33),
whose ``run_server_worker``/``build_and_serve`` look it up by module global (0.22.0 ``api_server.py:157``;
0.32.0 ``launchers/api_server/entry.py:137``).  A build_app that never runs leaves the probe route missing, and
the door then refuses every cell (``repro.settings.effective.effective_settings``: settings not proved).
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route functions' annotations to tell the
# ``Request`` parameter from a query parameter, and ``Request`` is imported inside ``_add_routes``.
import os
from typing import Any

ENV_SERVER_PROBE = "VLLM_REPRO_SERVER_PROBE"
CONFIG_SECTIONS = ("cache_config", "scheduler_config", "model_config", "parallel_config")


def wanted() -> bool:
    return os.environ.get(ENV_SERVER_PROBE) == "1"


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def config_view(vllm_config: Any) -> dict[str, dict[str, Any]]:
    """The JSON-able fields of the config sections the scenarios read."""
    out: dict[str, dict[str, Any]] = {}
    for name in CONFIG_SECTIONS:
        section = getattr(vllm_config, name, None)
        fields = getattr(section, "__dict__", {}) if section is not None else {}
        out[name] = {k: v for k, v in fields.items() if not k.startswith("_") and _plain(v)}
    return out


def _add_routes(app: Any) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse

    from repro.settings.effective import probe_engine

    @app.get("/repro/probe")
    async def repro_probe(request: Request) -> JSONResponse:
        llm = request.app.state.engine_client
        return JSONResponse({"probe": await probe_engine(llm), "config": config_view(llm.vllm_config)})

    @app.post("/repro/utility/{name}")
    async def repro_utility(name: str, request: Request) -> JSONResponse:
        if not name.startswith("repro_"):
            return JSONResponse({"error": f"{name} is not a repro utility"}, status_code=404)
        llm = request.app.state.engine_client
        return JSONResponse({"result": await llm.engine_core.call_utility_async(name)})


def install(module: Any, state: dict[str, Any]) -> None:
    """Wrap ``module.build_app`` so every app it builds carries the probe routes."""
    build = getattr(module, "build_app", None)
    if getattr(build, "__repro_wrapped__", False):
        return  # one module object reached twice (as __main__ and by name): one set of routes
    if build is None:
        state["problems"].append(f"{getattr(module, '__name__', module)} has no build_app: no server probe routes")
        return

    def build_app(*args: Any, **kwargs: Any) -> Any:
        app = build(*args, **kwargs)
        _add_routes(app)
        state["server_probe_routes"] = True
        return app

    build_app.__repro_wrapped__ = True  # type: ignore[attr-defined]
    module.build_app = build_app
