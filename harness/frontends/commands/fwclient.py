"""``frameworks check --door client`` (issue 36 item 1): the framework's released client, installed into a side
environment (``harness.envbuild.client_env``), pauses and resumes the project's vLLM server
(``repro.client.door``); the recipe's cells run on that door, judged by the same oracle."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from harness.core.errors import BadInput, bad_choice
from harness.frontends.commands.context import Context

if TYPE_CHECKING:
    from harness.envbuild.client_env import ClientEnv
    from harness.plan.matrix import Cell
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


@dataclass(frozen=True)
class ClientSetup:
    """The client door of one run: the framework's client, the release tried, its env or why it has none."""

    client: Client
    env: ClientEnv | None
    failures: tuple[str, ...]  # one line per release that did not install (the installer's last line)

    @property
    def error(self) -> str:
        return self.failures[-1] if self.failures else ""

    def lines(self) -> list[str]:
        """The report's header: the framework release and the client module run, and every stand-in."""
        from repro.client.clients import standins

        c = self.client
        head = (f"client door: {c.package} {self.env.version}, {c.module}.{c.cls} "
                f"({', '.join(f'{m}()' for _, m in c.calls)}), side environment {self.env.path}"
                if self.env else f"client door: {c.package}: ERROR: {self.error}")
        return [head, *(f"  not installed: {f}" for f in self.failures if self.env),
                *(f"  stand-in {s.module}: {s.reason}; unchanged: {s.unchanged}" for s in standins(c.framework))]


def client_for(recipes: tuple[Recipe, ...]) -> Client:
    """The one framework's client (BadInput: none, several, or a framework without a client door)."""
    from repro.client.clients import CLIENTS

    if len(recipes) != 1:
        raise BadInput(f"--door client runs one framework at a time; give --framework with one of: "
                       f"{', '.join(CLIENTS)}")
    client = CLIENTS.get(recipes[0].name)
    if client is None:
        raise bad_choice("framework for --door client (no client door yet; it stays on its recipe)",
                         recipes[0].name, tuple(CLIENTS))
    return client


def setup_client(ctx: Context, args: argparse.Namespace, recipes: tuple[Recipe, ...]) -> ClientSetup:
    """Resolve the release (BadInput for an unknown one, before anything is written) and build its env."""
    from harness.envbuild import client_env as ce

    client = client_for(recipes)
    pv = ce._python_version(ctx.python)
    versions = ce.chosen_versions(client, args.framework_version, ce.releases(client, ctx.index, pv))
    env, failures = ce.newest_that_installs(
        client, versions, lambda v: ce.ensure_client_env(client, v, ctx.cache, ctx.python, ctx.index, pv))
    return ClientSetup(client, env, failures)


def on_client_door(recipes: tuple[Recipe, ...]) -> tuple[Recipe, ...]:
    return tuple(replace(r, door=CLIENT) for r in recipes)


def error_results(setup: ClientSetup, cells: list[Cell]) -> list[CellResult]:
    """The client-door cells of a framework whose package did not install: ERROR with the installer's line."""
    from harness.core.oracle import Outcome
    from harness.verdicts.results import infra_result

    return [infra_result(c, Outcome.ERROR, f"door=client: {setup.error}") for c in cells if c.door == CLIENT]
