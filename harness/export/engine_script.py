"""An engine-tier plan as one self-contained Python file vLLM can paste (``vllm-repro plan PLAN.json
--export-pytest FILE``; issue 23 item 5, the engine-tier half).

The file imports only vLLM and the standard library (pytest only to skip on a vLLM without pause modes) and runs
as ``python FILE`` or ``pytest FILE``.  Its body is ``repro/engine/reproducer_template.py`` copied verbatim: the tiny
bigram-cycle checkpoint the harness builds (repro/models/deterministic.py), written in pure Python (same config,
same cycle,
so the same greedy streams; the random matrices that never reach the logits are drawn from Python's generator,
not numpy's), the harness's plugin cut to the two parts the replay needs (the engine-core progress probe, and on
vLLM's CPU platform the re-enabled async scheduling of repro/patches/shim.py), and the driver
(repro/scenarios/driver.py)
cut to what the plan format holds.  The model, the engine arguments and environment the harness would start the
engine with (repro/engine/main.py ``engine_kwargs``, repro/settings/engine_axes.py), the plan and one test follow
as literals.
The harness itself never imports vLLM: the template is read as text.
"""

from __future__ import annotations

import importlib.resources
import json
import pprint
import textwrap
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.core.cell import EngineKey, parse_cell_id
from harness.core.errors import BadInput
from harness.plan.plan_file import check_plan_fits, model_limits
from harness.run.spec import RunConfig, build_spec, engine_axes, scenario_spec
from repro.models.deterministic import BigramCycleSpec, hf_config
from repro.models.kinds import BIGRAM, BIGRAM_DEFAULTS, LoadedModel
from repro.settings.engine_axes import engine_env

TEMPLATE = "reproducer_template.py"  # in the repro.engine package
# What the engine process's environment gets besides the cell's axes (harness.run.engine_process.engine_env): no
# flashinfer sampler (not needed for greedy), and on CPU the KV cache the harness gives it (--kv-cache-gib).
PROCESS_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
# The executors vLLM's CPU platform runs as labelled: it replaces uni with mp, and Ray does not run on it.
EXPORTABLE_EXECUTORS = ("mp",)


def reproducer_engine(async_on: bool, executor: str, kv_cache_gib: int = 1) -> tuple[dict[str, Any], dict[str, str]]:
    """(engine arguments without ``model``, environment) the harness starts a default-setup engine with."""
    if executor not in EXPORTABLE_EXECUTORS:
        raise BadInput(f"--export-pytest writes an engine for vLLM's CPU platform, which runs the mp executor only "
                       f"(it replaces uni with mp; Ray does not run on it): executor {executor!r} cannot be exported")
    from repro.engine.main import engine_kwargs  # repro.engine.main imports vLLM lazily: reading its defaults is pure

    engine = EngineKey("export", executor, async_on)
    cfg = RunConfig(platform="cpu", work_dir=Path("."), model_cache=Path("."))
    spec = build_spec(engine, (), cfg)
    args = engine_kwargs(spec, LoadedModel(BIGRAM, "MODEL", BigramCycleSpec(), None, None, dict(BIGRAM_DEFAULTS)))
    args.pop("model")
    return args, {**PROCESS_ENV, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), **engine_env(engine_axes(engine))}


