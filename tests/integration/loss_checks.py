"""The shape of vLLM #42043 in a cell result, shared by the integration tests that expect it."""

from __future__ import annotations

from typing import Any

from harness.verdicts.results import CellResult


def assert_first_post_resume_token_lost(cell: CellResult, running_at_pause: int | None = None) -> list[dict[str, Any]]:
    """Every request running at the pause lost exactly its first post-resume token; the others are OK.

    Returns the requests that were running at the pause.
    """
    running = [r for r in cell.requests if r["verdict"]["running_at_pause"]]
    late = [r for r in cell.requests if not r["verdict"]["running_at_pause"]]
    assert running and late, "the scenario must have requests running at the pause and requests submitted during it"
    if running_at_pause is not None:
        assert len(running) == running_at_pause
    for r in running:
        i = r["verdict"]["pause_index"]
        assert r["verdict"]["label"] == f"LOSS(1 at {i})", r["verdict"]
        # Exactly the first post-resume token is missing; the rest is shifted by one.
        assert r["verdict"]["first_post_resume"] == {
            "index": i, "expected": r["reference"][i], "observed": r["reference"][i + 1]}
        assert r["observed"] == (r["reference"][:i] + r["reference"][i + 1:])[: r["max_tokens"]]
    assert all(r["verdict"]["outcome"] == "OK" for r in late), "requests not running at pause must be unaffected"
    return running
