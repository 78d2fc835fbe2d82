"""``vllm-repro plan PLAN.json --export-pytest FILE``: the plan as one self-contained test file, by tier
(harness.export.sched_pytest for a scheduler-tier plan, harness.export.engine_script for an engine-tier one)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.core.errors import BadInput
from harness.export.engine_script import export_engine
from harness.export.sched_pytest import export_pytest, reproducer_name
from harness.plan.matrix import ON_OFF, parse_bools

# Run options whose engine the exported file does not build: it builds the harness's default model and
# engine arguments only.
CUSTOM_SETUP = {"model": "--model", "engine_arg": "--engine-arg", "engine_args": "--engine-args", "preset": "--preset"}


def _engine_options(args: argparse.Namespace) -> tuple[bool, str]:
    """(async_scheduling, executor) of the one engine the file starts; BadInput for what it cannot carry."""
    custom = [opt for name, opt in CUSTOM_SETUP.items() if getattr(args, name, None)]
    if custom:
        raise BadInput(f"--export-pytest writes the harness's default set-up (the bigram-cycle model, the default "
                       f"engine arguments); {', '.join(custom)} cannot be exported")
    asyncs = parse_bools("async setting", args.async_, ON_OFF, (True,))
    if len(asyncs) != 1:
        raise BadInput("--export-pytest writes one engine: give --async on or --async off, not both")
    return asyncs[0], args.executor or "mp"


def export_text(plan: Mapping[str, Any], args: argparse.Namespace) -> str:
    """The file's text for ``plan`` (read from ``args.plan_file``) with the command's options."""
    source = str(args.plan_file)
    if plan.get("tier") == "scheduler":
        if args.async_ is not None or args.executor is not None:
            raise BadInput(f"{source} is a scheduler-tier plan: its script names the scheduler; --async and "
                           "--executor apply to engine-tier plans only")
        return export_pytest(plan, source)
    async_on, executor = _engine_options(args)
    return export_engine(plan, source, reproducer_name(source), async_on, executor,
                         getattr(args, "scenario_timeout", 120.0), getattr(args, "kv_cache_gib", 1))


def export_file(plan: Mapping[str, Any], args: argparse.Namespace) -> int:
    """Write the file to ``args.export_pytest``; 0."""
    text = export_text(plan, args)
    out: Path = args.export_pytest
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from exc
    how = f"`pytest -q {out}` in an env holding vLLM and pytest" if plan.get("tier") == "scheduler" else \
        f"`python {out}` (or `pytest -q {out}`) in an env holding vLLM"
    print(f"wrote {out}: run it with {how}")
    return 0
