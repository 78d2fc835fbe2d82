"""What a command is, and how a list of them becomes sub-parsers that dispatch by lookup."""

from __future__ import annotations

import argparse
from typing import Any, ClassVar

from harness.frontends.commands.invocation import Context

# The namespace attribute each leaf parser sets to its command: main() calls its run().
HANDLER = "handler"


class Command:
    """One ``vllm-repro`` command (or one ACTION of a command group): its options and a thin run()."""

    name: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str | None] = None

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this command's options to its own parser."""

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        """Do the command; the exit code."""
        raise NotImplementedError


class CommandGroup(Command):
    """A command whose ACTION picks one of several sub-commands (``envs list|build|prune``)."""

    actions: ClassVar[tuple[Command, ...]]

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest=f"{self.name}_command", required=True, metavar="ACTION")
        for action in self.actions:
            register(sub, action)


def register(sub: argparse._SubParsersAction[Any], command: Command) -> argparse.ArgumentParser:
    """Add ``command``'s parser to ``sub``; a leaf records itself in the namespace for dispatch."""
    parser: argparse.ArgumentParser = sub.add_parser(command.name, help=command.help,
                                                     description=command.description)
    if not isinstance(command, CommandGroup):
        parser.set_defaults(**{HANDLER: command})
    command.setup_arguments(parser)
    return parser
