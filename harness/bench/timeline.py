"""The timeline picture: one row per engine on a time axis, coloured by phase, so overlap and idle cores show."""

from __future__ import annotations

from pathlib import Path

from harness.bench.run import BenchRun
from harness.core.errors import BadInput

COLOURS = {"spawn+import": "#616161", "import+construct": "#9e9e9e", "model load": "#8e24aa",
           "kv cache+warm-up": "#fb8c00", "start-up": "#bdbdbd", "turn wait": "#fff59d",
           "scenario": "#43a047", "harness": "#1e88e5", "setups": "#6d4c41",
           "examples": "#00897b", "reach report": "#c0ca33", "known minimise": "#f06292",
           "minimise+replay": "#e53935"}


def draw(run: BenchRun, out: Path) -> None:
    """Write ``run``'s timeline to ``out`` (PNG); BadInput when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise BadInput("the timeline picture needs matplotlib: pip install 'vllm-repro[plot]'") from exc
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(run.engines) + 1.8))
    ax.broken_barh([(0, run.before_engines_s)], (len(run.engines) - 0.4, 0.8), color="#fdd835")
    for row, eng in enumerate(reversed(run.engines)):
        for span in eng.spans:
            ax.broken_barh([(span.start, span.seconds)], (row - 0.4, 0.8), color=COLOURS.get(span.phase, "k"))
    ax.set_yticks(range(len(run.engines) + 1), [e.engine for e in reversed(run.engines)] + ["environments"],
                  fontsize=7)
    ax.set_xlabel("seconds since the run began")
    wall = f", {run.wall_s:.0f} s wall" if run.wall_s is not None else ""
    ax.set_title(f"vllm-repro bench {run.workload}: {run.run_s:.0f} s run{wall}, {len(run.engines)} engines",
                 fontsize=9)
    handles = [Patch(color="#fdd835", label="environments")] + [Patch(color=c, label=p) for p, c in COLOURS.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
