"""Deliberate fault injection into a vLLM engine: ``VLLM_REPRO_INJECT=vllm#42043``.

The harness sets ``VLLM_REPRO_INJECT`` (comma-separated fault ids) for an
engine only when the user passed ``--inject``; unset or empty means no
injection, and an unknown id raises :class:`InjectError` from the plugin's
``register()`` so the engine fails to start instead of running un-injected.

``vllm#42043`` re-creates, on a vLLM that has the fix, what vLLM 0.17-0.21 did
in ``Scheduler.reset_prefix_cache(reset_running_requests=True)``: every running
request is force-preempted and marked to discard *one* output frame, whatever
is in flight (``discard_latest_async_tokens = True``), and
``AsyncScheduler._update_request_with_output`` drops the next frame of a
marked request.  After a keep-mode pause nothing is in flight, so the frame
dropped is the first real post-resume token: LOSS(1).  Two fixed code shapes
are recognised, anything else is reported not applicable (never guessed at):

* ``counter`` -- vLLM PR #42117 (0.22.0 ...): reset_prefix_cache sets
  ``request.async_tokens_to_discard = request.num_output_placeholders`` and
  AsyncScheduler drops that many frames.  Injection: set the counter back to
  1 for every request the reset preempted, i.e. revert the PR's one line.
* ``stale-accounting`` -- vLLM PR #48245 (0.27.0 ...): ``_preempt_request``
  marks ``num_in_flight_tokens`` as stale and ``update_from_output`` skips
  stale frames of a ``drop_stale_output`` preemption before they reach
  ``_update_request_with_output``.  Injection: a request the reset preempted
  with nothing in flight gets a mark, and the wrapped
  ``AsyncScheduler._update_request_with_output`` drops its next frame before
  ``super()`` runs, exactly as 0.21.0 did.  A request that still had output in
  flight is not marked: in 0.21.0 that stale frame used up the flag, and here
  vLLM already drops it.

``crash#reset`` makes vLLM's own code raise inside the engine core, for the
tests of the CRASH outcome: a cache reset that force-preempts running requests
(keep pause + clear_cache) marks them, and before the next output frame of a
marked request reaches ``AsyncScheduler._update_request_with_output`` its
``num_output_placeholders`` is set to 0, so the decrement there underflows and
vLLM's own ``assert request.num_output_placeholders >= 0`` (async_scheduler.py,
0.17-0.32; the assert PR #46066 is about) fails in the engine core's busy loop.
The engine core dies of an AssertionError raised in vLLM's code, exactly as it
would of a real scheduler bug.  Only AsyncScheduler instances are marked.

On vLLM < 0.22.0 the bug is native; nothing is patched and the probe says so.
Only ``AsyncScheduler`` instances are marked: in 0.21.0 the flag was read by
``AsyncScheduler`` alone, so with async scheduling off the fault has no effect
there either, and the probe reports it as not effective.

Every process runs ``register()``; the patch is applied when the scheduler
module is imported (in practice only in the engine-core process), and
:func:`probe` returns what this process did, for ``EngineCore.repro_probe``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ENV_INJECT = "VLLM_REPRO_INJECT"
FAULT_42043 = "vllm#42043"
FAULT_HANG_PAUSE = "hang#pause"
FAULT_CRASH_RESET = "crash#reset"
KNOWN_FAULTS: dict[str, str] = {
    FAULT_CRASH_RESET: (
        "after a cache reset that force-preempts running requests, vLLM's own AsyncScheduler assert "
        "(num_output_placeholders >= 0) fails in the engine core on their next output frame (CRASH tests)"
    ),
    FAULT_42043: (
        "force-preemption on cache reset discards one output frame per running request "
        "(vLLM <0.22.0 behaviour; fixed upstream by PR #42117)"
    ),
    FAULT_HANG_PAUSE: (
        "the engine core pauses but never acknowledges pause_scheduler, so pause_generation never returns "
        "(reliability tests: a hang must become TIMEOUT and its engine must be killed)"
    ),
}
CORE_MODULE = "vllm.v1.engine.core"

SCHED_MODULE = "vllm.v1.core.sched.scheduler"
ASYNC_SCHED_MODULE = "vllm.v1.core.sched.async_scheduler"
RESET_TARGET = f"{SCHED_MODULE}:Scheduler.reset_prefix_cache"
UPDATE_TARGET = f"{ASYNC_SCHED_MODULE}:AsyncScheduler._update_request_with_output"

SHAPE_NATIVE = "native"
SHAPE_COUNTER = "counter"
SHAPE_STALE = "stale-accounting"
SHAPE_UNKNOWN = "unknown"

# Attribute set on a vllm Request the injected reset marked (Request has no __slots__).
_MARK = "_repro_inject_42043"
_CRASH_MARK = "_repro_inject_crash"
PLACEHOLDER_ASSERT = "assert request.num_output_placeholders >= 0"
SCHED_FAULTS = (FAULT_42043, FAULT_CRASH_RESET)  # patched once vLLM's scheduler modules are imported
_MAX_FRAMES_KEPT = 64

AfterImport = Callable[[str, Callable[[Any], None]], None]


class InjectError(ValueError):
    """``VLLM_REPRO_INJECT`` names a fault this plugin does not know."""


@dataclass(frozen=True)
class CodeShape:
    """Which vLLM code shape the #42043 injection found, and why."""

    kind: str  # SHAPE_NATIVE | SHAPE_COUNTER | SHAPE_STALE | SHAPE_UNKNOWN
    reason: str


