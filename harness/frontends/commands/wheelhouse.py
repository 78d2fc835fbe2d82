"""``vllm-repro wheelhouse``: download vLLM, Ray and every dependency a target lacks (air-gapped GPU nodes)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.bundle.wheelhouse import LAZY_KERNELS
from harness.core.errors import BadInput
from harness.frontends.commands.command import Command
from harness.frontends.commands.invocation import Context
from harness.frontends.commands.options import add_index_options
from harness.plan.matrix import split_list


class WheelhouseCommand(Command):
    name = "wheelhouse"
    help = "download vLLM, Ray and every dependency a target lacks (air-gapped GPU nodes)"
    description = ("Resolve vLLM X + Ray for the target Python and platform, prefer the versions the target "
                   "already has (--exclude-installed: its `pip list --format=freeze`), and download every other "
                   "wheel into --dest with a manifest (wheelhouse.json). `envs build --wheelhouse DIR` and `matrix "
                   "--wheelhouse DIR` then install from it without network.")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--vllm", required=True, help="vLLM versions, comma-separated (0.21.0,0.22.0)")
        parser.add_argument("--platform", required=True, help="target platform tag, e.g. manylinux_2_28_x86_64")
        parser.add_argument("--exclude-installed", type=Path, metavar="FILE",
                            help="the target's `pip list --format=freeze`: packages it has are not downloaded when "
                                 "they fit")
        parser.add_argument("--dest", type=Path, default=Path("wheelhouse"),
                            help="wheelhouse folder (default ./wheelhouse)")
        parser.add_argument("--exclude", action="append", default=None, metavar="PATTERN",
                            help="leave out packages matching this glob, repeatable (default: the kernel packages "
                                 "the tiny-model runs never import, each with its reason in the manifest: "
                                 f"{', '.join(LAZY_KERNELS)}; --exclude none keeps everything)")
        parser.add_argument("--with", dest="extra", action="append", default=None, metavar="REQ",
                            help="extra requirement, repeatable (default: ray)")
        parser.add_argument("--with-harness", action="store_true",
                            help="also put vllm-repro itself, tox and their dependencies for the target into "
                                 "DEST/harness-wheels (install on the node with `python3 -m pip install --no-index "
                                 "--find-links DEST/harness-wheels vllm-repro tox`)")
        add_index_options(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.bundle.wheelhouse import DEFAULT_EXCLUDE, DEFAULT_EXTRA, build_wheelhouse

        # --platform here is a wheel tag of the target, not a harness platform: ctx.platform is not used.
        if not args.python:
            raise BadInput("wheelhouse needs --python: the target's Python version, e.g. --python 3.12")
        versions = split_list(args.vllm)
        if not versions:
            raise BadInput(f"--vllm {args.vllm!r} names no version; e.g. --vllm 0.21.0,0.22.0")
        exclude = DEFAULT_EXCLUDE if args.exclude is None else tuple(e for e in args.exclude if e != "none")
        rep = build_wheelhouse(args.dest, versions, args.python, args.platform, args.exclude_installed,
                               exclude=exclude,
                               extra=tuple(args.extra) if args.extra is not None else DEFAULT_EXTRA,
                               index=ctx.index, log=print)
        for v, e in rep.manifest.versions.items():
            print(f"{v}: {len(e.wheels)} wheels, {e.bytes / 2**20:.1f} MiB; replaces installed "
                  f"{[d['name'] for d in e.replaces_installed] or 'nothing'}; excluded "
                  f"{[d['name'] for d in e.excluded] or 'nothing'}")
        if args.with_harness:
            from harness.bundle.harness_wheels import bundle_harness

            b = bundle_harness(args.dest, args.python, args.platform, log=print)
            print(f"harness: {len(b.wheels)} wheels, {b.bytes / 2**20:.1f} MiB in {b.folder}")
        return 0
