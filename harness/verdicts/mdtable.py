"""Markdown tables, as the reports and comparisons write them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def md_cell(value: Any) -> str:
    # A Markdown table cell: pipes escaped, newlines flattened.
    return " ".join(str(value).split("\n")).replace("|", "\\|")


def md_row(values: Iterable[Any]) -> str:
    return "| " + " | ".join(md_cell(v) for v in values) + " |"


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    return [md_row(header), "|" + "|".join("---" for _ in header) + "|", *(md_row(r) for r in rows)]


