"""The timeline picture as PNG, where matplotlib is installed (``vllm-repro[plot]``); the SVG beside it
(harness.bench.svg) needs nothing: one row per engine on a time axis, coloured by phase."""

from __future__ import annotations

from pathlib import Path

from harness.bench.run import BenchRun
from harness.bench.svg import COLOURS, title_lines


def draw(run: BenchRun, out: Path) -> bool:
    """Write ``run``'s timeline to ``out`` (PNG); False (nothing written) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(run.engines) + 1.8))
    ax.broken_barh([(0, run.before_engines_s)], (len(run.engines) - 0.4, 0.8), color=COLOURS["environments"])
    for row, eng in enumerate(reversed(run.engines)):
        for span in eng.spans:
            ax.broken_barh([(span.start, span.seconds)], (row - 0.4, 0.8), color=COLOURS.get(span.phase, "k"))
    ax.set_yticks(range(len(run.engines) + 1), [e.engine for e in reversed(run.engines)] + ["environments"],
                  fontsize=7)
    ax.set_xlabel("seconds since the run began")
    ax.set_title("\n".join(title_lines(run)), fontsize=9)
    handles = [Patch(color=c, label=p) for p, c in COLOURS.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True
