"""Reading the harness's TOML tables (shipped defaults or a user's file) with one kind of error."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from harness.core.errors import BadInput


def load_table(path: Path | None, shipped: str, what: str) -> tuple[dict[str, Any], str]:
    """Parse ``path`` (or the file ``shipped`` inside the harness package); return (data, where)."""
    if path is None:
        text = resources.files("harness.verdicts").joinpath(shipped).read_text("utf-8")
        where = f"harness/verdicts/{shipped}"
    else:
        try:
            text, where = path.read_text("utf-8"), str(path)
        except OSError as exc:
            raise BadInput(f"cannot read {what} {path}: {exc.strerror}") from exc
    try:
        return tomllib.loads(text), where
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{where}: invalid TOML ({exc})") from exc
