"""The engine arguments of a cell as ``vllm serve`` command-line flags, from vLLM's own argument parser.

The server door must start ``vllm serve`` with exactly the ``AsyncEngineArgs`` the engine door passes
(``repro.engine.main.engine_kwargs``).  Each field is spelled with the option string vLLM's parser
(``make_arg_parser``: ``AsyncEngineArgs.add_cli_args`` plus the front end's; its module per release is
``repro.core.server_layout.CLI_ARGS``) declares for it, read from the parser's actions, never from a hand-kept list;
then the flags are parsed back with the same parser and ``AsyncEngineArgs.from_cli_args`` and every field
compared with what was asked (:func:`serve_argv`): a field the CLI cannot carry (an object, a flag that parses to
something else) refuses the cell with the field named, instead of starting a server with other settings.

:func:`flags` is pure (unit-tested on plain action descriptions); :func:`serve_argv` needs vLLM.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from repro.core.server_layout import LayoutError, make_arg_parser


class ArgMappingError(Exception):
    """An engine argument that the ``vllm serve`` command line cannot carry as asked."""


@dataclass(frozen=True)
class Option:
    """How the parser takes one field: its long option, and whether it is a boolean flag (and its negation)."""

    option: str
    boolean: bool = False
    negation: str | None = None  # BooleanOptionalAction's --no-x; None for store_true


def _value(field: str, value: Any) -> str:
    if isinstance(value, (dict, list)):
        # vLLM's parser reads dict/config-class fields as JSON (FlexibleArgumentParser / the config's parse).
        return json.dumps(value)
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ArgMappingError(f"engine argument {field}={value!r} ({type(value).__name__}) has no command-line form")


def flags(kwargs: Mapping[str, Any], options: Mapping[str, Option]) -> list[str]:
    """``kwargs`` as command-line flags; None values are left to the parser's default (as AsyncEngineArgs)."""
    out: list[str] = []
    for field, value in kwargs.items():
        if value is None:
            continue
        opt = options.get(field)
        if opt is None:
            raise ArgMappingError(f"vllm serve has no command-line option for engine argument {field!r}")
        if opt.boolean:
            if value is True:
                out.append(opt.option)
            elif value is False and opt.negation is not None:
                out.append(opt.negation)
            elif value is not False:
                raise ArgMappingError(f"engine argument {field}={value!r}: {opt.option} is a boolean flag")
            # False with a store_true flag: the default, nothing to pass.
            continue
        out += [opt.option, _value(field, value)]
    return out


def options_of(parser: argparse.ArgumentParser) -> dict[str, Option]:
    """Every destination of ``parser``: its long option (first ``--`` spelling), booleans and their negation."""
    out: dict[str, Option] = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.dest in out:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            neg = next((s for s in longs if s.startswith("--no-")), None)
            pos = next((s for s in longs if not s.startswith("--no-")), longs[0])
            out[action.dest] = Option(pos, True, neg)
        elif isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            out[action.dest] = Option(longs[0], True, None)
        else:
            out[action.dest] = Option(longs[0])
    return out


def _same(asked: Any, got: Any) -> bool:
    if asked == got:
        return True
    # Config-class fields parse JSON into their class (e.g. CompilationConfig); compare what can be compared.
    as_dict = getattr(got, "__dict__", None)
    return isinstance(asked, dict) and isinstance(as_dict, dict) and all(
        as_dict.get(k) == v for k, v in asked.items())


def serve_argv(kwargs: Mapping[str, Any], host: str, port: int) -> list[str]:
    """The flags of ``vllm serve`` for ``kwargs`` (and ``host``/``port``), checked by parsing them back."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = _server_parser()(FlexibleArgumentParser())
    argv = ["--host", host, "--port", str(port), *flags(kwargs, options_of(parser))]
    parsed = AsyncEngineArgs.from_cli_args(parser.parse_args(argv))
    wrong = {k: getattr(parsed, k, "<missing>") for k, v in kwargs.items()
             if v is not None and not _same(v, getattr(parsed, k, "<missing>"))}
    if wrong:
        raise ArgMappingError(f"vllm serve parses {argv} to other engine arguments than asked: "
                              + ", ".join(f"{k}={g!r} (asked {kwargs[k]!r})" for k, g in wrong.items()))
    return argv


def _server_parser() -> Any:
    """vLLM's ``make_arg_parser``, wherever this release keeps it (``repro.core.server_layout.CLI_ARGS``)."""
    try:
        return make_arg_parser()
    except LayoutError as exc:
        raise ArgMappingError(f"the server door does not know this vLLM's server command line: {exc}") from None