@dataclass(frozen=True)
class SchedulerSources:
    """Source text of the vLLM methods the #42043 injection depends on (None: method absent)."""

    reset: str | None  # Scheduler.reset_prefix_cache
    preempt: str | None  # Scheduler._preempt_request
    update_from_output: str | None  # Scheduler.update_from_output
    async_update: str | None  # AsyncScheduler._update_request_with_output (its own override)


def parse_faults(value: str | None) -> tuple[str, ...]:
    """The fault ids in a ``VLLM_REPRO_INJECT`` value, in order, without duplicates; raises on unknown ids."""
    if value is None:
        return ()
    out: list[str] = []
    for raw in value.split(","):
        fid = raw.strip()
        if not fid:
            continue
        if fid not in KNOWN_FAULTS:
            raise InjectError(
                f"{ENV_INJECT} names unknown fault {fid!r}; valid: {', '.join(sorted(KNOWN_FAULTS))} "
                f"(unset {ENV_INJECT} to run without injection)"
            )
        if fid not in out:
            out.append(fid)
    return tuple(out)


def classify_shape(src: SchedulerSources) -> CodeShape:
    """Recognise the vLLM code around force-preemption on cache reset (vLLM #42043)."""
    reset = src.reset
    if reset is None:
        return CodeShape(SHAPE_UNKNOWN, "Scheduler.reset_prefix_cache not found")
    if "reset_running_requests" not in reset or "self.running.pop()" not in reset \
            or "self._preempt_request(" not in reset:
        return CodeShape(SHAPE_UNKNOWN, "Scheduler.reset_prefix_cache does not force-preempt self.running "
                                        "the way vLLM 0.14-0.32 do")
    if "discard_latest_async_tokens = True" in reset:
        return CodeShape(SHAPE_NATIVE, "Scheduler.reset_prefix_cache sets discard_latest_async_tokens=True for "
                                       "every preempted request: the #42043 bug is native (fixed by PR #42117)")
    upd = src.async_update
    if upd is None:
        return CodeShape(SHAPE_UNKNOWN, "AsyncScheduler does not override _update_request_with_output")
    if "async_tokens_to_discard = request.num_output_placeholders" in reset:
        if "async_tokens_to_discard" in upd and "return [], False" in upd:
            return CodeShape(SHAPE_COUNTER, "PR #42117 shape: reset_prefix_cache sets async_tokens_to_discard = "
                                            "num_output_placeholders, AsyncScheduler drains it")
        return CodeShape(SHAPE_UNKNOWN, "reset_prefix_cache sets async_tokens_to_discard but "
                                        "AsyncScheduler._update_request_with_output does not drain it")
    if "drop_stale_output=True" in reset:
        missing = [
            what for what, ok in (
                ("_preempt_request: num_stale_output_tokens = request.num_in_flight_tokens",
                 src.preempt is not None and "num_stale_output_tokens = request.num_in_flight_tokens" in src.preempt),
                ("update_from_output: skip of drop-mode stale frames",
                 src.update_from_output is not None
                 and "output_is_stale and request.drop_stale_output" in src.update_from_output),
                ("AsyncScheduler._update_request_with_output: super() call",
                 "super()._update_request_with_output(" in upd),
            ) if not ok
        ]
        if missing:
            return CodeShape(SHAPE_UNKNOWN, "reset_prefix_cache preempts with drop_stale_output=True but "
                                            f"the stale-output accounting differs: missing {missing}")
        return CodeShape(SHAPE_STALE, "PR #48245 shape: _preempt_request marks in-flight tokens stale and "
                                      "update_from_output drops them before _update_request_with_output")
    return CodeShape(SHAPE_UNKNOWN, "reset_prefix_cache has no known async-discard logic "
                                    "(neither discard_latest_async_tokens, async_tokens_to_discard nor "
                                    "drop_stale_output)")


