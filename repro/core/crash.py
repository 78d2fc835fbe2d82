"""Where vLLM's own code raised: the crash site of an exception, and the engine core's crash report.

A scenario that makes vLLM's own code raise has found something about vLLM (outcome CRASH), unlike one
that failed because the harness, the environment or the machine did (ERROR).  Both tiers tell them apart
the same way:

* the scheduler tier (``repro.sched``) catches the exception in-process;
* on the engine tier the exception is raised in the engine-core process, which logs "EngineCore
  encountered a fatal error." and tells the client it is dead (``EngineDeadError``); the client never
  sees the traceback.  :func:`install_engine_core_hook` wraps ``EngineCoreProc._send_engine_dead`` (vLLM
  0.17-0.32 call it exactly once, inside the ``except`` of ``run_engine_core`` that caught the fatal
  exception) to write a crash report first, to the file ``$VLLM_REPRO_CRASH_FILE`` names;
  ``repro.scenarios.cell_run`` reads it when the engine died under a scenario.

An exception counts as vLLM's own when the innermost frame of its traceback that is vLLM's or ours is
vLLM's (:func:`raised_in_vllm`), and it is not one vLLM raises to report that a process or the machine
failed (a worker killed by the OOM killer surfaces as ``RuntimeError: Executor failed.``): :func:`infra_cause`.

Standard library only: imported inside vLLM environments (engine core, scheduler tier) and by the
harness's unit tests.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ENV_CRASH_FILE = "VLLM_REPRO_CRASH_FILE"
CORE_MODULE = "vllm.v1.engine.core"
REPRO_ROOT = str(Path(__file__).resolve().parent)  # our own code: the (staged) repro package

# What vLLM raises, or lets through, when a process or the machine failed rather than its own logic.
_INFRA_TYPES = {"OutOfMemoryError": "out of memory", "MemoryError": "out of memory"}
_INFRA_MESSAGES = (
    (re.compile(r"out of memory|Cannot allocate memory", re.I), "out of memory"),
    (re.compile(r"Executor failed|died unexpectedly", re.I), "a vLLM worker process died"),
    (re.compile(r"ECC error|No space left on device|Too many open files", re.I), "the machine failed"),
)


def vllm_crash_site(exc: BaseException) -> tuple[str, str] | None:
    """(``vllm/...py:line:function``, its source line) of the innermost frame inside the vllm package."""
    found = None
    for fr in traceback.extract_tb(exc.__traceback__):
        rel = vllm_relative(fr.filename)
        if rel is not None:
            found = (f"{rel}:{fr.lineno}:{fr.name}", (fr.line or "").strip())
    return found


def innermost_vllm_frame(exc: BaseException) -> str | None:
    """``file:line:function`` of the innermost traceback frame inside the vllm package, or None."""
    site = vllm_crash_site(exc)
    return None if site is None else site[0]


def vllm_relative(filename: str) -> str | None:
    """``vllm/v1/core/sched/scheduler.py`` for a file inside a vllm package, else None."""
    parts = Path(filename).parts
    if "vllm" not in parts:
        return None
    return str(Path(*parts[len(parts) - parts[::-1].index("vllm") - 1:]))


def raised_in_vllm(exc: BaseException, ours: Sequence[str] = (REPRO_ROOT,)) -> bool:
    """The exception left vLLM's code last: walking from the innermost frame out, a vllm frame comes before
    any frame of ours (files under ``ours``).  Libraries vLLM called (torch) are passed over."""
    roots = tuple(str(Path(o).resolve()) for o in ours)
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        if vllm_relative(fr.filename) is not None:
            return True
        if str(Path(fr.filename).resolve()).startswith(roots):
            return False
    return False


def infra_cause(exception_type: str, message: str) -> str | None:
    """Why an exception vLLM passed on is the machine's or a process's failure, not vLLM's logic; else None."""
    if exception_type in _INFRA_TYPES:
        return _INFRA_TYPES[exception_type]
    for pattern, why in _INFRA_MESSAGES:
        if pattern.search(message):
            return why
    return None


