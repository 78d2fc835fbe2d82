"""The timeline picture as SVG, from the standard library alone: written beside every ``bench.json`` (a tox env
without matplotlib, such as ``repro``'s, made no picture before: issue 39's quiet 287 s run).

One row per engine on a time axis (the first row: the time before any engine, environments and planning), each
span coloured by its phase; an engine's scenario spans alternate two greens, one cell each, and each span says
what it is on hover (``<title>``).  The title holds the workload, the run's wall, CPU and engine totals and the
machine; under the axis, each engine profile's engines, engine-seconds and CPU seconds.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

from harness.bench.run import BenchRun

COLOURS = {"environments": "#fdd835", "spawn+import": "#616161", "import+construct": "#9e9e9e",
           "model load": "#8e24aa", "kv cache+warm-up": "#fb8c00", "start-up": "#bdbdbd", "turn wait": "#fff59d",
           "scenario": "#43a047", "harness": "#1e88e5", "setups": "#6d4c41", "examples": "#00897b",
           "reach report": "#c0ca33", "known minimise": "#f06292", "minimise+replay": "#e53935"}
SCENARIO_ALT = "#1b5e20"  # every other scenario span of an engine
LABEL_W, LEGEND_W, PLOT_W, ROW_H, TOP = 290, 170, 760, 16, 58


def tick_step(span_s: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving at most 12 ticks over ``span_s`` seconds."""
    step = 1.0
    while span_s / step > 12:
        for factor in (2.0, 2.5, 2.0):  # 1 -> 2 -> 5 -> 10
            step *= factor
            if span_s / step <= 12:
                break
    return step


def title_lines(run: BenchRun) -> list[str]:
    """The run's totals, then the machine it ran on."""
    totals = [f"{run.run_s:.0f} s run"]
    if run.wall_s is not None:
        totals.append(f"{run.wall_s:.0f} s wall")
    if run.cpu_s is not None:
        totals.append(f"{run.cpu_s:.0f} CPU s")
    engine_s = sum(e.end - e.start for e in run.engines if e.spans)
    totals.append(f"{len(run.engines)} engines, {engine_s:.0f} engine-s")
    m = run.machine
    host = m.get("host")
    where = [str(host.get("node", "")) if isinstance(host, dict) else str(host or "")]
    if m.get("cpus"):
        where.append(f"{m['cpus']} CPUs")
    if m.get("load_start") is not None:
        where.append(f"load average {_load(m['load_start'])} at the start, {_load(m.get('load_end'))} at the end")
    return [f"vllm-repro bench {run.workload}: {', '.join(totals)}", "machine: " + (", ".join(w for w in where if w)
                                                                                  or "not recorded")]


def _load(value: object) -> str:
    return "/".join(f"{v:.1f}" for v in value) if isinstance(value, list | tuple) else "?"


def _text(x: float, y: float, s: str, size: int = 11, anchor: str = "start", weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}">'
            f"{escape(s)}</text>")


def _rect(x: float, y: float, w: float, h: float, fill: str, tip: str) -> str:
    return (f'<rect x="{x:.2f}" y="{y:.1f}" width="{max(w, 0.4):.2f}" height="{h:.1f}" fill="{fill}">'
            f"<title>{escape(tip)}</title></rect>")


def _rows(run: BenchRun, scale: float) -> list[str]:
    out = []
    rows = [("environments", [("environments", "", 0.0, run.before_engines_s)])]
    rows += [(e.engine, [(s.phase, s.label, s.start, s.end) for s in e.spans]) for e in run.engines]
    for i, (name, spans) in enumerate(rows):
        y = TOP + i * ROW_H
        out.append(_text(LABEL_W - 6, y + ROW_H - 4, name, 10, "end"))
        cells = 0
        for phase, label, start, end in spans:
            tip = f"{name}: {phase}{' ' + label if label else ''}, {start:.1f}-{end:.1f} s ({end - start:.1f} s)"
            fill = COLOURS.get(phase, "#000000")
            if phase == "scenario":  # one cell after another in alternate shades, so each shows
                fill, cells = (SCENARIO_ALT if cells % 2 else fill), cells + 1
            out.append(_rect(LABEL_W + start * scale, y + 1, (end - start) * scale, ROW_H - 2, fill, tip))
    return out


def _axis(length_s: float, scale: float, y: float) -> list[str]:
    out = [f'<line x1="{LABEL_W}" y1="{y:.1f}" x2="{LABEL_W + PLOT_W}" y2="{y:.1f}" stroke="#000000"/>']
    step, t = tick_step(length_s), 0.0
    while t <= length_s + 1e-9:
        x = LABEL_W + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{TOP:.1f}" x2="{x:.1f}" y2="{y + 4:.1f}" stroke="#dddddd"/>')
        out.append(_text(x, y + 16, f"{t:g}", 10, "middle"))
        t += step
    out.append(_text(LABEL_W + PLOT_W / 2, y + 32, "seconds since the run began", 11, "middle"))
    return out


def _legend(run: BenchRun) -> list[str]:
    present = {"environments"} | {s.phase for e in run.engines for s in e.spans}
    out, x = [], LABEL_W + PLOT_W + 16
    for i, phase in enumerate(p for p in COLOURS if p in present):
        y = TOP + i * 16
        out.append(_rect(x, y, 12, 12, COLOURS[phase], phase))
        out.append(_text(x + 18, y + 10, phase, 10))
    return out


def render(run: BenchRun) -> str:
    """``run``'s timeline as an SVG document."""
    length = max([run.run_s, run.before_engines_s, *(e.end for e in run.engines if e.spans)]) or 1.0
    scale = PLOT_W / length
    axis_y = TOP + (len(run.engines) + 1) * ROW_H + 4
    profiles = [f"profile {name}: {p['engines']} engine(s), {p['engine_s']:.0f} engine-s (start-up "
                f"{p['startup_s']:.0f}, scenarios {p['scenario_s']:.0f})"
                + (f", {p['cpu_s']:.0f} CPU s" if "cpu_s" in p else "") + f": {', '.join(p['scenarios']) or '-'}"
                for name, p in run.profiles().items()]
    height = max(axis_y + 46 + 15 * len(profiles), TOP + 16 * len(COLOURS) + 10)
    width = LABEL_W + PLOT_W + LEGEND_W
    body = [_text(8, 18 + 17 * i, line, 13 if i == 0 else 11, weight="bold" if i == 0 else "normal")
            for i, line in enumerate(title_lines(run))]
    body += _rows(run, scale) + _axis(length, scale, axis_y) + _legend(run)
    body += [_text(8, axis_y + 52 + 15 * i, line, 10) for i, line in enumerate(profiles)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif">\n'
            f'<rect width="100%" height="100%" fill="#ffffff"/>\n' + "\n".join(body) + "\n</svg>\n")


def write_svg(run: BenchRun, out: Path) -> None:
    """Write ``run``'s timeline to ``out`` (SVG)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(run))

