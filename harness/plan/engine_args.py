"""The user's engine set-up: ``--model``, ``--engine-arg KEY=VALUE``, ``--engine-args FILE.json``, ``--preset``.

"Does *my* RL setup lose tokens on this vLLM?" needs the user's model and
engine arguments in the cells.  This module turns the options into one
:class:`EngineSetup` (pure: it reads the files it is given, nothing else):

* the model: a built-in checkpoint (``bigram-cycle``, the default;
  ``qwen3-random``, a random-weight Qwen3 of realistic shape), a local Hugging
  Face folder, or a hub id (only where the machine has network);
* engine arguments, later ones winning: the preset's, each ``--engine-args``
  file's, each ``--engine-arg``.  They override the engine's own defaults
  (``repro.engine.main.engine_kwargs``); the ones a cell's axes decide
  (``repro.core.wire.OWNED_ENGINE_ARGS``) are refused, naming the option to use;
* a preset: the engine settings of a configuration people copy, with its
  source.  What the preset sets that is a cell axis or a harness option maps
  onto it (Ray -> ``--executor ray-v2``, ``VLLM_BATCH_INVARIANT=1`` ->
  ``--batch-invariant on``, ``gpu_memory_utilization`` -> ``--gpu-memory-utilization``)
  wherever the user did not choose.

A malformed value is :class:`BadInput` (exit 2); whether vLLM accepts an
argument is for vLLM to say: the engine reports a rejected one as UNSUPPORTED
with vLLM's message (``repro.engine.main``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.core.errors import BadInput
from harness.core.schema import Anything, MapOf, Str, validate
from repro.core.wire import OWNED_ENGINE_ARGS
from repro.models.context_cell import KIND as CONTEXT_CELL
from repro.models.realistic import KIND as QWEN3_RANDOM
from repro.models.realistic import spec_for
from repro.settings.declared import problem as setting_problem

BIGRAM = "bigram-cycle"
BUILTIN_MODELS: dict[str, str] = {
    BIGRAM: "the default: a 1-layer Llama whose greedy stream walks one permutation cycle, no token ever repeats",
    QWEN3_RANDOM: "a random-weight Qwen3 with 128-wide heads, GQA and q/k norms: ~46M parameters on cpu, "
                  "Qwen3-0.6B's shape, ~0.75B in bfloat16, on cuda; built locally, no hub",
    CONTEXT_CELL: "a hand-weighted 1-layer Llama pair A/B whose next token reads the prompt's marker through "
                  "attention, so KV written by the other weights shows (the stale-kv scenarios); built locally",
}
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# An --engine-args file (and a preset's engine args): AsyncEngineArgs field names to any JSON value; whether vLLM
# takes the value is vLLM's to say (UNSUPPORTED with its message).
ENGINE_ARGS = MapOf(Anything(), Str(pattern=_KEY.pattern, what="an AsyncEngineArgs field name"),
                    what="a JSON object of engine arguments")


@dataclass(frozen=True)
class Preset:
    """Engine settings people copy, and where they come from."""

    name: str
    source: str
    engine_args: Mapping[str, Any]  # on every platform
    cuda_engine_args: Mapping[str, Any] = field(default_factory=dict)  # on cuda only
    gpu_memory_utilization: float | None = None  # the harness's own option (cuda)
    axes: Mapping[str, str] = field(default_factory=dict)  # matrix axis option -> value, on cuda
    model: str | None = None  # the built-in model standing in for the source's, unless --model is given
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        axes = " ".join(f"--{k} {v}" for k, v in self.axes.items())
        return (f"{self.name} = engine args {_kv(self.engine_args)}; on cuda also {_kv(self.cuda_engine_args)}, "
                f"--gpu-memory-utilization {self.gpu_memory_utilization} and, for matrix where you choose none, "
                f"{axes}; model {self.model} unless --model. Source: {self.source}")


def _kv(args: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in args.items()) or "none"


RLHF_SOURCE = ("vllm-project/vllm examples/rl/rlhf_async_new_apis.py at commit "
               "defa164e131d6a8848ee5269af0f99e1d3eaf6c0 (the version carrying the async_scheduling=False "
               "workaround for vllm#42043): llm_kwargs / llm_v2_kwargs")
PRESETS: dict[str, Preset] = {
    "rlhf-async-new-apis": Preset(
        name="rlhf-async-new-apis",
        source=RLHF_SOURCE,
        engine_args={"enforce_eager": True, "max_model_len": 8192},
        # ATTN_BACKEND: FLASH_ATTN on NVIDIA (TRITON_ATTN on ROCm); the example has no CPU branch.
        cuda_engine_args={"attention_backend": "FLASH_ATTN"},
        gpu_memory_utilization=0.75,
        # distributed_executor_backend="ray": Ray executor v2 is vLLM 0.21/0.22's default Ray executor
        # (VLLM_USE_RAY_V2_EXECUTOR_BACKEND defaults to 1); VLLM_BATCH_INVARIANT=1 on NVIDIA.
        axes={"executor": "ray-v2", "batch-invariant": "on"},
        model=QWEN3_RANDOM,
        notes=("model: the example runs Qwen/Qwen3-1.7B-Base; qwen3-random stands in offline (pass --model to "
               "use yours)",
               "async_scheduling=False is the workaround under test: the cell's --async axis sets it, both ways",
               "weight_transfer_config=WeightTransferConfig(backend='nccl'): the weight-sync scenario's "
               "--weight-transfer (auto = nccl where a spare GPU holds the trainer)",
               "ROCm's determinism kwargs (seed=0, enable_prefix_caching=False, max_num_seqs=1) are for ROCm, "
               "which the harness does not run; pass them with --engine-arg to try them"),
    ),
}


@dataclass(frozen=True)
class ModelChoice:
    """The model every engine of a run loads: a built-in kind with its params, or ``path`` (a folder or hub id)."""

    kind: str
    params: dict[str, Any]
    label: str  # as shown in reports: the built-in name, the folder, the hub id

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": dict(self.params), "label": self.label}


@dataclass(frozen=True)
class EngineSetup:
    """Everything a run takes from ``--model``, ``--engine-arg(s)`` and ``--preset``."""

    model: ModelChoice
    engine_args: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    gpu_memory_utilization: float | None = None  # from the preset, where the user gave no value
    axes: dict[str, str] = field(default_factory=dict)  # from the preset: defaults for the matrix axis options

    @property
    def is_default(self) -> bool:
        return self.model.kind == BIGRAM and not self.model.params and not self.engine_args

    def to_dict(self) -> dict[str, Any]:
        """What a report's header and run.json record."""
        return {"model": self.model.to_dict(), "engine_args": dict(self.engine_args), "preset": self.preset}