# --------------------------------------------------------------------------- per-process state

STATE: dict[str, Any] = {
    "pid": os.getpid(),
    "requested": [],
    "applied": {},  # fault id -> patched targets
    "native": {},  # fault id -> why nothing needed patching
    "not_applicable": {},  # fault id -> reason
    "pending": [],  # requested, scheduler module not imported in this process (yet)
    "vllm_version": None,
    "shape": None,
    "marked": 0,  # requests the injected reset marked to lose a frame
    "skipped_in_flight": 0,  # preempted with output in flight: that stale frame used the 0.21.0 flag up
    "discarded": 0,  # frames actually dropped because of the injection
    "discarded_frames": [],  # first _MAX_FRAMES_KEPT: {"request_id", "token_ids"}
    "crash_armed": 0,  # crash#reset: requests the injected reset marked to underflow their placeholder count
}


def activate(value: str | None, after_import: AfterImport) -> None:
    """Parse ``value`` (the ``VLLM_REPRO_INJECT`` env var) and arm the patches; raises InjectError on unknown ids.

    ``after_import(module_name, patch)`` must call ``patch(module)`` once the module is imported.
    """
    faults = parse_faults(value)
    STATE["pid"] = os.getpid()
    STATE["requested"] = list(faults)
    if not faults:
        return
    STATE["pending"] = list(faults)
    # The dispatch stays explicit so a new id needs a new installer.
    if any(f in faults for f in SCHED_FAULTS):
        # Either module may be imported first (the engine core imports async_scheduler, which
        # imports scheduler); install once both are fully initialised.
        after_import(SCHED_MODULE, _maybe_install_sched)
        after_import(ASYNC_SCHED_MODULE, _maybe_install_sched)
    if FAULT_HANG_PAUSE in faults:
        after_import(CORE_MODULE, _install_hang_pause)


