"""Every results file committed under docs/results/ still loads and renders (slow: about 45 MB of JSON).

The unit set checks the same on small fixtures cut from these reports (test_records.py); this one keeps the
committed reports themselves readable by every change of the schema, the reader or the renderers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_records import check_round_trip

from harness.verdicts.compare.pairs import compare
from harness.verdicts.compare.render import markdown as compare_markdown
from harness.verdicts.history.store import run_id_of
from harness.verdicts.report.markdown import markdown
from harness.verdicts.results import read_bytes, read_results

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"
# Run ids ``history add`` gave these reports before the schema gained tier and label (a19fad5).
RUN_IDS = {"cpu-2026-11-30": "a58f86ccb6751397", "gpu-h200-2026-11-30": "ebea3e61362c982f"}


def _schema(path: Path) -> object:
    """The document's ``schema``; None for JSON that is no report (a probe's list of steps, a bench file)."""
    text = read_bytes(path).decode()
    doc = json.loads(text.splitlines()[0] if ".jsonl" in path.suffixes else text)
    return doc.get("schema") if isinstance(doc, dict) else None


def test_every_committed_report_loads_round_trips_and_renders() -> None:
    # Reports and their JSONL logs; not the bisect logs, history or wheelhouse manifests beside them.
    committed = sorted(p for p in DOCS.rglob("*.json*") if "history" not in p.parts
                       and _schema(p) in ("vllm-repro/results", "vllm-repro/cell"))
    assert len(committed) >= 50
    for path in committed:
        assert markdown(check_round_trip(path)), path
    # The first two reports re-render exactly as committed, their comparison too, and keep their run ids.
    first = {name: read_results(DOCS / name / "results.json.xz") for name in RUN_IDS}
    for name, results in first.items():
        assert results.meta["migrated_from"] == 1 and run_id_of(results) == RUN_IDS[name]
        assert markdown(results) == (DOCS / name / "results.md").read_text(encoding="utf-8")
    cmp = compare(*first.values(), *(f"{n}/results.json" for n in first))
    assert compare_markdown(cmp) == (DOCS / "cpu-vs-gpu.md").read_text(encoding="utf-8")
