"""``vllm-repro frameworks list|check``: RL framework recipes, and per framework and release whether its sequence
loses tokens and whether its workaround can go (issue 22)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.errors import BadInput
from harness.core.outcome_groups import infra_failed
from harness.frontends.commands.cellrun import add_check_options, checked_versions, checked_versions_options, run_cells
from harness.frontends.commands.command import Command, CommandGroup
from harness.frontends.commands.fwbisect import FrameworksBisect
from harness.frontends.commands.fwclient import CLIENT, add_client_options
from harness.frontends.commands.fwdrift import FrameworksDrift
from harness.frontends.commands.invocation import Context
from harness.frontends.commands.options import add_jobs_option, parse_jobs
from harness.frontends.commands.workarounds import LEDGER_HELP
from harness.plan.matrix import split_list
from harness.verdicts.frameworks import STAND_IN
from harness.verdicts.mdtable import md_table

if TYPE_CHECKING:
    from harness.verdicts.framework_verdicts import CellOutcome, FrameworkCheck, ReleaseVerdict
    from harness.verdicts.frameworks import Recipe

RECIPES_HELP = "recipe TOML (default: harness/verdicts/frameworks.toml shipped with vllm-repro)"


def _add_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipes", type=Path, help=RECIPES_HELP)
    parser.add_argument("--ledger", type=Path, help=LEDGER_HELP)
    parser.add_argument("--framework", default=None, metavar="NAME[,NAME]",
                        help="only these frameworks (default: every recipe)")


def selected_recipes(args: argparse.Namespace) -> tuple[Recipe, ...]:
    """The recipes ``--framework`` names (all by default); BadInput names a bad file or an unknown name."""
    from harness.verdicts.frameworks import load_recipes, select

    return select(load_recipes(args.recipes, args.ledger), split_list(args.framework))


def render_recipe(r: Recipe) -> list[str]:
    """A recipe with its source: where every call is, the cells that play it."""
    lines = [f"{r.name}: {r.title} ({r.repo}@{r.commit[:7]}), pins vllm {r.pin} ({r.pin_at}), door {r.door}",
             f"  door: {r.door_detail}" if r.door_detail else "",
             *(f"  call: {c.call}  [{r.source(c.at)}]" for c in r.calls),
             *(f"  sends {s.param}: {s.value}  [{r.source(s.at, s.source)}]" for s in r.sampling),
             *(f"  cell ({c.match}): {c.at('X', r.door).config_id}: {c.why}" for c in r.cells),
             *(f"  request cell ({c.match}): {c.at('X', r.door).config_id}: {c.why}" for c in r.request_cells)]
    if r.engine_kwargs:
        lines.append("  engine kwargs it passes (recorded, not applied): "
                     + ", ".join(f"{k}={v}" for k, v in r.engine_kwargs))
    w = r.workaround
    lines.append(f"  workaround: {w.setting} ({w.id}, {w.location})" if w else "  workaround: none carried")
    lines += [f"  window: {b.text} [{b.evidence}]" for b in r.bisects]
    if r.note:
        lines.append(f"  note: {r.note}")
    return [x for x in lines if x]


class FrameworksList(Command):
    name = "list"
    help = "print the framework recipes with their sources"

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_selection(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        for r in selected_recipes(args):
            print("\n".join(render_recipe(r)))
        return 0


def _cells_text(outcomes: tuple[CellOutcome, ...]) -> str:
    return ", ".join(f"{o.label} {o.outcome}" for o in outcomes)


def _entry(r: ReleaseVerdict, recipe: Recipe) -> str:
    text = f"{r.safety.value} ({_cells_text(r.cells)})"
    if r.stand_in is not None:
        text += f"; {recipe.engine_cells}: {r.stand_in.value} ({_cells_text(r.stand_in_cells)})"
    if r.stale_kv:
        text += f"; stale KV: {_cells_text(r.stale_kv)}"
    if r.requests:
        text += f"; its requests: {_cells_text(r.requests)}"
    return text + ("" if r.allowed else " [outside its pin]")


def render_stale_kv(c: FrameworkCheck) -> list[str]:
    """Issue 37's column for one framework: its update sequence as a stale-kv cell, per release, or why none."""
    r = c.recipe
    if r.stale_kv_none:
        return [f"  stale KV: not applicable: {r.stale_kv_none}"]
    out = [f"  stale KV ({rc.match}: {rc.why})" for rc in r.stale_kv]
    for rv in c.releases:
        out += [f"    {rv.version} {o.label}: {o.outcome}: {o.detail}" for o in rv.stale_kv]
    return out