def _install_hang_pause(core: Any) -> None:
    # Every class of the engine-core module that defines pause_scheduler (EngineCore and
    # EngineCoreProc): pause as usual, then hand back a Future nobody completes.  The busy
    # loop sends a utility call's reply only when its Future completes, so the client's
    # pause_generation() awaits forever while the engine core itself stays alive.
    from concurrent.futures import Future

    targets = []
    for name in dir(core):
        cls = getattr(core, name)
        if not isinstance(cls, type) or cls.__module__ != CORE_MODULE or "pause_scheduler" not in vars(cls):
            continue
        original = vars(cls)["pause_scheduler"]

        def hung(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            __original(self, *args, **kwargs)
            return Future()

        hung.__repro_inject__ = True  # type: ignore[attr-defined]
        cls.pause_scheduler = hung
        targets.append(f"{CORE_MODULE}:{cls.__name__}.pause_scheduler")
    if targets:
        STATE["applied"][FAULT_HANG_PAUSE] = targets
    else:
        STATE["not_applicable"][FAULT_HANG_PAUSE] = f"no pause_scheduler in {CORE_MODULE}"
    if FAULT_HANG_PAUSE in STATE["pending"]:
        STATE["pending"].remove(FAULT_HANG_PAUSE)


def probe(scheduler: Any = None) -> dict[str, Any]:
    """What the injection did in this process; with the engine core's ``scheduler``, whether it is effective."""
    out = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v) for k, v in STATE.items()}
    # Why each requested fault is not applied; the harness refuses the engine's cells on any of them.
    reasons: dict[str, str] = {}
    for fid in out["requested"]:
        if fid in out["applied"]:
            continue
        if fid in out["native"]:
            reasons[fid] = f"not injected, the bug is native here: {out['native'][fid]}"
        elif fid in out["not_applicable"]:
            reasons[fid] = f"not applicable: {out['not_applicable'][fid]}"
        else:
            reasons[fid] = f"not applied: the vLLM module it patches was never imported in pid {out['pid']}"
    out["reasons"] = reasons
    out["error"] = "; ".join(f"{fid}: {why}" for fid, why in reasons.items()) or None
    if scheduler is not None and FAULT_42043 in out["applied"]:
        out["effective"] = _effective_on(scheduler)
    return out


def _effective_on(scheduler: Any) -> dict[str, Any]:
    cls = type(scheduler)
    name = f"{cls.__module__}.{cls.__qualname__}"
    reset = getattr(cls, "reset_prefix_cache", None)
    if not getattr(reset, "__repro_inject__", False):
        return {"scheduler_class": name, "ok": False,
                "reason": f"{name} overrides reset_prefix_cache; the injected one is not used"}
    async_cls = _async_scheduler_cls()
    if async_cls is None or not isinstance(scheduler, async_cls):
        return {"scheduler_class": name, "ok": False,
                "reason": "not an AsyncScheduler: as in vLLM 0.21.0 only AsyncScheduler discards a marked frame, "
                          "so the injected fault cannot show with async scheduling off"}
    update = getattr(cls, "_update_request_with_output", None)
    if not getattr(update, "__repro_inject__", False):
        return {"scheduler_class": name, "ok": False,
                "reason": f"{name} overrides _update_request_with_output; the injected one is not used"}
    return {"scheduler_class": name, "ok": True, "reason": None}


def _async_scheduler_cls() -> type | None:
    mod = sys.modules.get(ASYNC_SCHED_MODULE)
    return getattr(mod, "AsyncScheduler", None) if mod is not None else None


def _record(fid: str, bucket: str, text: str) -> None:
    STATE[bucket][fid] = text
    if fid in STATE["pending"]:
        STATE["pending"].remove(fid)


def _own_source(cls: type, name: str) -> str | None:
    func = cls.__dict__.get(name)
    if func is None:
        return None
    return inspect.getsource(func)


def _maybe_install_sched(_module: Any) -> None:
    todo = [f for f in SCHED_FAULTS if f in STATE["pending"]]
    if not todo:
        return
    sched_mod = sys.modules.get(SCHED_MODULE)
    if sched_mod is None or not hasattr(sched_mod, "Scheduler"):
        return  # scheduler.py still executing: its own hook comes next
    async_mod = sys.modules.get(ASYNC_SCHED_MODULE)
    if async_mod is not None and not hasattr(async_mod, "AsyncScheduler"):
        return  # async_scheduler.py is importing scheduler.py right now: its hook comes next
    # Out of pending first: the installers import async_scheduler, whose hook re-enters here.
    for fid in todo:
        STATE["pending"].remove(fid)
    if FAULT_42043 in todo:
        _install_42043(sched_mod)
    if FAULT_CRASH_RESET in todo:
        _install_crash_reset(sched_mod)