def parse_value(raw: str) -> Any:
    """A command-line value: JSON (``true``, ``8192``, ``0.5``, ``{"k": 1}``, ``null``), Python's True/False/None,
    else the string itself (``FLASH_ATTN``)."""
    python = {"True": True, "False": False, "None": None}
    if raw in python:
        return python[raw]
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_engine_arg(raw: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, value); BadInput for anything else."""
    key, sep, value = raw.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not _KEY.match(key):
        raise BadInput(f"--engine-arg {raw!r}: give KEY=VALUE with an AsyncEngineArgs field name as KEY, "
                       "e.g. enable_prefix_caching=false or max_model_len=8192")
    return key, parse_value(value.strip())


def read_engine_args_file(path: Path) -> dict[str, Any]:
    """A JSON object of engine arguments; BadInput naming the file when it cannot be used."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"--engine-args {path}: cannot read it ({exc.strerror})") from exc
    except ValueError as exc:
        raise BadInput(f"--engine-args {path}: not JSON ({exc})") from exc
    validate(ENGINE_ARGS, doc, f"--engine-args {path}")
    return dict(doc)


def check_owned(args: Mapping[str, Any], where: str) -> None:
    """BadInput when ``args`` names an engine argument a cell axis or a harness option decides, or gives a declared
    setting a value outside its declaration (repro.settings.declared: ``max_num_seqs=0``,
    ``enable_prefix_caching=2``)."""
    for key, value in args.items():
        if key in OWNED_ENGINE_ARGS:
            raise BadInput(f"{where}: {key} is decided by the cell, not by an engine argument; use "
                           f"{OWNED_ENGINE_ARGS[key]}")
        bad = setting_problem(key, value)
        if bad is not None:
            raise BadInput(f"{where}: {bad}")


def parse_model(raw: str | None, platform: str) -> ModelChoice:
    """``--model``: a built-in name, a local Hugging Face folder (must hold config.json), or a hub id."""
    if raw is None or raw == BIGRAM:
        return ModelChoice(BIGRAM, {}, BIGRAM)
    if raw == QWEN3_RANDOM:
        return ModelChoice(QWEN3_RANDOM, asdict(spec_for(platform)), QWEN3_RANDOM)
    if raw == CONTEXT_CELL:  # its spec's defaults, weights A (repro.models.kinds)
        return ModelChoice(CONTEXT_CELL, {}, CONTEXT_CELL)
    path = Path(raw).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BadInput(f"--model {raw}: the folder has no config.json (not a Hugging Face model folder)")
        return ModelChoice("path", {"path": str(path.resolve())}, str(path.resolve()))
    if path.exists() or raw.startswith((".", "/", "~")) or raw.count("/") != 1:
        raise BadInput(f"--model {raw!r}: not a model folder, a hub id (ORG/NAME) or a built-in model; "
                       f"built-in: {', '.join(BUILTIN_MODELS)}")
    return ModelChoice("path", {"name": raw}, raw)


def preset_by_name(name: str) -> Preset:
    if name not in PRESETS:
        raise BadInput(f"unknown --preset {name!r}; valid choices: {', '.join(PRESETS)}")
    return PRESETS[name]


def engine_setup(platform: str, model: str | None = None, engine_args: Sequence[str] = (),
                 files: Sequence[Path] = (), preset: str | None = None) -> EngineSetup:
    """The run's engine set-up from the raw options; BadInput names the first bad one."""
    p = preset_by_name(preset) if preset else None
    merged: dict[str, Any] = {}
    if p is not None:
        merged.update(p.engine_args)
        if platform == "cuda":
            merged.update(p.cuda_engine_args)
        check_owned(merged, f"--preset {p.name}")
    for path in files:
        args = read_engine_args_file(path)
        check_owned(args, f"--engine-args {path}")
        merged.update(args)
    for raw in engine_args:
        key, value = parse_engine_arg(raw)
        check_owned({key: value}, f"--engine-arg {raw}")
        merged[key] = value
    choice = parse_model(model if model is not None or p is None else p.model, platform)
    cuda = p is not None and platform == "cuda"
    return EngineSetup(choice, merged, p.name if p else None,
                       p.gpu_memory_utilization if cuda and p else None, dict(p.axes) if cuda and p else {})


def presets_help() -> str:
    """The presets and their sources, for ``--help``."""
    return "; ".join(p.describe() for p in PRESETS.values())