def export_plan(plan: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The engine-tier plan as the file replays it (every request's ``submit`` spelled out); BadInput for what it
    cannot replay faithfully."""
    if plan.get("tier", "engine") != "engine":
        raise BadInput(f"{where}: not an engine-tier plan")
    vocab, max_len = model_limits(BIGRAM, {}, {})
    check_plan_fits(plan, where, vocab, max_len)  # the file builds the harness's default model only
    requests = [{"rid": r["rid"], "prompt": list(r["prompt"]), "max_tokens": r["max_tokens"],
                 "submit": r.get("submit", "start")} for r in plan["requests"]]
    pauses = [dict(p) for p in plan.get("pauses") or []]
    for k, p in enumerate(pauses):
        if p.get("reset") and p["mode"] == "abort":
            raise BadInput(f"{where}: pauses[{k}]: a reset during an abort pause has no running request to "
                           "preempt; the manual reset is a keep- or wait-mode pause's")
    return {"requests": requests, "pauses": pauses}


def _summary(plan: Mapping[str, Any]) -> str:
    starts = sum(1 for r in plan["requests"] if r["submit"] == "start")
    pauses = "; ".join(
        f"pause {k} ({p['mode']}, clear_cache={p['clear_cache']}"
        + (", then reset_prefix_cache(reset_running_requests=True)" if p.get("reset") else "")
        + f") once every running request has {p['after_tokens']} tokens" for k, p in enumerate(plan["pauses"]))
    return (f"{len(plan['requests'])} request(s), {starts} submitted at start" + (f"; {pauses}" if pauses else "")
            + ".")


def _docstring(plan: Mapping[str, Any], found: Mapping[str, Any], source: str, async_on: bool,
               executor: str) -> str:
    lines = [f"Reproducer exported by vllm-repro from {source}: vLLM's AsyncLLM with async_scheduling="
             f"{async_on}, the {executor} executor, on a tiny bigram-cycle Llama the file builds itself.", "",
             f"Plan: {_summary(plan)}", "",
             "Every stream must equal the same engine's no-pause reference; after a keep pause, the first post-resume "
             "token must be the reference's token at the pause index."]
    if found.get("cell"):
        lines += ["", f"The plan of vllm-repro's matrix cell {found['cell']}."]
    if found.get("summary"):
        lines += ["", str(found["summary"])]
    lines += ["", "Targets vLLM's CPU platform (vllm-cpu), where the plugin part below re-enables async scheduling; "
              "on a GPU that part stays idle (not measured there).", "",
              "Run: python THIS_FILE   or   pytest -q THIS_FILE   (needs only vllm; pytest to run it as a test)."]
    text = "\n".join(textwrap.fill(line, 110) if line else line for line in lines)
    return text.replace('"""', "'''").replace("\\", "\\\\")


def _literal(name: str, value: Any) -> str:
    return f"{name} = {pprint.pformat(value, width=110, sort_dicts=False)}\n"


def export_engine(plan: Mapping[str, Any], source: str, test_name: str, async_on: bool = True,
                  executor: str = "mp", timeout: float = 120.0, kv_cache_gib: int = 1) -> str:
    """The file's text for the engine-tier ``plan`` (read from ``source``) on an engine with ``async_on`` and
    ``executor``; ``timeout``: seconds any one wait may take (the harness's --scenario-timeout); ``kv_cache_gib``:
    the harness's --kv-cache-gib."""
    replayed = export_plan(plan, source)
    args, env = reproducer_engine(async_on, executor, kv_cache_gib)
    spec = BigramCycleSpec()
    template = importlib.resources.files("repro.engine").joinpath(TEMPLATE).read_text(encoding="utf-8")
    doc = _docstring(replayed, plan.get("found") or {}, Path(source).name, async_on, executor)
    body = template.replace("__DOCSTRING__", doc, 1)
    test = (f"\n\n{_literal('MODEL', asdict(spec))}{_literal('MODEL_CONFIG', hf_config(spec))}"
            f"{_literal('ENGINE_ENV', env)}{_literal('ENGINE_ARGS', args)}{_literal('PLAN', replayed)}"
            f"TIMEOUT = {float(timeout)!r}  # seconds any one wait may take\n\n\n"
            f"def {test_name}(tmp_path):\n"
            "    run_plan(tmp_path, MODEL, MODEL_CONFIG, ENGINE_ENV, ENGINE_ARGS, PLAN, TIMEOUT)\n\n\n"
            'if __name__ == "__main__":\n'
            "    import tempfile\n\n"
            "    with tempfile.TemporaryDirectory() as tmp:\n"
            f"        {test_name}(Path(tmp))\n"
            '    print("passed: every stream equals its no-pause reference")\n')
    return body.rstrip("\n") + "\n" + test


# The matrix scenarios whose whole plan the engine-tier plan format holds: the pause scenario's modes, and the
# manual reset (a keep pause without clear_cache, then the client's reset).  The others drive the engine in ways
# the format (and so the file) has no words for: weight swaps, sleep, in-flight resets and aborts, engine profiles.
CELL_SCENARIOS = {"pause": "", "manual-reset": "manual_reset"}


def plan_json(plan: Mapping[str, Any]) -> str:
    """``plan`` as JSON with one line per request and pause (a diff of two plans reads line by line)."""
    parts = []
    for key, value in plan.items():
        if isinstance(value, list) and value:
            rows = ",\n".join(f"  {json.dumps(v)}" for v in value)
            parts.append(f" {json.dumps(key)}: [\n{rows}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def cell_plan(cell_id: str, scenario_params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The engine-tier plan matrix cell ``cell_id`` runs (its requests, prompts, seed and pauses, as the harness
    builds them; ``scenario_params``: the run's --num-requests, --max-tokens, --pause-after, default theirs);
    BadInput for a cell whose scenario the format cannot hold."""
    from repro.scenarios import SCENARIOS

    cell = parse_cell_id(cell_id)
    if cell.tier != "engine" or cell.door != "engine":
        raise BadInput(f"{cell_id}: only engine-tier cells driven through AsyncLLM can be exported "
                       f"(tier {cell.tier}, door {cell.door})")
    if cell.scenario not in CELL_SCENARIOS:
        raise BadInput(f"{cell_id}: scenario {cell.scenario!r} does more than generate, pause, reset and resume "
                       f"(see docs/scenarios.md); exportable: {', '.join(CELL_SCENARIOS)}")
    if cell.tp != 1:
        raise BadInput(f"{cell_id}: tensor-parallel size {cell.tp}; the exported file runs one CPU worker")
    cfg = RunConfig(platform="cpu", work_dir=Path("."), model_cache=Path("."),
                    scenario_params=dict(scenario_params or {}))
    sc = scenario_spec(cell, cfg)
    plan = SCENARIOS[sc.scenario](sc.id, dict(sc.params), BigramCycleSpec().vocab_size, sc.seed)
    prefix = f"{sc.id}-"
    requests = [{"rid": r.rid.removeprefix(prefix), "prompt": list(r.prompt), "max_tokens": r.max_tokens,
                 "submit": r.submit if isinstance(r.submit, str) else list(r.submit)} for r in plan.requests]
    reset = cell.scenario == "manual-reset"
    pauses = [{"mode": p.mode, "clear_cache": p.clear_cache, "after_tokens": p.after_tokens,
               **({"reset": True} if reset else {})} for p in plan.pauses]
    return {"requests": requests, "pauses": pauses,
            "found": {"cell": cell.id, "scenario": sc.scenario, "params": dict(sc.params), "seed": sc.seed}}
