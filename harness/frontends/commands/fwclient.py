"""``frameworks check --door client`` (issue 36 item 1): the framework's released client, installed into a side
environment (``harness.envbuild.client_env``), pauses and resumes the project's vLLM server
(``repro.client.door``); the recipe's cells run on that door, judged by the same oracle."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from harness.core.errors import BadInput, bad_choice
from harness.frontends.commands.invocation import Context

if TYPE_CHECKING:
    from harness.core.cell import Cell
    from harness.envbuild.client_env import ClientEnv
    from harness.run.spec import RunConfig
    from harness.verdicts.frameworks import Recipe
    from harness.verdicts.results import CellResult
    from repro.client.clients import Client

CLIENT = "client"


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--door", choices=(CLIENT,), default=None,
                        help="client: run the framework's own released client code (its package installed with "
                             "--no-deps into a side environment) against vLLM's server instead of the recipe's "
                             "replay (default: the recipe's own door)")
    parser.add_argument("--framework-version", default=None, metavar="VERSION",
                        help="with --door client: the framework release to install (default: the newest release "
                             "on the index that installs)")
    parser.add_argument("--no-recipe-door", action="store_true",
                        help="with --door client: do not also run the recipe on the framework's own door (the "
                             "agreement table then compares the client door with the engine-door stand-in only)")


@dataclass(frozen=True)
class ClientSetup:
    """The client door of one run: the framework's client, the release tried, its env or why it has none."""

    client: Client
    env: ClientEnv | None
    failures: tuple[str, ...]  # one line per release that did not install (the installer's last line)
    unsupported: bool = False  # no interpreter the framework's release accepts: its cells are UNSUPPORTED

    @property
    def error(self) -> str:
        return self.failures[-1] if self.failures else ""

    def lines(self) -> list[str]:
        """The report's header: the framework release and the client module run, and every stand-in."""
        from repro.client.clients import standins

        c = self.client
        head = (f"client door: {c.package} {self.env.version}, {c.module}.{c.cls} "
                f"({', '.join(c.call_name(m) for _, m in c.calls)}), side environment {self.env.path}"
                if self.env else f"client door: {c.package}: {'UNSUPPORTED' if self.unsupported else 'ERROR'}: "
                                 f"{self.error}")
        return [head, *(f"  not installed: {f}" for f in self.failures if self.env),
                *([f"  the server is the framework's own entry point: {self.env.server_main}"]
                  if self.env and self.env.server_main else []),
                *([f"  in-process: the engine process imports {c.module} from {self.env.site} and {c.cls} builds "
                   f"and drives the cell's AsyncLLM (no HTTP server)"] if self.env and c.in_process else []),
                *([f"  weight swap in weight-sync cells: {c.swap}"] if c.swap else []),
                *(f"  stand-in {s.module}: {s.reason}; unchanged: {s.unchanged}" for s in standins(c.framework))]


def client_for(recipes: tuple[Recipe, ...]) -> Client:
    """The one framework's client (BadInput: none, several, or a framework without a client door)."""
    from repro.client.clients import CLIENTS, NO_CLIENT

    if len(recipes) != 1:
        raise BadInput(f"--door client runs one framework at a time; give --framework with one of: "
                       f"{', '.join(CLIENTS)}")
    name = recipes[0].name
    client = CLIENTS.get(name)
    if client is None and name in NO_CLIENT:
        raise BadInput(f"{name} has no client door yet ({NO_CLIENT[name]}); it stays on its recipe; client doors: "
                       f"{', '.join(CLIENTS)}")
    if client is None:
        raise bad_choice("framework for --door client (no client door yet; it stays on its recipe)", name,
                         tuple(CLIENTS))
    return client


def setup_client(ctx: Context, args: argparse.Namespace, recipes: tuple[Recipe, ...]) -> ClientSetup:
    """Resolve the release (BadInput for an unknown one, before anything is written) and build its env."""
    return install_client(ctx, client_for(recipes), args.framework_version)


def add_matrix_client_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--client", default=None, metavar="NAME[==VERSION]",
                        help="the cells of the client door (--door client or all): the RL framework whose released "
                             "client pauses and resumes the server (e.g. trl or trl==1.16.0; default: none, those "
                             "cells UNSUPPORTED)")


