"""``vllm-repro envs list|build|prune``: the cached vLLM environments."""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.core.errors import EnvBuildError
from harness.envbuild.envs import ensure_env, env_size, last_used, list_envs, prune_envs
from harness.frontends.commands.command import Command, CommandGroup
from harness.frontends.commands.invocation import Context
from harness.frontends.commands.options import (
    add_index_options,
    add_version_options,
    add_wheelhouse_options,
    add_wheels_option,
)
from harness.plan.matrix import parse_versions
from harness.plan.releases import INSTALLED


class EnvsList(Command):
    name = "list"
    help = "list cached environments with size and last use"

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cache-dir", type=Path)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        rows = list_envs(ctx.cache)
        if not rows:
            print(f"no environments under {ctx.cache / 'envs'}")
        for path, status in rows:
            state = "valid" if status and status.get("valid") else "incomplete"
            extra = f"vllm {status.get('vllm_version')}, torch {status.get('torch_version')}" if status else ""
            used = datetime.fromtimestamp(last_used(path)).strftime("%Y-%m-%d %H:%M")
            print(f"{path.name}  {state}  {env_size(path) / 2**30:.1f} GiB  last used {used}  {extra}")
        return 0


class EnvsBuild(Command):
    name = "build"
    help = "build (or validate) the environments for some versions"

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_version_options(parser)
        parser.add_argument("--platform", default=None)
        parser.add_argument("--jobs", type=int, default=2, help="environments built at once (default 2)")
        add_wheels_option(parser)
        add_wheelhouse_options(parser)
        add_index_options(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        platform, index = ctx.platform, ctx.index
        # An installed vLLM is not built: envs build leaves "installed" out.
        versions = [v for v in parse_versions(args.versions, platform, index.index_url, args.pre, ctx.version_fetch,
                                              package=ctx.package)
                    if v != INSTALLED]
        recipes = [ctx.recipe(v) for v in versions]
        failed = 0
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(ensure_env, r, ctx.cache, print) for r in recipes]
            for r, f in zip(recipes, futures, strict=True):
                try:
                    env = f.result()
                except EnvBuildError as exc:
                    failed += 1
                    print(f"BUILD-FAILED {r.package}=={r.version}: {exc}")
                    continue
                print(f"{env.path}: vllm {env.status['vllm_version']}, torch {env.status['torch_version']}"
                      f"{_left_out(env.status)}")
        return 1 if failed else 0


def _left_out(status: dict[str, Any]) -> str:
    """``, N CUDA packages left out`` for a CUDA build on a CPU torch (harness.envbuild.cputorch), else ``""``."""
    left = status.get("left_out")
    return f" (vLLM pins torch {status.get('torch_pinned')}), {len(left)} CUDA packages left out" if left else ""


class EnvsPrune(Command):
    name = "prune"
    help = "remove incomplete, old or least recently used environments"

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cache-dir", type=Path)
        parser.add_argument("--older-than", type=float, metavar="DAYS", help="remove envs unused for this many days")
        parser.add_argument("--max-size", type=float, metavar="GB",
                            help="keep the most recently used envs within this size")
        parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        max_bytes = int(args.max_size * 2**30) if args.max_size is not None else None
        gone = prune_envs(ctx.cache, args.older_than, max_bytes, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {len(gone)} environment(s)" + "".join(f"\n  {p.name}" for p in gone))
        return 0


class EnvsCommand(CommandGroup):
    name = "envs"
    help = "list, build or prune cached vLLM environments"
    actions = (EnvsList(), EnvsBuild(), EnvsPrune())