def render_table(checks: tuple[FrameworkCheck, ...]) -> list[str]:
    """Framework x vLLM release: SAFE/UNSAFE/UNKNOWN and the outcome of every cell ("-": not checked for it)."""
    from harness.core.versions import version_key

    versions = sorted({r.version for c in checks for r in c.releases}, key=version_key)
    rows = []
    for c in checks:
        by_version = {r.version: r for r in c.releases}
        rows.append([f"{c.recipe.name} ({c.recipe.door}; pins {c.recipe.pin})",
                     *(_entry(by_version[v], c.recipe) if v in by_version else "-" for v in versions)])
    return md_table(["framework", *versions], rows)


def _first_safe(c: FrameworkCheck, stand_in: bool) -> str:
    first = c.first_safe_from_pin(stand_in)
    if first:
        return first
    checked = c.checked_from_pin
    floor = c.recipe.floor or "any"
    return f"none of the checked releases from {floor} ({', '.join(checked)})" if checked else \
        f"none checked at or after {floor}"


def render_check(c: FrameworkCheck) -> list[str]:
    """One framework's verdicts: where its sequence is safe, the first safe release from its pin, its workaround,
    and the reason of every cell that is not OK."""
    r = c.recipe
    lines = [f"{r.name}: {r.title}, door {r.door}, pins vllm {r.pin} ({r.source(r.pin_at)})",
             f"  safe on: {', '.join(c.safe_on) or 'none of the checked releases'}",
             f"  first safe release at or after its pin: {_first_safe(c, False)}",
             *(f"  window: {b.text} [{b.evidence}]" for b in r.bisects)]
    if any(rv.stand_in is not None for rv in c.releases):
        lines += [f"  {r.engine_cells} safe on: {', '.join(c.stand_in_safe_on) or 'none'}; first at or after "
                  f"its pin: {_first_safe(c, True)}"]
    if c.workaround is None:
        lines.append("  workaround: none carried")
    else:
        w = c.workaround.workaround
        lines.append(f"  workaround {w.setting} ({w.location}):")
        lines += [f"    {v.version}: {v.status.value}: {v.evidence}" for v in c.workaround.verdicts]
    lines += render_stale_kv(c)
    for rv in c.releases:
        lines += [f"  {rv.version} with its requests: {o.label} {o.outcome}: {o.detail}" for o in rv.requests]
    for rv in c.releases:
        lines.append(f"  {rv.version} {rv.safety.value}, why: "
                     + "; ".join(f"{o.label} {o.outcome}: {o.why or 'not judged'}" for o in rv.cells))
        for o in (*rv.cells, *rv.stand_in_cells):
            if o.outcome != "OK":
                role = r.engine_cells if o.compiled.role == STAND_IN else o.compiled.role
                lines.append(f"  {rv.version} {o.label} ({role}, {o.compiled.match}): {o.outcome}: "
                             f"{o.detail}")
    return lines


def render_report(checks: tuple[FrameworkCheck, ...]) -> list[str]:
    return [*render_table(checks), "", *(line for c in checks for line in (*render_check(c), ""))]


def _versions_by_recipe(ctx: Context, args: argparse.Namespace,
                        recipes: tuple[Recipe, ...]) -> dict[str, tuple[str, ...]]:
    """``--versions`` per recipe: the releases given for every recipe, and with the word ``pins`` each recipe
    also at the oldest release its pin allows (from the index, or the wheelhouse's releases)."""
    from harness.envbuild.index_releases import fetch_releases
    from harness.plan.releases import candidate_versions
    from harness.verdicts.frameworks import PINS, versions_by_recipe

    items = [v.strip() for v in (args.versions or "").split(",") if v.strip()]
    pins = PINS in items
    rest = ",".join(v for v in items if v != PINS)
    args.versions = rest or (None if pins else args.versions)
    common = checked_versions(ctx, "frameworks check", "0.21.0,0.22.0 or pins,latest") if rest or not pins else ()
    if pins:
        checked_versions_options(ctx)
    available = candidate_versions(ctx.package, ctx.index.index_url, args.pre,
                                   ctx.version_fetch or fetch_releases) if pins else None
    return versions_by_recipe(recipes, common, available)