def matrix_client(ctx: Context, raw: str) -> dict[str, str]:
    """``matrix --client NAME[==VERSION]``: the spec's client (its env built), or its install error (the cells are
    then ERROR with it); BadInput for an unknown framework or release."""
    from repro.client.clients import CLIENTS

    name, _, version = raw.partition("==")
    if name not in CLIENTS:
        raise bad_choice("--client framework", name, tuple(CLIENTS))
    setup = install_client(ctx, CLIENTS[name], version or None)
    if setup.env:
        return setup.env.to_spec()
    return {"framework": name, "error": setup.error, **({"unsupported": "true"} if setup.unsupported else {})}


def install_client(ctx: Context, client: Client, asked: str | None) -> ClientSetup:
    """The release to run (``asked``, else the newest that installs) in its side environment."""
    from harness.envbuild import client_env as ce
    from harness.envbuild.client_python import find_python

    found = find_python(client.requires_python, ctx.python)
    if found is None:
        return ClientSetup(client, None, (f"{client.package} needs Python {client.requires_python} "
                                          f"(its client's Requires-Python); no such interpreter found (tried "
                                          f"{ctx.python}, uv python find, pyenv's versions, python3.N on PATH)",),
                           unsupported=True)
    pv = found.version
    versions = ce.chosen_versions(client, asked, ce.releases(client, ctx.index, pv))
    env, failures = ce.newest_that_installs(
        client, versions, lambda v: ce.ensure_client_env(client, v, ctx.cache, found.executable, ctx.index, pv))
    return ClientSetup(client, env, failures)


def on_client_door(recipes: tuple[Recipe, ...]) -> tuple[Recipe, ...]:
    # Its own door kept: a recipe on the engine door (OpenRLHF) is then its engine-door cells, not a stand-in.
    return tuple(replace(r, door=CLIENT, own_door=r.own_door or r.door) for r in recipes)


@dataclass(frozen=True)
class ClientRun:
    """What ``frameworks check --door client`` runs: the cells (the client door's, the stand-ins', and the recipe's
    on its own door), the run settings carrying the client, the cells settled as ERROR, the recipes judged."""

    setup: ClientSetup
    originals: tuple[Recipe, ...]
    recipes: tuple[Recipe, ...]  # on the client door
    versions: Mapping[str, tuple[str, ...]]
    cells: list[Cell]
    cfg: RunConfig
    settled: tuple[CellResult, ...]

    @property
    def header(self) -> list[str]:
        return [*self.setup.lines(), ""]

    def agreement(self, results: Iterable[CellResult]) -> list[str]:
        """The agreement table of the doors that ran (issue 36 item 5)."""
        from harness.verdicts.agreement import agreement, render_agreement

        rs = list(results)
        rows = [a for r in self.originals for a in agreement(r, self.versions[r.name], rs)]
        return ["agreement of the doors (the same cells; a disagreement is a finding):", *render_agreement(rows)]


def client_run(ctx: Context, args: argparse.Namespace, recipes: tuple[Recipe, ...],
               versions: Mapping[str, tuple[str, ...]], stand_ins: bool) -> ClientRun:
    """The client door's run: its client installed (or its cells ERROR), the recipe on its own door beside it
    unless ``--no-recipe-door``."""
    from harness.verdicts.frameworks import SEQUENCE, compile_recipes, unique_cells

    setup = setup_client(ctx, args, recipes)
    on_client = on_client_door(recipes)
    compiled = list(compile_recipes(on_client, versions, stand_ins))
    if not args.no_recipe_door:
        compiled += [c for c in compile_recipes(recipes, versions, False) if c.role == SEQUENCE]
    cells = unique_cells(compiled)
    cfg = ctx.run_config
    if setup.env is None:
        return ClientRun(setup, recipes, on_client, versions, [c for c in cells if c.door != CLIENT], cfg,
                         tuple(error_results(setup, cells)))
    return ClientRun(setup, recipes, on_client, versions, cells, replace(cfg, client=setup.env.to_spec()), ())


def error_results(setup: ClientSetup, cells: list[Cell]) -> list[CellResult]:
    """The client-door cells of a framework whose package did not install: ERROR with the installer's line."""
    from harness.core.oracle import Outcome
    from harness.verdicts.results import infra_result

    outcome = Outcome.UNSUPPORTED if setup.unsupported else Outcome.ERROR
    return [infra_result(c, outcome, f"door=client: {setup.error}") for c in cells if c.door == CLIENT]
