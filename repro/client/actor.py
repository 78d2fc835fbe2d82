"""The client door of a framework whose own code builds vLLM's engine and drives it in-process (OpenRLHF).

OpenRLHF 0.11.2 never talks to vLLM over HTTP: its ``RolloutRayActor`` (``openrlhf/trainer/ray/vllm_engine.py``)
is a Ray actor that builds its own ``AsyncLLMEngine`` (= ``AsyncLLM``) from engine arguments and awaits its
``pause_generation(mode="keep")`` and ``resume_generation()``.  So the door runs in the engine process, not in a
side process: :func:`load_wrapper` puts the side environment's site-packages (the released wheel, installed
``--no-deps``) after the vLLM environment's on ``sys.path``, imports the framework's module with the stand-ins of
``repro.client.clients.STANDINS`` (``repro.client.side.load``) and takes them out of ``sys.modules`` again;
:func:`build` makes the actor as Ray makes an async actor (the instance, then its ``async __init__`` awaited) from
the cell's engine arguments, and :class:`ActorLLM` is what the scenarios drive: their pause and resume are the
actor's own methods, everything else (completions, the progress probe, the harness's weight reload) is the
actor's own ``AsyncLLM``'s.

The precondition (:func:`actor_precondition`, strict) replaces the server's access log with the engine's own
record of its calls: ``AsyncLLM.pause_generation``/``resume_generation`` are wrapped on the actor's engine to note
each call's keyword arguments and the caller's ``file:line``, so the cell is judged only when every pause and
resume the engine saw came from the framework's file (``Client.caller``) with the arguments its code passes, as
many as the door asked of the actor.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from repro.client.clients import CLIENTS, Client, standins
from repro.client.door import ClientUnavailable, engine_problems, judged_precondition
from repro.scenarios.vocab import ScenarioUnsupported

Emit = Callable[..., None]
RAY_ADDRESS = "none:repro-client-door"  # the "environment" stand-in's value (no Ray cluster exists)
ENGINE_CALLS = ("pause_generation", "resume_generation")


def in_process(spec_client: Mapping[str, Any] | None) -> bool:
    """Whether the spec's client is a framework wrapper that runs in the engine process."""
    client = CLIENTS.get(str((spec_client or {}).get("framework")))
    return client is not None and client.in_process


def _standin_names(client: Client) -> tuple[str, ...]:
    return tuple(s.module for s in standins(client.framework) if s.kind == "module")