def _install_crash_reset(sched_mod: Any) -> None:
    try:
        async_cls = importlib.import_module(ASYNC_SCHED_MODULE).AsyncScheduler
        sched_cls = sched_mod.Scheduler
        update_src = _own_source(async_cls, "_update_request_with_output")
        orig_reset = sched_cls.__dict__["reset_prefix_cache"]
    except Exception as exc:
        _record(FAULT_CRASH_RESET, "not_applicable", f"could not inspect the vLLM scheduler: {exc!r}")
        return
    if update_src is None or PLACEHOLDER_ASSERT not in update_src:
        _record(FAULT_CRASH_RESET, "not_applicable",
                f"AsyncScheduler._update_request_with_output has no `{PLACEHOLDER_ASSERT}` to make fail")
        return
    if "reset_running_requests" not in inspect.signature(orig_reset).parameters:
        _record(FAULT_CRASH_RESET, "not_applicable", "reset_prefix_cache has no reset_running_requests parameter")
        return
    _wrap_crash(sched_cls, async_cls)
    _record(FAULT_CRASH_RESET, "applied", f"{RESET_TARGET}, {UPDATE_TARGET} (placeholder underflow)")
    print(f"[vllm-repro] pid {os.getpid()}: INJECTED {FAULT_CRASH_RESET}: {RESET_TARGET}, {UPDATE_TARGET}",
          file=sys.stderr, flush=True)


def _wrap_crash(sched_cls: type, async_cls: type) -> None:
    orig_reset = sched_cls.__dict__["reset_prefix_cache"]
    orig_update = async_cls.__dict__["_update_request_with_output"]

    def reset_prefix_cache(self: Any, *args: Any, **kwargs: Any) -> Any:
        force = bool(_bound_arg(orig_reset, (self, *args), kwargs, "reset_running_requests"))
        victims = list(self.running) if force and isinstance(self, async_cls) else []
        result = orig_reset(self, *args, **kwargs)
        for req in victims:
            setattr(req, _CRASH_MARK, True)
            STATE["crash_armed"] += 1
        return result

    def _update_request_with_output(self: Any, request: Any, new_token_ids: list[int], *args: Any,
                                    **kwargs: Any) -> Any:
        if getattr(request, _CRASH_MARK, False) and new_token_ids:
            # One placeholder short: vLLM's own decrement underflows and its assert fails (in vLLM's frame).
            request.num_output_placeholders = 0
        return orig_update(self, request, new_token_ids, *args, **kwargs)

    for func, orig in ((reset_prefix_cache, orig_reset), (_update_request_with_output, orig_update)):
        func.__repro_inject__ = True  # type: ignore[attr-defined]
        func.__wrapped__ = orig  # type: ignore[attr-defined]
        func.__qualname__ = orig.__qualname__
    sched_cls.reset_prefix_cache = reset_prefix_cache  # type: ignore[attr-defined]
    async_cls._update_request_with_output = _update_request_with_output  # type: ignore[attr-defined]


def _install_42043(sched_mod: Any) -> None:
    try:
        import vllm

        STATE["vllm_version"] = getattr(vllm, "__version__", None)
        # A sync-scheduler engine never imports it; the probe must still say what was patched.
        async_mod = importlib.import_module(ASYNC_SCHED_MODULE)
        sched_cls = sched_mod.Scheduler
        async_cls = async_mod.AsyncScheduler
        src = SchedulerSources(
            reset=_own_source(sched_cls, "reset_prefix_cache"),
            preempt=_own_source(sched_cls, "_preempt_request"),
            update_from_output=_own_source(sched_cls, "update_from_output"),
            async_update=_own_source(async_cls, "_update_request_with_output"),
        )
    except Exception as exc:
        _record(FAULT_42043, "not_applicable", f"could not inspect the vLLM scheduler: {exc!r}")
        return
    shape = classify_shape(src)
    STATE["shape"] = {"kind": shape.kind, "reason": shape.reason}
    if shape.kind == SHAPE_NATIVE:
        _record(FAULT_42043, "native", f"vLLM {STATE['vllm_version']}: {shape.reason}; nothing patched")
        return
    if shape.kind == SHAPE_UNKNOWN:
        _record(FAULT_42043, "not_applicable", f"vLLM {STATE['vllm_version']}: code shape not recognised: "
                                               f"{shape.reason}")
        return
    try:
        _wrap(sched_cls, async_cls, shape.kind)
    except Exception as exc:
        _record(FAULT_42043, "not_applicable", f"patching failed: {exc!r}")
        return
    _record(FAULT_42043, "applied", f"{RESET_TARGET}, {UPDATE_TARGET} ({shape.kind})")
    # Loud in the engine log too: an injected run must never pass for a clean one.
    print(f"[vllm-repro] pid {os.getpid()}: INJECTED {FAULT_42043} into vLLM {STATE['vllm_version']} "
          f"({shape.kind}): {RESET_TARGET}, {UPDATE_TARGET}", file=sys.stderr, flush=True)


