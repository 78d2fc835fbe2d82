"""Console rendering shared by the commands: consoles, outcome colours, and Ctrl-C/SIGTERM handling."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from harness.bisect.search import ProbeRecord


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run; ``main`` exits 130 after the runner's cleanup."""


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def interruptible(console: Console, where: str) -> Iterator[None]:
    """Turn Ctrl-C and SIGTERM inside the block into ``Interrupted``, saying where the partial results are."""
    # SIGTERM takes the same path as Ctrl-C: the runner's cleanup kills the
    # running engine's process group before the CLI exits.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    except KeyboardInterrupt as exc:
        console.print(f"[yellow]interrupted; {where}[/]")
        raise Interrupted(where) from exc
    finally:
        signal.signal(signal.SIGTERM, previous)


def stdout_console() -> Console:
    """The console for tables on stdout."""
    from rich.console import Console

    # Logs and CI consoles are not terminals: rich would squeeze the table to 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=170)


def stderr_console() -> Console:
    """The console for progress lines on stderr."""
    from rich.console import Console

    return Console(stderr=True)


def colour(outcome: str) -> str:
    """The rich colour of an outcome."""
    return {"OK": "green", "UNSUPPORTED": "yellow", "ERROR": "magenta", "TIMEOUT": "magenta"}.get(outcome, "red")


def probe_printer(console: Console) -> Callable[[ProbeRecord], None]:
    """Each bisect probe as one line on ``console`` as it comes (``bisect`` and ``frameworks bisect``)."""
    from rich.markup import escape

    def on_probe(p: ProbeRecord) -> None:
        tint = {"GOOD": "green", "BAD": "red"}.get(p.result.verdict.value, "yellow")
        console.print(f"  probe {p.step}: {p.candidate} -> [{tint}]{p.result.verdict.value}[/] "
                      f"({escape(p.result.detail)})")

    return on_probe
