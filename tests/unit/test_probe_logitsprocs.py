"""The vllm#52461 probe (repro.probes.logitsprocs), checked without vLLM: the processor follows vLLM's batch
updates (add, move, swap, remove) and keeps live references, the summary counts what it was shown against what
vLLM returned, and the plugin dist-info declares the processor where vLLM looks for it."""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from repro.probes import logitsprocs as lp

pytestmark = pytest.mark.unit


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


@dataclass
class Update:
    """vLLM's BatchUpdate shape: added (index, params, prompt_ids, output_ids), moved (a, b, direction), removed."""

    added: list[tuple[int, Any, list[int] | None, list[int]]] = field(default_factory=list)
    moved: list[tuple[int, int, str]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)


def proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> lp.RecordingProcessor:
    monkeypatch.setenv(lp.ENV_LOG, str(tmp_path / "steps.jsonl"))
    return lp.RecordingProcessor(None, None, False)


def steps(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]


def test_records_live_output_lists_per_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = proc(tmp_path, monkeypatch)
    out_a: list[int] = []
    p.update_state(Update(added=[(0, Params({"probe_key": "p0"}), [5, 6], out_a)]))
    p.apply("logits")
    out_a.append(-1)  # vLLM's async placeholder, appended to the very list the processor holds
    assert p.apply("logits") == "logits"  # never changes the logits
    assert [s["rows"] for s in steps(tmp_path)] == [{"p0": []}, {"p0": [-1]}]
    assert p.is_argmax_invariant() is False  # else vLLM skips it for greedy requests


def test_follows_moves_swaps_and_removals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = proc(tmp_path, monkeypatch)
    a, b = [1], [2]
    p.update_state(Update(added=[(0, Params({"probe_key": "a"}), None, a), (1, Params({"probe_key": "b"}), None, b)]))
    p.update_state(Update(moved=[(0, 1, "SWAP")]))
    assert p.rows == {1: ("a", a), 0: ("b", b)}
    p.update_state(Update(removed=[0], moved=[(1, 0, "UNIDIRECTIONAL")]))
    assert p.rows == {0: ("a", a)}
    p.update_state(None)  # vLLM passes None when nothing changed
    assert p.rows == {0: ("a", a)}


def test_summary_counts_placeholders_and_wrong_prefixes(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text("\n".join(json.dumps({"step": i, "rows": rows}) for i, rows in enumerate([
        {"p0": [], "p1": []}, {"p0": [7], "p1": [-1]}, {"p0": [7, 8], "p1": [-1, -1]}, {"other": [3]}])))
    s = lp.summarize(log, {"p0": [7, 8, 9], "p1": [4, 5, 6]})
    assert s["total"] == {"snapshots": 6, "with_minus_one": 2, "wrong_prefix": 2}
    assert s["per_request"]["p0"] == {"snapshots": 3, "with_minus_one": 0, "wrong_prefix": 0}
    assert s["first_wrong"] == {"p1": {"shown": [-1], "returned_prefix": [4]}}
    assert lp.summarize(tmp_path / "missing.jsonl", {"p0": [1]})["total"]["snapshots"] == 0


def test_plugin_dist_info_declares_the_entry_point(tmp_path: Path) -> None:
    lp.write_plugin_dist_info(tmp_path)
    eps = [ep for dist in importlib.metadata.distributions(path=[str(tmp_path)]) for ep in dist.entry_points
           if ep.group == "vllm.logits_processors"]
    assert [(ep.name, ep.value) for ep in eps] == [("repro_probe", lp.FQCN)]
