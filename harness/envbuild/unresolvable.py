"""Pins the package index cannot satisfy, on packages a run never imports: left out, and said so.

vLLM 0.34.0 pins ``flashinfer-python==0.7.3``, which the index does not hold (it has 0.7.2.post1 and 0.7.4): the
resolution fails before anything is installed, although no run of this harness imports flashinfer (the tiny model
on a GPU runs with ``VLLM_USE_FLASHINFER_SAMPLER=0``; the scheduler tier on a CPU runs no kernel at all).  So when a
resolution fails only because of such a pin, the build leaves that package out (an override that never applies),
resolves again, and records what it left out and why: in the env's status file (``unresolvable_left_out``), the
wheelhouse manifest (its ``excluded`` entries) and the report.  A pin on anything else (torch, transformers, ...)
is never replaced: the build fails with uv's words, as before.

uv names such a pin in one sentence of its resolver error, e.g. "Because there is no version of
flashinfer-python==0.7.3 and vllm>=0.34.0 depends on flashinfer-python==0.7.3, ..." (uv 0.9-0.11).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from harness.core.versions import release_key

_NO_VERSION = re.compile(r"there is no version of ([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s,;]+)")
_NOT_FOUND = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s,;]+) was not found in the package registry")
# Packages vLLM requires but only imports lazily, on paths this harness's tiny
# Llama model never takes (checked in the 0.21.0 wheel's sources; the 0.21.0 and
# 0.22.0 GPU matrices ran on two H200s from a wheelhouse without them).  Left out
# by default, each with this reason in the manifest; ``--exclude none`` keeps them.
LAZY_KERNELS = {
    "flashinfer-*": "imported lazily; the runner sets VLLM_USE_FLASHINFER_SAMPLER=0",
    "tilelang": "imported only by vllm/model_executor/layers/mhc.py (DeepSeek-V4)",
    "tokenspeed-*": "imported only by the tokenspeed MLA attention backends",
    "nvidia-cutlass-dsl*": "CuTe DSL: imported only by FlashAttention 4 (vllm_flash_attn/cute) and DeepSeek-V4 ops",
    "quack-kernels": "imported only by FlashAttention 4 (vllm_flash_attn/cute) and DeepSeek-V4 ops",
    # 0.22.0: humming-kernels[cu13] pulls nvcc + nvvm (~110 MB).
    "humming-kernels": "imported only by get_quantization_config() for quantized checkpoints",
}
# Packages the list above calls lazy that a release imports on every CUDA engine after all, from that release on:
# vLLM 0.34.0's kernel_warmup (model_executor/warmup/kernel_warmup.py:366-372) imports the MiniMax-M3 MSA warm-up
# whatever the model, and its modules import cutlass (the CuTe DSL, nvidia-cutlass-dsl) and quack
# (models/minimax_m3/nvidia/ops/*.py).  Measured on an H200, 2026-12-04: without them every 0.34.0 engine died
# with "No module named 'cutlass'" in compile_or_warm_up_model.
IMPORTED_FROM = {"nvidia-cutlass-dsl*": "0.34.0", "quack-kernels": "0.34.0"}


def lazy_for(version: str, patterns: Iterable[str]) -> tuple[str, ...]:
    """``patterns`` without those a release imports after all (:data:`IMPORTED_FROM`); a label that is no release
    (a commit) keeps them all."""
    key = release_key(version)
    return tuple(p for p in patterns
                 if not (p in IMPORTED_FROM and key[0] == 0 and key >= release_key(IMPORTED_FROM[p])))


# On a CPU torch (the scheduler tier of a CUDA build, harness.envbuild.cputorch) no kernel runs at all.
CPU_TORCH_REASON = "a CUDA-only kernel package; the scheduler tier on a CPU torch runs no kernel"
ROUNDS = 5  # a release has pinned at most one such package so far; a few more rounds cost seconds


@dataclass(frozen=True)
class LeftOut:
    """A package the resolution needed at a version no configured index holds, left out of the env."""

    name: str  # canonical
    pinned: str  # the version the release pins
    reason: str  # why the runs never import it

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "version": self.pinned, "reason": f"pin {self.name}=={self.pinned} is on no "
                f"configured index; left out: {self.reason}"}


def unresolvable_pins(stderr: str) -> dict[str, str]:
    """``name -> version`` of every exact pin uv's resolver error says no index holds (names canonical)."""
    text = " ".join(stderr.split())  # uv wraps its explanation over lines
    found = {str(canonicalize_name(m[1])): m[2].rstrip(".") for rx in (_NO_VERSION, _NOT_FOUND)
             for m in rx.finditer(text)}
    return dict(sorted(found.items()))


def leave_out(stderr: str, never_imported: Mapping[str, str], already: Iterable[str] = ()) -> list[LeftOut] | None:
    """What to leave out after a failed resolution: every unresolvable pin, when each is on a package matched by
    a pattern of ``never_imported`` (``fnmatch`` pattern -> why runs never import it) and not left out already.

    None when the failure is anything else (a pin the run depends on, a conflict, no network): then the build
    must fail with uv's own words, never go on without the package."""
    pins = {n: v for n, v in unresolvable_pins(stderr).items() if n not in set(already)}
    if not pins:
        return None
    out = []
    for name, version in pins.items():
        why = next((w for p, w in never_imported.items() if fnmatch.fnmatch(name, p)), None)
        if why is None:
            return None
        out.append(LeftOut(name, version, why))
    return out


def unresolvable_facts(left: Iterable[LeftOut]) -> dict[str, list[dict[str, str]]]:
    """The status-file key naming what was left out, present only when something was (older envs' status files
    stay as they were)."""
    items = [lo.to_dict() for lo in left]
    return {"unresolvable_left_out": items} if items else {}
