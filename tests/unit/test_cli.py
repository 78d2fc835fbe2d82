"""The command line: bad input is one line naming the valid choices, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.cli import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("argv", "must_name"),
    [
        (["matrix", "--mode", "sideways"], ["'sideways'", "keep", "wait", "abort"]),
        (["matrix", "--executor", "ray-v3"], ["'ray-v3'", "mp", "uni", "ray-v1", "ray-v2"]),
        (["matrix", "--async", "maybe"], ["'maybe'", "on", "off", "both"]),
        (["matrix", "--clear-cache", "yes"], ["'yes'", "true", "false"]),
        (["matrix", "--platform", "tpu"], ["'tpu'", "cpu", "cuda"]),
        (["matrix", "--versions", "latest!"], ["'latest!'", "0.21.0"]),
        (["matrix", "--pause-after", "60", "--max-tokens", "48"], ["--pause-after 60", "--max-tokens 48"]),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_choices(
    argv: list[str], must_name: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for word in must_name:
        assert word in err


def test_console_script_module_exits_2_on_unknown_mode() -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "matrix", "--mode", "sideways"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "keep, wait, abort" in proc.stderr


def test_matrix_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["matrix", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--versions", "--executor", "--async", "--mode", "--clear-cache", "--platform", "--reports",
                "--engine-timeout", "--scenario-timeout", "--index-url", "--find-links", "--resolve-as-of"):
        assert opt in out


def test_report_on_corrupt_file_is_a_clear_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "results.json"
    bad.write_text("{not json")
    assert main(["report", str(bad)]) == 2
    assert "corrupt JSON" in capsys.readouterr().err
    future = tmp_path / "future.json"
    future.write_text('{"schema": "vllm-repro/results", "schema_version": 99, "cells": []}')
    assert main(["report", str(future)]) == 2
    assert "schema_version 99" in capsys.readouterr().err
