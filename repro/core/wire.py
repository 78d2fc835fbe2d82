"""The wire format between the harness and an engine process, written once.

The harness writes a :class:`Spec` to ``spec.json`` and starts ``python -m
repro.engine SPEC OUT``; the engine appends one JSON event per line to OUT
(and, in an interactive session, reads one :class:`ScenarioSpec` or
:data:`STOP` per stdin line).  Both sides check what they write and what they
read against this module, so a mismatch fails a unit test instead of a run.

Pure standard library: the harness imports it (it never imports vllm or
torch), and the engine finds it in the staged ``repro`` package.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from repro.settings.declared import problem as setting_problem
from repro.settings.engine_axes import engine_args, owned_engine_args

# 2: the engine's axes travel by name (EngineSpec.axes), as the harness's axes table names them.
# 3: a spec may carry ``startup_timeout`` (the server door's health wait) and the engine event ``server``
#    (the server door's URL, argv, pid and log).
# 4: a spec may carry ``client`` (the client door's framework client: framework, version, the side environment's
#    python; or ``error``, why it has none) and a scenario event ``client`` (what the framework's client ran).
# 5: a spec may carry ``gate`` (the engine waits for :data:`GO` on stdin between its ``engine`` event and its first
#    scenario: engines start up side by side while one at a time runs its scenarios, harness.run.turns).
SCHEMA_VERSION = 5
STOP: dict[str, str] = {"op": "stop"}  # interactive sessions: end the engine (the harness kills judged ones instead)
GO: dict[str, str] = {"op": "go"}  # a gated engine: run the scenarios now
# bigram-cycle: the built-in deterministic checkpoint (repro.models.deterministic); qwen3-random: the built-in
# random-weight
# Qwen3 (repro.models.realistic); context-cell: the built-in checkpoint pair that sees stale KV
# (repro.models.context_cell);
# path: the user's model, {"path": DIR} or {"name": HUB_ID} (--model).
MODEL_KINDS = ("bigram-cycle", "qwen3-random", "context-cell", "path")
# Engine arguments that a cell's axes or a harness option decide, and the option to use instead: an
# ``EngineSpec.extra`` naming one would silently relabel the cell, so both sides refuse it.
OWNED_ENGINE_ARGS: dict[str, str] = {
    **owned_engine_args(),  # those the cell's engine axes decide (repro.settings.engine_axes)
    "model": "--model",
    "gpu_memory_utilization": "--gpu-memory-utilization (it also decides how many engines share a GPU)",
    "weight_transfer_config": "--weight-transfer (the weight-sync scenario sets it where it swaps over NCCL)",
}
# "crash": vLLM's own code raised while the scenario drove it (a finding about vLLM, not a harness failure).
SCENARIO_STATUSES = ("ran", "unsupported", "timeout", "error", "crash")


class WireError(ValueError):
    """A spec or event does not match this description; ``what`` names the document, ``problem`` the mismatch."""

    def __init__(self, what: str, problem: str) -> None:
        super().__init__(f"{what}: {problem}")
        self.what, self.problem = what, problem


def _need(doc: Mapping[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    if key not in doc:
        raise WireError(what, f"missing field {key!r}")
    value = doc[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        raise WireError(what, f"field {key!r} is {type(value).__name__}, expected {_names(types)}")
    return value


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _names(types: type | tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in _tuple(types))


def _only(doc: Mapping[str, Any], allowed: set[str], what: str) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise WireError(what, f"unknown field(s) {unknown}; valid: {sorted(allowed)}")


_NUM = (int, float)


@dataclass(frozen=True)
class EngineSpec:
    """The engine config: the engine axes of a cell, by name (``harness.core.cell.Cell``'s table), which the
    engine must realise (``repro.settings.engine_axes``) and report back, and the further engine arguments."""

    axes: dict[str, Any]
    gpu_memory_utilization: float | None = None
    # Further AsyncEngineArgs on top of the engine's defaults: the user's (--engine-arg, --preset) and the
    # scheduler's (a fixed KV cache when engines share a GPU), merged by harness.run.runner.engine_extra.
    extra: dict[str, Any] = field(default_factory=dict)
    # Who asked for each key of ``extra`` (a profile, a preset, --engine-arg, the scheduler): the engine records
    # it beside the requested and effective value of every setting (repro.settings.declared).
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        owned = sorted(set(self.extra) & set(OWNED_ENGINE_ARGS))
        if owned:
            raise WireError("spec engine", f"extra engine argument(s) {owned} are decided by the cell's axes or "
                                           "the harness's own options")
        bad = [p for k, v in self.extra.items() if (p := setting_problem(k, v)) is not None]
        if bad:  # a value outside its setting's declaration (repro.settings.declared)
            raise WireError("spec engine", "; ".join(bad))

    @property
    def tensor_parallel_size(self) -> int:
        return int(engine_args(self.axes).get("tensor_parallel_size", 1))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"axes": dict(self.axes), "gpu_memory_utilization": self.gpu_memory_utilization}
        if self.extra:
            out["extra"] = dict(self.extra)
        if self.sources:
            out["sources"] = dict(self.sources)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EngineSpec:
        what = "spec engine"
        _only(doc, {"axes", "gpu_memory_utilization", "extra", "sources"}, what)
        axes = _need(doc, "axes", dict, what)
        bad = sorted(k for k, v in axes.items() if not isinstance(v, str | int | float | bool))
        if bad:
            raise WireError(what, f"axes {bad} are not JSON scalars")
        gmu = doc.get("gpu_memory_utilization")
        if gmu is not None and not isinstance(gmu, _NUM):
            raise WireError(what, f"gpu_memory_utilization is {type(gmu).__name__}, expected a number or null")
        sources = doc.get("sources") or {}
        if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
            raise WireError(what, "sources is not an object of strings")
        return cls(dict(axes), gmu, dict(doc.get("extra") or {}), dict(sources))


@dataclass(frozen=True)
class ScenarioSpec:
    """One scenario the engine runs: a spec entry, or one stdin line of an interactive session."""

    id: str
    scenario: str
    params: dict[str, Any]
    seed: int = 0
    timeout: float | None = None  # interactive only: this scenario's wait limit

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "scenario": self.scenario, "params": dict(self.params),
                               "seed": self.seed}
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ScenarioSpec:
        what = f"scenario {doc.get('id')!r}"
        _only(doc, {"id", "scenario", "params", "seed", "timeout"}, what)
        timeout = doc.get("timeout")
        if timeout is not None and not isinstance(timeout, _NUM):
            raise WireError(what, f"timeout is {type(timeout).__name__}, expected a number")
        return cls(_need(doc, "id", str, what), _need(doc, "scenario", str, what),
                   dict(doc.get("params") or {}), int(doc.get("seed", 0)),
                   None if timeout is None else float(timeout))


FUZZ_DEPTHS = (1, 2, 3)  # D: 1 is the sync Scheduler, 2 and 3 the AsyncScheduler (repro.sched.script.Setup)
FUZZ_MAX_SPEC_TOKENS = 4


@dataclass(frozen=True)
class FuzzKnown:
    """A known-bug row covering the release a fuzz run is on (harness/verdicts/known_bugs.toml, scheduler tier): a
    failing example that fits its scenario's shape is reported as KNOWN with ``bug``, not as new
    (repro.sched.known)."""

    scenario: str
    async_on: bool
    bug: str
    expect: str

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "async": self.async_on, "bug": self.bug, "expect": self.expect}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FuzzKnown:
        what = "fuzz spec known row"
        _only(doc, {"scenario", "async", "bug", "expect"}, what)
        return cls(_need(doc, "scenario", str, what), _need(doc, "async", bool, what), _need(doc, "bug", str, what),
                   _need(doc, "expect", str, what))


@dataclass(frozen=True)
class FuzzSpec:
    """A scheduler-tier fuzz run: ``"fuzz"`` in a ``python -m repro.sched`` spec (whose schema_version is
    ``repro.sched.script.SCHEMA_VERSION``, 2 since this field exists); answered by one ``fuzz`` event.

    ``examples``: Hypothesis' max_examples; ``steps``: its stateful_step_count (rules per example);
    ``seed``: the run's seed (the same seed and settings replay the same run); ``depths`` and
    ``spec_tokens``: the setups the state machine may draw; ``max_requests``: requests per example.
    """

    examples: int
    steps: int
    seed: int
    depths: tuple[int, ...] = FUZZ_DEPTHS
    spec_tokens: tuple[int, ...] = (0,)
    max_requests: int = 8  # bursts of adds and long prompts prefilled in chunks side by side
    reach: bool = False  # measure coverage of vLLM's scheduler files (repro.sched.reach; coverage.py staged)
    known: tuple[FuzzKnown, ...] = ()  # the known-bug rows covering this release (reported KNOWN, not new)

    def __post_init__(self) -> None:
        what = "fuzz spec"
        if self.examples < 1 or self.steps < 1 or self.max_requests < 1:
            raise WireError(what, f"examples={self.examples}, steps={self.steps}, max_requests={self.max_requests}: "
                                  "each must be at least 1")
        if not self.depths or not set(self.depths) <= set(FUZZ_DEPTHS):
            raise WireError(what, f"depths={list(self.depths)}; valid: a non-empty subset of {list(FUZZ_DEPTHS)}")
        if not self.spec_tokens or not all(0 <= k <= FUZZ_MAX_SPEC_TOKENS for k in self.spec_tokens):
            raise WireError(what, f"spec_tokens={list(self.spec_tokens)}; valid: a non-empty list of "
                                  f"0..{FUZZ_MAX_SPEC_TOKENS}")

    def to_json(self) -> dict[str, Any]:
        return {"examples": self.examples, "steps": self.steps, "seed": self.seed, "depths": list(self.depths),
                "spec_tokens": list(self.spec_tokens), "max_requests": self.max_requests, "reach": self.reach,
                **({"known": [k.to_json() for k in self.known]} if self.known else {})}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FuzzSpec:
        what = "fuzz spec"
        _only(doc, {"examples", "steps", "seed", "depths", "spec_tokens", "max_requests", "reach", "known"}, what)
        return cls(_need(doc, "examples", int, what), _need(doc, "steps", int, what), _need(doc, "seed", int, what),
                   tuple(_need(doc, "depths", list, what)), tuple(_need(doc, "spec_tokens", list, what)),
                   int(doc.get("max_requests", 8)), bool(doc.get("reach", False)),
                   tuple(FuzzKnown.from_json(k) for k in doc.get("known", [])))


@dataclass(frozen=True)
class Spec:
    """Everything one engine process runs: its config, the model, and its scenarios."""

    engine_id: str
    engine: EngineSpec
    model_params: dict[str, Any]
    model_cache: str
    scenario_timeout: float
    scenarios: tuple[ScenarioSpec, ...]
    interactive: bool = False  # more scenarios arrive on stdin after these
    model_kind: str = "bigram-cycle"
    startup_timeout: float | None = None  # the engine's start-up limit (the server door's health wait)
    # The client door (repro.client.door): {"framework", "version", "python"} of the framework's side environment.
    client: dict[str, Any] | None = None
    gate: bool = False  # wait for GO on stdin before the first scenario (wait_go)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "engine_id": self.engine_id,
            "engine": self.engine.to_json(),
            "model": {"kind": self.model_kind, "params": dict(self.model_params)},
            "model_cache": self.model_cache,
            "scenario_timeout": self.scenario_timeout,
            "scenarios": [s.to_json() for s in self.scenarios],
        }
        if self.interactive:
            out["interactive"] = True
        if self.startup_timeout is not None:
            out["startup_timeout"] = self.startup_timeout
        if self.client is not None:
            out["client"] = dict(self.client)
        if self.gate:
            out["gate"] = True
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Spec:
        """The spec in ``doc``; WireError on another schema version, a missing or unknown field."""
        if doc.get("schema_version") != SCHEMA_VERSION:
            raise WireError("spec", f"schema_version {doc.get('schema_version')!r}; this side reads {SCHEMA_VERSION}")
        _only(doc, {"schema_version", "engine_id", "engine", "model", "model_cache", "scenario_timeout",
                    "scenarios", "interactive", "startup_timeout", "client", "gate"}, "spec")
        model = _need(doc, "model", dict, "spec")
        kind = model.get("kind", "bigram-cycle")
        if kind not in MODEL_KINDS:
            raise WireError("spec", f"unknown model kind {kind!r}; valid: {list(MODEL_KINDS)}")
        return cls(
            engine_id=str(doc.get("engine_id", "")),
            engine=EngineSpec.from_json(_need(doc, "engine", dict, "spec")),
            model_params=dict(model.get("params") or {}),
            model_cache=_need(doc, "model_cache", str, "spec"),
            scenario_timeout=float(doc.get("scenario_timeout", 120)),
            scenarios=tuple(ScenarioSpec.from_json(s) for s in _need(doc, "scenarios", list, "spec")),
            interactive=bool(doc.get("interactive", False)),
            model_kind=kind,
            startup_timeout=None if doc.get("startup_timeout") is None else float(doc["startup_timeout"]),
            client=None if doc.get("client") is None else dict(_need(doc, "client", dict, "spec")),
            gate=bool(doc.get("gate", False)),
        )


@dataclass(frozen=True)
class EventKind:
    """An event the engine writes: the fields the harness relies on, and the others it may carry."""

    required: Mapping[str, type | tuple[type, ...]]
    optional: frozenset[str] = frozenset()


# ``precondition``: an engine-profile scenario's evidence that its event happened ({"met", "what", "evidence"};
# repro/scenarios/_profile.py); the harness makes an unmet one UNSUPPORTED unless a stream is wrong anyway, and with
# ``strict`` (the client door's, repro.client.door.precondition) UNSUPPORTED whatever the streams say.
_SCENARIO_FIELDS = frozenset({"records", "events", "duration_s", "probe_after", "weight_sync", "reason", "client",
                              "engine_recovered", "traceback", "precondition"})
# The scheduler tier (``python -m repro.sched``): its script, what the scheduler did, where vLLM raised, and
# (``end_state``, repro.sched.inflight) what it still held at the end, (``connector``,
# repro.sched.reset_connector) its KV connector's recorded reset_cache() calls.
_SCHED_SCENARIO_FIELDS = frozenset({"scenario", "setup", "scheduler", "depth", "scheduler_class", "ops_log",
                                    "stalled", "stall_state", "iterations", "frames", "empty_frames", "setup_s",
                                    "vllm_frame", "vllm_source", "exception_type", "message", "spec_method",
                                    "end_state", "connector", "spec_steps"})
EVENTS: dict[str, EventKind] = {
    # pid and process group: the harness kills the whole group.
    "start": EventKind({"pgid": int}, frozenset({"pid", "engine_id", "python"})),
    # Start-up facts: versions, platform, requested and *effective* settings.
    "engine": EventKind({"probe": (dict, type(None))}, frozenset({
        "vllm_version", "torch_version", "python", "platform", "platform_class", "device_name", "model",
        "requested", "effective", "startup_s", "unsupported_reason", "started", "engine_kwargs", "server"})),
    # One per scenario; what else it carries depends on ``status`` (see check_event).
    "scenario": EventKind({"id": str, "status": str}, _SCENARIO_FIELDS | _SCHED_SCENARIO_FIELDS),
    # The scheduler tier's start-up facts: the release's scheduler API as detected (repro.sched.adapter).
    "sched": EventKind({}, frozenset({
        "vllm_version", "torch_version", "platform", "scheduler_classes", "scheduler_init_params",
        "reset_prefix_cache_params", "pause_state", "discard_mechanism", "model_runner_output_fields",
        "request_init_params", "import_s", "python", "version_label", "model_dir", "load_s",
        "unsupported_reason"})),
    # The answer to a spec's ``fuzz`` (FuzzSpec): what the state machine ran, and its falsifying example (the
    # shrunk op script, Hypothesis' failure, and the scenario fields of that script replayed as an ``ops`` scenario);
    # ``known``: the known-bug rows its examples met, each once (repro.sched.known).
    "fuzz": EventKind({"status": str}, frozenset({
        "examples", "examples_to_failure", "wall_s", "examples_per_s", "cpu_s", "seed", "settings",
        "hypothesis_version", "coverage", "dropped", "falsifying", "reason", "traceback", "reach", "phases",
        "known"})),
    "fatal": EventKind({"reason": str}, frozenset({"traceback"})),
    "done": EventKind({}, frozenset({"wall_s"})),
    # A gated engine (Spec.gate) got its turn: how long it waited, started up, for the engines before it.
    "turn": EventKind({"waited_s": (int, float)}),
}
# status -> the field the harness reads besides id and status
_STATUS_NEEDS: dict[str, tuple[str, type]] = {"ran": ("records", list), "unsupported": ("reason", str),
                                              "timeout": ("reason", str), "error": ("reason", str),
                                              "crash": ("reason", str)}
FUZZ_STATUSES = ("ran", "unsupported", "error")
# fuzz status -> the field the harness reads besides status ("falsifying" may be null: nothing found)
_FUZZ_NEEDS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "ran": ("falsifying", (dict, type(None))), "unsupported": ("reason", str), "error": ("reason", str)}


def check_event(ev: Mapping[str, Any], strict: bool = False) -> Mapping[str, Any]:
    """``ev`` if it is a valid event, else WireError.

    The harness reads with ``strict=False`` (the fields it relies on);
    the engine writes with ``strict=True`` (also no field outside the description).
    """
    kind = ev.get("event")
    if kind not in EVENTS:
        raise WireError("event", f"unknown event kind {kind!r}; valid: {sorted(EVENTS)}")
    what = f"{kind} event"
    desc = EVENTS[kind]
    for key, types in desc.required.items():
        _need(ev, key, types, what)
    if kind == "scenario":
        status = ev["status"]
        if status not in _STATUS_NEEDS:
            raise WireError(what, f"unknown status {status!r}; valid: {list(SCENARIO_STATUSES)}")
        key, typ = _STATUS_NEEDS[status]
        _need(ev, key, typ, f"{what} ({status})")
    if kind == "fuzz":
        status = ev["status"]
        if status not in _FUZZ_NEEDS:
            raise WireError(what, f"unknown status {status!r}; valid: {list(FUZZ_STATUSES)}")
        key, types = _FUZZ_NEEDS[status]
        _need(ev, key, types, f"{what} ({status})")
        if status == "ran":
            _need(ev, "examples", int, f"{what} ({status})")
    if strict:
        _only(ev, {"event", "t", *desc.required, *desc.optional}, what)
    return ev


async def wait_go() -> None:
    """A gated engine (``Spec.gate``): block until the harness sends :data:`GO`, or closes stdin (it is gone, or
    gave up on the gate; the parent watchdog ends an orphan)."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or (line.strip() and json.loads(line) == GO):
            return


async def stdin_scenarios() -> AsyncIterator[ScenarioSpec]:
    """Session mode (pytest, Hypothesis; either door): scenarios as JSON lines on stdin until EOF or :data:`STOP`."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        if not line.strip():
            continue
        doc = json.loads(line)
        if doc == STOP:
            return
        yield ScenarioSpec.from_json(doc)
