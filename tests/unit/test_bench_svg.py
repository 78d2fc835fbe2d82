"""vllm-repro bench's picture: an SVG from the standard library, written beside every bench.json (no matplotlib
needed), one row per engine, phases coloured, scenario spans, a legend, the machine and totals in the title."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path

import pytest

from harness.bench.cpu import CpuSample
from harness.bench.run import BenchRun, load_run
from harness.bench.svg import COLOURS, render, tick_step
from harness.frontends.cli import main

pytestmark = pytest.mark.unit

SVG = "{http://www.w3.org/2000/svg}"
LOG = ("INFO Model loading took 0.0 GiB memory and 0.5 seconds\n"
       "INFO init engine (profile, create kv cache, warmup model) took 1.5 s\n")
STAMP = "2027-01-15T08:00:00+00:00"


def _reports(root: Path) -> Path:
    """A small matrix run: a default engine with two scenarios, a prefix-cache engine with one."""
    root.mkdir(parents=True, exist_ok=True)
    base = datetime.fromisoformat(STAMP).timestamp()
    (root / "results.json").write_text(json.dumps({"created": STAMP, "finished": "2027-01-15T08:00:40+00:00",
                                                   "argv": ["matrix"], "host": {"node": "box"}}))
    engines = {"vllm0.21.0-mp-async_on": [("keep-clear", 12.0, 1.0), ("weight_sync-keep-clear", 14.0, 1.5)],
               "vllm0.21.0-mp-async_on-prefix_cache": [("stale_kv_keep-keep-noclear", 36.0, 3.0)]}
    for i, (engine, scenarios) in enumerate(engines.items()):
        folder = root / "engines" / engine
        folder.mkdir(parents=True)
        start = base + 2.0 + 20 * i
        events = [{"event": "start", "t": start}, {"event": "engine", "t": start + 8.0, "startup_s": 8.0}]
        events += [{"event": "scenario", "t": base + end, "id": sid, "duration_s": d} for sid, end, d in scenarios]
        (folder / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
        (folder / "engine.log").write_text(LOG)
    return root


def _svg(run: BenchRun) -> ET.Element:
    return ET.fromstring(render(run))  # well-formed XML, or this raises


def test_the_svg_has_a_row_per_engine_phases_coloured_and_scenario_spans(tmp_path: Path) -> None:
    run = load_run(_reports(tmp_path), "repro", wall_s=41.0)
    root = _svg(run)
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert texts[0] == "vllm-repro bench repro: 40 s run, 41 s wall, 2 engines, 26 engine-s"
    assert texts[1] == "machine: box"
    assert {"environments", "vllm0.21.0-mp-async_on", "vllm0.21.0-mp-async_on-prefix_cache"} <= set(texts)
    tips = [r.findtext(f"{SVG}title") or "" for r in root.iter(f"{SVG}rect")]
    scenario_tips = [t for t in tips if ": scenario " in t]
    assert [t.split(": scenario ")[1].split(",")[0] for t in scenario_tips] == [
        "keep-clear", "weight_sync-keep-clear", "stale_kv_keep-keep-noclear"]
    fills = {r.get("fill") for r in root.iter(f"{SVG}rect")}
    assert {COLOURS["scenario"], COLOURS["model load"], COLOURS["kv cache+warm-up"], COLOURS["environments"]} <= fills
    legend = [t for t in texts if t in COLOURS]
    assert legend[0] == "environments" and "scenario" in legend and "setups" not in legend  # phases present only
    assert any(t.startswith("profile prefix-cache: 1 engine(s)") and t.endswith("stale-kv-keep") for t in texts)


def test_the_title_states_the_machine_and_the_cpu_seconds(tmp_path: Path) -> None:
    run = load_run(_reports(tmp_path), "repro", wall_s=41.0)
    from dataclasses import replace

    run = replace(run, cpu=CpuSample(55.4, {"vllm0.21.0-mp-async_on-prefix_cache": 20.0}, 9),
                  machine={"host": "box", "cpus": 2, "load_start": [5.0, 6.25, 7.0], "load_end": [9.0, 8.0, 7.5]})
    texts = [t.text or "" for t in _svg(run).iter(f"{SVG}text")]
    assert "55 CPU s" in texts[0]
    assert texts[1] == "machine: box, 2 CPUs, load average 5.0/6.2/7.0 at the start, 9.0/8.0/7.5 at the end"
    assert any(t.startswith("profile prefix-cache: 1 engine(s)") and ", 20 CPU s: " in t for t in texts)
    assert run.to_json()["profiles"]["default"]["cpu_s"] == 0.0 and run.to_json()["cpu_s"] == 55.4


def test_ticks_are_round_and_few() -> None:
    assert [tick_step(s) for s in (5, 12, 40, 287, 1045)] == [1.0, 1.0, 5.0, 50.0, 100.0]


def test_bench_writes_the_svg_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for mod in ("matplotlib", "matplotlib.pyplot", "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, mod, None)  # as in the `repro` tox env: no matplotlib
    out = tmp_path / "b"
    assert main(["bench", "repro", "--from", str(_reports(tmp_path / "r")), "--out", str(out)]) == 0
    assert (out / "bench.json").is_file() and (out / "timeline.svg").is_file()
    assert not (out / "timeline.png").exists()
    ET.parse(out / "timeline.svg")
    assert f"bench: {out / 'bench.json'}, {out / 'timeline.svg'}" in capsys.readouterr().out


def test_a_bench_json_is_read_back_and_drawn_again(tmp_path: Path) -> None:
    """A small bench.json (as a run without matplotlib left it) gives the same picture as the run it came from."""
    from dataclasses import replace

    from harness.bench.run import load_bench_json

    run = replace(load_run(_reports(tmp_path / "r"), "repro", wall_s=41.0),
                  cpu=CpuSample(55.4, {"vllm0.21.0-mp-async_on": 30.0}, 7), machine={"host": "box", "cpus": 2})
    (tmp_path / "bench.json").write_text(json.dumps(run.to_json()))
    back = load_bench_json(tmp_path / "bench.json")
    assert back.to_json() == run.to_json() and render(back) == render(run)
    out = tmp_path / "again"
    assert main(["bench", "repro", "--from", str(tmp_path / "bench.json"), "--out", str(out)]) == 0
    assert ET.parse(out / "timeline.svg").getroot().tag == f"{SVG}svg"
    (tmp_path / "other.json").write_text('{"schema": "vllm-repro/results"}')
    assert main(["bench", "repro", "--from", str(tmp_path / "other.json"), "--out", str(out)]) == 2
