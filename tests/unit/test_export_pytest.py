"""``vllm-repro plan PLAN.json --export-pytest FILE``: a scheduler-tier plan as one self-contained pytest file
(harness.export.sched_pytest).  The file's run against vLLM is measured in docs/results/export-pytest-2026-12-01/;
here: what it holds, that it parses, that it imports only vLLM, pytest and the standard library, and that the
plan's ops, requests and setup reach it unchanged."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from harness.core.errors import BadInput
from harness.export.sched_pytest import export_pytest, reproducer_name
from harness.frontends.cli import main

pytestmark = pytest.mark.unit

# vllm#42043's never-finishing request, as `vllm-repro fuzz --versions 0.21.0 --depth 2 --seed 1` shrank it.
STALL_PLAN = {"tier": "scheduler", "script": {
    "scheduler": "async", "depth": 2, "num_blocks": 64, "max_steps": 2000,
    "requests": [{"rid": "r0", "prompt": [2], "max_tokens": 3}],
    "ops": [{"op": "add", "rid": "r0"}, {"op": "reset", "in_flight": 0}, {"op": "run"}]},
    "found": {"version": "0.21.0", "seed": 1, "summary": "STALL: vLLM's scheduler never finished a request"}}


def _module(text: str) -> ast.Module:
    return ast.parse(text)


def _literal(tree: ast.Module, name: str) -> object:
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not assigned")


def test_the_file_imports_only_vllm_pytest_and_the_standard_library() -> None:
    tree = _module(export_pytest(STALL_PLAN, "falsifying-0.21.0.json"))
    roots = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    roots |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {r for r in roots if r not in sys.stdlib_module_names} == {"vllm", "pytest"}


def test_the_plan_reaches_the_file_unchanged_with_one_test() -> None:
    text = export_pytest(STALL_PLAN, "plans/falsifying-0.21.0.json")
    tree = _module(text)
    assert _literal(tree, "OPS") == STALL_PLAN["script"]["ops"]  # type: ignore[index]
    assert _literal(tree, "REQUESTS") == {"r0": {"prompt": [2], "max_tokens": 3}}
    setup = _literal(tree, "SETUP")
    assert isinstance(setup, dict)
    assert (setup["scheduler"], setup["depth"], setup["num_blocks"], setup["max_steps"]) == ("async", 2, 64, 2000)
    tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    assert tests == ["test_falsifying_0_21_0"]
    doc = ast.get_docstring(tree) or ""
    assert "add r0; reset (0 in flight); run" in doc and "Found on vLLM 0.21.0 (seed 1): STALL" in doc


@pytest.mark.parametrize("plan, message", [
    ({"requests": [], "pauses": []}, "scheduler-tier plan"),
    ({"tier": "scheduler", "script": {"requests": [], "ops": [{"op": "jump"}]}}, "unknown op"),
    ({"tier": "scheduler", "script": {"requests": [{"rid": "a", "prompt": [600], "max_tokens": 1}], "ops": []}},
     "outside the vocabulary"),
    ({"tier": "scheduler", "script": {"kv_consumer": True, "requests": [], "ops": []}}, "kv_consumer"),
    # The fuzzer's richer rules (issue 23): the template would build another scheduler, so they are refused.
    ({"tier": "scheduler", "script": {"policy": "priority", "requests": [], "ops": []}}, "policy='priority'"),
    ({"tier": "scheduler", "script": {"long_prefill_token_threshold": 8, "requests": [], "ops": []}},
     "long_prefill_token_threshold=8"),
    ({"tier": "scheduler", "script": {"requests": [], "ops": [{"op": "pause", "mode": "new"}]}}, "PAUSED_NEW"),
])
def test_what_cannot_be_exported_is_refused(plan: dict[str, object], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        export_pytest(plan, "p.json")


def test_names_are_identifiers() -> None:
    assert reproducer_name("x/falsifying-0.21.0.json") == "test_falsifying_0_21_0"
    assert reproducer_name("42043.json") == "test_plan_42043"


def test_the_plan_command_writes_the_file_and_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    plan, out = tmp_path / "falsifying-0.21.0.json", tmp_path / "out" / "test_42043.py"
    plan.write_text(json.dumps(STALL_PLAN))
    assert main(["plan", str(plan), "--export-pytest", str(out)]) == 0
    assert out.read_text() == export_pytest(STALL_PLAN, str(plan))
    assert f"wrote {out}" in capsys.readouterr().out