def load_wrapper(spec_client: Mapping[str, Any]) -> tuple[Client, Any, dict[str, Any]]:
    """The framework's wrapper class imported from its side environment, and what was imported;
    ClientUnavailable with the reason when it cannot be."""
    from repro.client.side import load

    if spec_client.get("error"):
        raise ClientUnavailable(str(spec_client["error"]), unsupported=bool(spec_client.get("unsupported")))
    client = CLIENTS[str(spec_client["framework"])]
    site = str(spec_client.get("site") or "")
    here = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not site or not Path(site).is_dir():
        raise ClientUnavailable(f"{client.package}'s side environment has no site-packages {site!r}")
    if Path(site).parent.name != here:
        raise ClientUnavailable(f"{client.package}'s side environment is {Path(site).parent.name}, the engine's "
                                f"interpreter {here}: its files cannot be imported here", unsupported=True)
    if site not in sys.path:
        sys.path.append(site)  # after the vLLM environment's: vllm, torch and the rest come from it
    before = set(sys.modules)
    try:
        cls, facts = load(client)
    except Exception as exc:
        raise ClientUnavailable(f"importing {client.module} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        # The stand-ins served the framework's import only: vLLM's own `import ray` checks must find no ray.
        for name in set(sys.modules) - before:
            if any(name == m or m.startswith(name + ".") for m in _standin_names(client)):
                del sys.modules[name]
    return client, cls, {**facts, "site": site}


async def build(client: Client, cls: Any, engine_kwargs: dict[str, Any]) -> Any:
    """The framework's actor, built as Ray builds an async actor: the instance, then its ``__init__`` awaited, with
    the cell's engine arguments and ``client.init``'s (the wrapper's own)."""
    import json

    env = [s.module for s in standins(client.framework) if s.kind == "environment"]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(dict.fromkeys(env, RAY_ADDRESS))
    try:
        actor = cls.__new__(cls)
        await cls.__init__(actor, **json.loads(client.init or "{}"), **engine_kwargs)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return actor


class ActorLLM:
    """What the scenarios drive on the in-process client door: the actor's own pause and resume, its engine's
    everything else; the engine's pause and resume calls recorded with their caller."""

    def __init__(self, actor: Any, client: Client, facts: dict[str, Any], want_async: bool) -> None:
        self.actor, self.client, self.facts, self.want_async = actor, client, facts, want_async
        self.calls: list[dict[str, Any]] = []  # the door's calls of the actor's methods
        self.seen: list[dict[str, Any]] = []  # the engine's pause/resume calls, with their caller
        self.who = f"{client.framework} {facts.get('version')} {client.module}.{client.cls}"
        for name in ENGINE_CALLS:
            self._record(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.actor.llm, name)

    def _record(self, name: str) -> None:
        real = getattr(self.actor.llm, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)  # the frame that called the engine: the framework's file, or not
            self.seen.append({"call": name, "kwargs": {k: repr(v) for k, v in kwargs.items()},
                              "caller": f"{caller.f_code.co_filename}:{caller.f_lineno}"})
            return real(*args, **kwargs)

        setattr(self.actor.llm, name, recorded)  # an instance attribute: this engine only

    async def _call(self, engine_call: str) -> None:
        import time

        method = str(self.client.method(engine_call))
        t0 = time.time()
        try:
            await getattr(self.actor, method)()
        except Exception as exc:
            self.calls.append({"ok": False, "method": method, "error": f"{type(exc).__name__}: {exc}", "t0": t0,
                               "t1": time.time()})
            raise RuntimeError(f"{self.client.cls}.{method}() raised: {type(exc).__name__}: {exc}") from exc
        self.calls.append({"ok": True, "method": method, "t0": t0, "t1": time.time()})

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        c = self.client
        if (mode, clear_cache) != (c.pause_mode, c.pause_clear_cache):
            raise ScenarioUnsupported(
                f"door=client: {c.framework}'s {c.cls}.pause_generation() calls {c.pause_sent} (mode={c.pause_mode}, "
                f"clear_cache={str(c.pause_clear_cache).lower()}, AsyncLLM's default); this cell asks mode={mode} "
                f"clear_cache={str(clear_cache).lower()}")
        await self._call("pause_generation")

    async def resume_generation(self) -> None:
        await self._call("resume_generation")

    def scenario_emit(self, forward: Emit) -> Emit:
        """``emit`` with this scenario's precondition added to its ``scenario`` event (judged only when met)."""
        self.calls, self.seen = [], []

        def wrapped(kind: str, **fields: Any) -> None:
            if kind == "scenario" and fields.get("status") == "ran":
                fields["precondition"] = actor_precondition(
                    self.client, fields.get("records") or [], self.calls, self.seen, fields.get("probe_after") or {},
                    self.who, self.want_async)
                fields["client"] = {**self.facts, "calls": list(self.calls), "engine_calls": list(self.seen)}
            forward(kind, **fields)  # a pass-through: the event named by its caller

        return wrapped


def _from_framework(client: Client, seen: Mapping[str, Any]) -> bool:
    return str(seen.get("caller", "")).rsplit(":", 1)[0].endswith(client.caller)


def _as_sent(client: Client, seen: Mapping[str, Any]) -> bool:
    """The engine call carries what the framework's code passes: the pause its mode, clear_cache left at the
    default (repr'd keyword arguments as recorded); the resume nothing."""
    kw = dict(seen.get("kwargs") or {})
    if seen.get("call") == "resume_generation":
        return not kw
    return kw.get("mode") == repr(client.pause_mode) and kw.get("clear_cache", repr(True)) == repr(
        client.pause_clear_cache)


def actor_precondition(client: Client, records: Sequence[Mapping[str, Any]], calls: Sequence[Mapping[str, Any]],
                       seen: Sequence[Mapping[str, Any]], probe_after: Mapping[str, Any], who: str = "",
                       want_async: bool = True) -> dict[str, Any]:
    """The in-process client door's precondition (strict): async as the cell asks inside EngineCore, requests
    in flight when the framework's pause returned, and every engine pause/resume made by the framework's file
    with its own arguments, as many as the door asked of the actor."""
    problems, core_text, held = engine_problems(records, probe_after, want_async, "held frozen by the keep pause")
    made = {m: sum(1 for c in calls if c.get("ok") and c.get("method") == client.method(m)) for m in ENGINE_CALLS}
    own = {m: sum(1 for s in seen if s.get("call") == m and _from_framework(client, s) and _as_sent(client, s))
           for m in ENGINE_CALLS}
    stray = [f"{s.get('call')}({s.get('kwargs')}) from {s.get('caller')}" for s in seen
             if not (_from_framework(client, s) and _as_sent(client, s))]
    if not all(made.values()):
        problems.append(f"the framework's actor made {made['pause_generation']} pause and "
                        f"{made['resume_generation']} resume call(s)")
    if own != made:
        problems.append(f"the engine saw {own['pause_generation']}x {client.pause_sent} and "
                        f"{own['resume_generation']}x {client.resume_sent} from {client.caller}; the actor was asked "
                        f"{made['pause_generation']} and {made['resume_generation']}")
    if stray:
        problems.append(f"the engine saw pause/resume calls the framework's code did not make: {'; '.join(stray)}")
    where = sorted({str(s.get("caller", "")).split("site-packages/")[-1] for s in seen if _from_framework(client, s)})
    evidence = (f"{core_text}; {len(held)} request(s) in flight at the pause; engine calls: "
                f"{own['pause_generation']}x {client.pause_sent}, {own['resume_generation']}x {client.resume_sent}, "
                f"from {', '.join(where) or client.caller}")
    return judged_precondition(client, problems, evidence, who)


def open_actor(spec_client: Mapping[str, Any] | None, want_async: bool
               ) -> Callable[[dict[str, Any]], Any]:
    """The engine starter of the in-process client door (``repro.engine.main``): imports the framework's wrapper
    now (ClientUnavailable with the reason), builds it from the engine arguments when called."""
    client, cls, facts = load_wrapper(spec_client or {})

    async def start(engine_kwargs: dict[str, Any]) -> ActorLLM:
        return ActorLLM(await build(client, cls, engine_kwargs), client, facts, want_async)

    return start
