"""``vllm-repro``: the entry point; the commands live in :mod:`harness.frontends.commands`, one module each."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys

from harness import __version__
from harness.core.errors import ReproError
from harness.frontends.commands import COMMANDS
from harness.frontends.commands.command import HANDLER, Command, register
from harness.frontends.commands.face import Interrupted
from harness.frontends.commands.invocation import Context


def build_parser() -> argparse.ArgumentParser:
    """The ``vllm-repro`` parser, one sub-parser per registered command."""
    parser = argparse.ArgumentParser(
        prog="vllm-repro",
        description="Reproduce vLLM #42043 (first post-resume token lost under async scheduling) across a "
        "matrix of vLLM versions, executors, async on/off, pause modes and clear_cache.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-repro {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        register(sub, command)
    return parser


@functools.cache
def _parser() -> argparse.ArgumentParser:
    # Built once per process: parsing never changes the parser, and its defaults read nothing from the
    # environment (the context resolves those at run time), so one build serves every call of main.
    return build_parser()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``vllm-repro`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    command: Command = getattr(args, HANDLER)
    try:
        code = command.run(Context(args, tuple(argv)), args)
        # Flushed here, not at interpreter exit: a reader that went away after the last full buffer shows up
        # inside the handler below instead of as "Exception ignored ... BrokenPipeError" and exit 120.
        sys.stdout.flush()
        return code
    except ReproError as exc:
        print(f"vllm-repro: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted:
        return 130
    except BrokenPipeError:
        # The reader went away (``vllm-repro frameworks report ... | head``): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again (Python's documented recipe, "Note on
        # SIGPIPE" in the signal module's docs).
        with contextlib.suppress(OSError, ValueError):  # stdout is no file descriptor (a test's capture)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by it


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
