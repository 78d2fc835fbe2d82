"""The CLI as a pipe's writer: a reader that stops early (``vllm-repro frameworks list | head -1``) ends it quietly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_pipe_is_no_traceback() -> None:
    cli = subprocess.Popen([sys.executable, "-m", "harness.frontends.cli", "frameworks", "list"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert cli.stdout is not None and cli.stderr is not None
    first = cli.stdout.readline()  # the reader takes one line, then goes away, as `head -1` does
    cli.stdout.close()
    err = cli.stderr.read().decode()
    assert cli.wait(timeout=60) in (0, 141), err
    assert first.startswith(b"trl:")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
