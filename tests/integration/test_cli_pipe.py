"""The CLI as a pipe's writer: a reader that went away (``vllm-repro frameworks list | head -1``) ends it quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [
    ["frameworks", "list"],  # ~15 KB: the first full buffer (8 KB) is written inside the command
    ["frameworks", "list", "--framework", "areal"],  # ~1.5 KB: written only by the last flush, as the CLI exits
])
def test_a_closed_pipe_is_no_traceback(argv: list[str]) -> None:
    # The pipe's read end is closed before the CLI starts, so every write fails with EPIPE, whatever the timing.
    # Block-buffered stdout, as a user's shell gives it (tox does not pass PYTHONUNBUFFERED on; a developer's shell
    # may set it, and then every print would be written, and fail, inside the command).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        cli = subprocess.run([sys.executable, "-m", "harness.frontends.cli", *argv], cwd=ROOT,
                             stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, check=False, env=env)
    finally:
        os.close(write_end)
    assert cli.returncode == 141, cli.stderr
    assert "Traceback" not in cli.stderr and "BrokenPipeError" not in cli.stderr, cli.stderr
