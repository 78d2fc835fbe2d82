"""The scheduler tier's one patch of vLLM 0.34.0's CPU platform: its x86 Triton check is passed only while
check_and_update_config runs, only where the check exists and Triton is absent, and the sched event says so."""

from __future__ import annotations

import sys
import types
from typing import Any, ClassVar

import pytest

from repro.sched.adapter import TRITON_WAIVER, waive_triton_check

pytestmark = pytest.mark.unit


class CpuPlatform:
    """vLLM 0.34.0's check, as vllm/platforms/cpu.py has it (abridged)."""

    seen: ClassVar[list[bool]] = []

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        from vllm.triton_utils import HAS_TRITON  # type: ignore[import-not-found]

        cls.seen.append(HAS_TRITON)
        if not HAS_TRITON:
            raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")


class OldCpuPlatform:
    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        return None


@pytest.fixture
def triton_utils(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = types.ModuleType("vllm.triton_utils")
    mod.HAS_TRITON = False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.triton_utils", mod)
    return mod


def test_the_check_passes_while_it_runs_and_the_flag_is_false_after(triton_utils: types.ModuleType) -> None:
    platform = CpuPlatform()
    with pytest.raises(RuntimeError, match="requires Triton"):
        platform.check_and_update_config(None)  # what a CUDA wheel on a CPU-only machine meets
    assert waive_triton_check(platform) == TRITON_WAIVER
    platform.check_and_update_config(None)
    assert CpuPlatform.seen[-1] is True and triton_utils.HAS_TRITON is False
    with pytest.raises(RuntimeError):
        CpuPlatform().check_and_update_config(None)  # another platform object is left as vLLM made it


def test_nothing_is_patched_where_nothing_is_needed(triton_utils: types.ModuleType) -> None:
    assert waive_triton_check(OldCpuPlatform()) is None  # releases before 0.34.0 have no such check
    triton_utils.HAS_TRITON = True  # type: ignore[attr-defined]
    platform = CpuPlatform()
    assert waive_triton_check(platform) is None and "check_and_update_config" not in vars(platform)
