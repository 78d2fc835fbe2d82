"""Synthetic request records, shaped like the ones ``repro.scenarios.cell_run`` writes, for unit tests."""

from __future__ import annotations

from typing import Any


def request_record(
    rid: str,
    observed: list[int],
    reference: list[int],
    *,
    running: bool,
    mode: str = "keep",
    clear_cache: bool = True,
    pause_at: int = 6,
    max_tokens: int = 24,
    prompt: list[int] | None = None,
    error: str | None = None,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One request: running at the pause (frozen there in keep mode) or submitted during it."""
    return {
        "rid": rid,
        "submit": "start" if running else ["during", 0],
        "prompt": prompt if prompt is not None else [1],
        "max_tokens": max_tokens,
        "observed": observed,
        "reference": reference,
        "reference_matches_model": True,
        "finish_reason": "length",
        "error": error,
        "pauses": [{"k": 0, "mode": mode, "clear_cache": clear_cache, "client_tokens": pause_at,
                    "engine_tokens": pause_at, "frozen": mode == "keep"}] if running else [],
        "timings": timings if timings is not None else {},
    }
