"""The workaround verdict as text: the status of ``async_scheduling=False`` for vLLM #42043 on every version,
with the evidence (judged by ``harness.verdicts.workarounds``)."""

from __future__ import annotations

from harness.verdicts.report.cell_text import CellsLike, cells_of
from harness.verdicts.workarounds import STATUS_STYLES, workaround_verdicts

ISSUE = "vllm#42043"
WORKAROUND = "async_scheduling=False"


def paragraph_parts(cells: CellsLike) -> list[tuple[str, str | None]]:
    # The verdict paragraph as (text, rich style) segments.
    verdicts = workaround_verdicts(cells_of(cells))
    parts: list[tuple[str, str | None]] = [(f"{WORKAROUND} workaround for {ISSUE}: ", None)]
    if not verdicts:
        parts.append(("no cells to judge.", None))
        return parts
    for i, v in enumerate(verdicts):
        if i:
            parts.append((", ", None))
        parts.append((v.status.value, STATUS_STYLES[v.status]))
        parts.append((f" on {v.where} ({v.evidence})", None))
    parts.append((".", None))
    return parts


def verdict_paragraph(cells: CellsLike) -> str:
    """One paragraph: the workaround's status on every vLLM version, with the evidence."""
    return "".join(text for text, _ in paragraph_parts(cells))


