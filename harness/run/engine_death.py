"""Why an engine died, in one line: vLLM's root cause from the engine's own log, not its pointer to it.

When the engine core process fails at start, the front end (``AsyncLLM``) raises only ``RuntimeError: Engine
core initialization failed. See root cause above. Failed core proc(s): {}`` (``vllm/v1/engine/utils.py``
``wait_for_engine_startup``, 0.14-0.33); the cause, e.g. ``torch.distributed.DistNetworkError: The server socket
has failed to listen on any local network address ... EADDRINUSE`` (issue 21), is the engine core's traceback in
``engine.log``, often dozens of lines above the log's last lines.  :func:`death_reason` puts it first.
"""

from __future__ import annotations

from pathlib import Path

from repro.core.rootcause import read_tail, root_cause

TAIL_LINES = 8


def log_tail(path: Path, n: int = TAIL_LINES) -> str:
    """The last ``n`` lines of ``path`` joined by `` | `` (each cut to 200 characters)."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(ln.strip()[:200] for ln in lines[-n:])


def log_cause(log: Path) -> str | None:
    """The innermost exception line of the last failure ``log`` shows (:func:`repro.core.rootcause.root_cause`)."""
    return root_cause(read_tail(log))


def with_cause(dead: str, log: Path) -> str | None:
    """``dead`` with the root cause ``log`` names put first and the log's path, or None when the log shows none
    that ``dead`` does not already say."""
    cause = log_cause(log)
    if cause is None:
        return None
    if cause in dead:
        return f"{dead}; log: {log}"
    return f"{cause} (root cause in the engine log; then {dead}); log: {log}"


def death_reason(dead: str, log: Path, when: str = "before this scenario reported") -> str:
    """``dead`` (the engine's last word: its ``fatal`` event, or its exit code) ``when``, with the root cause its
    log names first; without a traceback in the log, its last lines instead."""
    return with_cause(f"{dead} {when}", log) or f"{dead} {when}; last log lines: {log_tail(log)}"
