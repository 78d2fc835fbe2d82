"""The ``vllm-repro`` commands, one module each; ``COMMANDS`` is the registry the parser is built from."""

from __future__ import annotations

from harness.commands.base import Command
from harness.commands.bisect import BisectCommand
from harness.commands.compare import CompareCommand
from harness.commands.envs import EnvsCommand
from harness.commands.fuzz import FuzzCommand
from harness.commands.history import HistoryCommand
from harness.commands.matrix import MatrixCommand
from harness.commands.plan import PlanCommand
from harness.commands.report import ReportCommand
from harness.commands.wheelhouse import WheelhouseCommand
from harness.commands.windows import WindowsCommand
from harness.commands.workarounds import WorkaroundsCommand

# In the order of `vllm-repro --help`.
COMMANDS: tuple[Command, ...] = (
    MatrixCommand(),
    BisectCommand(),
    WorkaroundsCommand(),
    PlanCommand(),
    FuzzCommand(),
    ReportCommand(),
    HistoryCommand(),
    WindowsCommand(),
    CompareCommand(),
    WheelhouseCommand(),
    EnvsCommand(),
)
