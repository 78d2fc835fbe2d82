"""The ``vllm-repro`` commands, one module each; ``COMMANDS`` is the registry the parser is built from."""

from __future__ import annotations

from harness.frontends.commands.bench import BenchCommand
from harness.frontends.commands.bisect import BisectCommand
from harness.frontends.commands.command import Command
from harness.frontends.commands.compare import CompareCommand
from harness.frontends.commands.envs import EnvsCommand
from harness.frontends.commands.frameworks import FrameworksCommand
from harness.frontends.commands.fuzz import FuzzCommand
from harness.frontends.commands.history import HistoryCommand
from harness.frontends.commands.matrix import MatrixCommand
from harness.frontends.commands.plan import PlanCommand
from harness.frontends.commands.releases import ReleasesCommand
from harness.frontends.commands.report import ReportCommand
from harness.frontends.commands.upstream_report import UpstreamReportCommand
from harness.frontends.commands.wheelhouse import WheelhouseCommand
from harness.frontends.commands.windows import WindowsCommand
from harness.frontends.commands.workarounds import WorkaroundsCommand

# In the order of `vllm-repro --help`.
COMMANDS: tuple[Command, ...] = (
    MatrixCommand(),
    BisectCommand(),
    WorkaroundsCommand(),
    FrameworksCommand(),
    PlanCommand(),
    FuzzCommand(),
    ReportCommand(),
    HistoryCommand(),
    ReleasesCommand(),
    WindowsCommand(),
    UpstreamReportCommand(),
    CompareCommand(),
    WheelhouseCommand(),
    EnvsCommand(),
    BenchCommand(),
)