def _bound_arg(func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], name: str) -> Any:
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments.get(name)


def _wrap(sched_cls: type, async_cls: type, kind: str) -> None:
    orig_reset = sched_cls.__dict__["reset_prefix_cache"]
    orig_update = async_cls.__dict__["_update_request_with_output"]
    if "reset_running_requests" not in inspect.signature(orig_reset).parameters:
        raise TypeError("reset_prefix_cache has no reset_running_requests parameter")
    params = list(inspect.signature(orig_update).parameters)
    if params[:3] != ["self", "request", "new_token_ids"]:
        raise TypeError(f"_update_request_with_output parameters are {params}, expected (self, request, "
                        "new_token_ids, ...)")

    def reset_prefix_cache(self: Any, *args: Any, **kwargs: Any) -> Any:
        force = bool(_bound_arg(orig_reset, (self, *args), kwargs, "reset_running_requests"))
        # Marked only on AsyncScheduler: 0.21.0's flag was read by AsyncScheduler alone.
        victims = list(self.running) if force and isinstance(self, async_cls) else []
        result = orig_reset(self, *args, **kwargs)
        for req in victims:
            if kind == SHAPE_COUNTER:
                # Revert PR #42117: one frame, not num_output_placeholders (0 after a keep pause).
                req.async_tokens_to_discard = 1
            elif getattr(req, "num_stale_output_tokens", 0) > 0:
                # Output in flight: vLLM drops that stale frame itself, and in 0.21.0 it is the
                # frame the flag would have discarded, so the injected fault must not drop another.
                STATE["skipped_in_flight"] += 1
                continue
            setattr(req, _MARK, True)
            STATE["marked"] += 1
        return result

    def _update_request_with_output(self: Any, request: Any, new_token_ids: list[int], *args: Any,
                                    **kwargs: Any) -> Any:
        if not getattr(request, _MARK, False):
            return orig_update(self, request, new_token_ids, *args, **kwargs)
        setattr(request, _MARK, False)
        if kind == SHAPE_COUNTER:
            # vLLM's own counter (set to 1 by the injected reset) drops the frame.
            out = orig_update(self, request, new_token_ids, *args, **kwargs)
            dropped = not out[0] and bool(new_token_ids)
        else:
            # 0.21.0 AsyncScheduler: drop the frame and return before super(), so neither the token
            # nor the placeholder count changes (the scheduler's view stays self-consistent, one short).
            out = ([], False)
            dropped = bool(new_token_ids)
        if dropped:
            STATE["discarded"] += 1
            if len(STATE["discarded_frames"]) < _MAX_FRAMES_KEPT:
                STATE["discarded_frames"].append(
                    {"request_id": str(getattr(request, "request_id", "?")), "token_ids": list(new_token_ids)})
        return out

    for func, orig in ((reset_prefix_cache, orig_reset), (_update_request_with_output, orig_update)):
        func.__repro_inject__ = True  # type: ignore[attr-defined]
        func.__wrapped__ = orig  # type: ignore[attr-defined]
        func.__qualname__ = orig.__qualname__
        func.__doc__ = orig.__doc__
    sched_cls.reset_prefix_cache = reset_prefix_cache  # type: ignore[attr-defined]
    async_cls._update_request_with_output = _update_request_with_output  # type: ignore[attr-defined]