class FrameworksCheck(Command):
    name = "check"
    help = "run every recipe's cells on every version: per framework and release SAFE/UNSAFE, and its workaround"
    description = ("Runs each framework's call sequence (harness/verdicts/frameworks.toml) as cells, one engine per "
                   "engine config shared by every recipe that needs it (on CPU the next engine starts up while "
                   "one runs its scenarios: --jobs); prints framework x release, then per framework the releases "
                   "its sequence is safe on, the first safe one at or after its pin, and "
                   "whether its own workaround is NEEDED or REMOVABLE. Recipes on the server door also run through "
                   "the engine door (the stand-in) unless --no-stand-in. The word 'pins' in --versions checks each "
                   "framework also at the oldest release its pin allows (e.g. --versions pins,latest). Exit code: "
                   "0 when every cell got a verdict (an UNSAFE framework included: that is a finding), 1 when a "
                   "cell is ERROR, TIMEOUT or BUILD-FAILED (matrix's rule), 2 on bad input.")

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_selection(parser)
        parser.add_argument("--no-stand-in", action="store_true",
                            help="do not also run server-door recipes through the engine door")
        parser.add_argument("--no-stale-kv", action="store_true",
                            help="do not run each framework's update sequence as a stale-kv cell (its engines load "
                                 "the context-cell model: docs/stale-kv.md)")
        add_client_options(parser)
        add_check_options(parser, reports="reports/frameworks")
        add_jobs_option(parser)

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.frontends.commands.fwclient import client_run
        from harness.verdicts.framework_verdicts import check_frameworks
        from harness.verdicts.frameworks import compile_recipes, unique_cells
        from harness.verdicts.report import write_reports

        recipes = selected_recipes(args)
        if (args.framework_version or args.no_recipe_door) and args.door != CLIENT:
            raise BadInput("--framework-version and --no-recipe-door need --door client")
        parse_jobs(args.jobs)  # bad input before a side environment is built
        versions = _versions_by_recipe(ctx, args, recipes)
        stand_ins = not args.no_stand_in
        run = client_run(ctx, args, recipes, versions, stand_ins) if args.door == CLIENT else None
        cells = run.cells if run else unique_cells(compile_recipes(recipes, versions, stand_ins,
                                                                   stale_kv=not args.no_stale_kv))
        results, reports = run_cells(ctx, cells,
                                     f"frameworks check: {len(recipes)} framework(s) x "
                                     f"{len({v for vs in versions.values() for v in vs})} version(s)",
                                     args.reports, run.cfg if run else None, run.settled if run else ())
        write_reports(results, reports)
        judged = run.recipes if run else recipes
        lines = render_report(check_frameworks(judged, versions, results.cells, stand_ins))
        if run:
            lines = [*run.header, *lines, *run.agreement(results.cells)]
        (reports / "frameworks.md").write_text("\n".join(lines) + "\n", "utf-8")
        print("\n".join(lines))
        print(f"reports: {reports}")
        # matrix's rule (harness.core.outcome_groups.infra_failed): a cell with no verdict fails the run.
        return 1 if infra_failed(c.outcome.value for c in results.cells) else 0


class FrameworksReport(Command):
    name = "report"
    help = "the framework verdicts from results already written (a frameworks check's results.json, any matrix's)"

    def setup_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("results", type=Path, nargs="+",
                            help="results.json(.gz/.xz) or results.jsonl files (a later file's cell wins)")
        _add_selection(parser)
        parser.add_argument("--no-stand-in", action="store_true",
                            help="leave out the engine-door stand-ins of server-door recipes")
        parser.add_argument("--door", choices=(CLIENT,), default=None,
                            help="client: the verdicts of the client door's cells, and the agreement of the doors")

    def run(self, ctx: Context, args: argparse.Namespace) -> int:
        from harness.frontends.commands.fwclient import on_client_door
        from harness.verdicts.agreement import agreement, render_agreement
        from harness.verdicts.framework_verdicts import check_frameworks, versions_with_results
        from harness.verdicts.results import read_results

        recipes = selected_recipes(args)
        cells = [c for path in args.results for c in read_results(path).cells]
        stand_ins = not args.no_stand_in
        judged = on_client_door(recipes) if args.door == CLIENT else recipes
        versions = versions_with_results(judged, cells, stand_ins)
        lines = render_report(check_frameworks(judged, versions, cells, stand_ins))
        if args.door == CLIENT:
            lines += render_agreement([a for r in recipes for a in agreement(r, versions[r.name], cells)])
        print("\n".join(lines))
        return 0


class FrameworksCommand(CommandGroup):
    name = "frameworks"
    help = ("RL framework recipes (TRL, SkyRL, prime-rl, AReaL, OpenRLHF, verl, PipelineRL, NeMo-RL): list them, "
            "check per vLLM release whether each framework's call sequence is safe and its workaround needed, "
            "or whether their cited source lines drifted")
    actions = (FrameworksList(), FrameworksCheck(), FrameworksReport(), FrameworksBisect(),
               FrameworksDrift())