def crash_report(exc: BaseException, ours: Sequence[str] = (REPRO_ROOT,)) -> dict[str, Any]:
    """What the harness needs to judge a fatal exception: where vLLM raised it, and whether that is a finding."""
    site = vllm_crash_site(exc)
    kind, message = type(exc).__name__, str(exc)
    return {
        "exception_type": kind,
        "message": message,
        "vllm_frame": site[0] if site else None,
        "vllm_source": site[1] if site else None,
        "in_vllm": site is not None and raised_in_vllm(exc, ours),
        "infra": infra_cause(kind, message),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "pid": os.getpid(),
    }


def scenario_fields(report: dict[str, Any], where: str = "the engine core") -> dict[str, Any]:
    """The ``scenario`` event fields of a crash report: status ``crash`` when vLLM's own code raised (a
    finding), else ``error`` (the harness or the machine failed), with the reason either way."""
    what = f"{report['exception_type']}: {report['message'] or report.get('vllm_source') or 'no message'}"
    fields = {"traceback": report.get("traceback") or "", "exception_type": report["exception_type"],
              "message": report["message"]}
    if report.get("in_vllm") and not report.get("infra"):
        return {**fields, "status": "crash", "vllm_frame": report["vllm_frame"],
                "vllm_source": report.get("vllm_source") or "",
                "reason": f"{where} died: {what} at {report['vllm_frame']}"}
    why = f" ({report['infra']})" if report.get("infra") else " (raised outside vLLM's code)"
    return {**fields, "status": "error", "reason": f"{where} died: {what}{why}"}


def write_report(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    """Write ``report`` atomically; the first report of a process group wins (later ones are consequences)."""
    dst = Path(path)
    if dst.exists():
        return
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, dst)


def claim_report(path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The crash report at ``path`` if there is one not claimed yet (then it is marked claimed), else None."""
    if not path:
        return None
    src = Path(path)
    claimed = src.with_name(src.name + ".claimed")
    try:
        os.replace(src, claimed)
    except FileNotFoundError:
        return None
    try:
        return dict(json.loads(claimed.read_text()))
    except (OSError, ValueError):
        return None


def install_engine_core_hook(core: Any) -> list[str]:
    """Wrap ``_send_engine_dead`` of every class of vLLM's engine-core module defining it: write a crash report
    of the exception being handled, then go on as vLLM does.  Returns the targets wrapped."""
    targets = []
    for name in dir(core):
        cls = getattr(core, name)
        if not isinstance(cls, type) or cls.__module__ != CORE_MODULE or "_send_engine_dead" not in vars(cls):
            continue
        original = vars(cls)["_send_engine_dead"]
        if getattr(original, "__repro_crash__", False):
            continue

        def send_engine_dead(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            record_fatal_exception()
            return __original(self, *args, **kwargs)

        send_engine_dead.__repro_crash__ = True  # type: ignore[attr-defined]
        send_engine_dead.__wrapped__ = original  # type: ignore[attr-defined]
        cls._send_engine_dead = send_engine_dead
        targets.append(f"{CORE_MODULE}:{cls.__name__}._send_engine_dead")
    return targets


def record_fatal_exception() -> None:
    """Called while vLLM handles the engine core's fatal exception: report it where the env says (never raises:
    vLLM must go on telling the client it is dead)."""
    path = os.environ.get(ENV_CRASH_FILE)
    exc = sys.exc_info()[1]
    if not path or exc is None:
        return
    try:
        write_report(path, crash_report(exc))
    except Exception as err:  # pragma: no cover - a full disk, say: vLLM's own logging still has it
        print(f"[vllm-repro] could not write the crash report to {path}: {err!r}", file=sys.stderr, flush=True)
