"""A consumer KV connector whose synchronous loads fail, for the scheduler tier's ``kv_load_failure`` setup
(vllm#45138, vllm#49250 part 2).

Scheduler side: for a request whose id starts with ``f`` and that has no computed token yet, it promises every full
block of the prompt but the last token's as an external hit loaded synchronously (``get_num_new_matched_tokens``
returns ``(n, False)``, the report's "all blocks marked as hit"), once per request, and records the promise.  The
worker side is the harness's: the frame that schedules the request reports those blocks in
``KVConnectorOutput.invalid_block_ids`` (``repro.sched.kv_failure.fail_loads``), as a worker whose connector's
``get_block_ids_with_load_errors()`` returned them; with ``kv_load_failure_policy="recompute"`` vLLM's
``Scheduler._handle_invalid_blocks`` then rolls the request back to recompute them
(vllm/v1/core/sched/scheduler.py:3854-3920 at 0.34.0).

Imports vLLM: it is loaded inside the vLLM environment only (``repro`` staged there), by vLLM's
``KVConnectorFactory`` through ``kv_connector_module_path``.
"""

from __future__ import annotations

from typing import Any

from repro.sched.null_connector import ReproNullConsumerConnector

MODULE_PATH = "repro.sched.failing_connector"
CLASS_NAME = "ReproFailingLoadConnector"
PREFIX = "f"  # ids of the requests whose load is promised and fails


class ReproFailingLoadConnector(ReproNullConsumerConnector):
    """The null consumer connector that promises a synchronous load for ``f*`` requests (once each)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.promised: dict[str, int] = {}  # rid -> external tokens promised, until a frame reports the failure
        self.claimed: set[str] = set()
        self.failed: list[dict[str, Any]] = []  # what fail_loads reported: rid, frame, blocks

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        rid = str(request.request_id)
        if not rid.startswith(PREFIX) or rid in self.claimed or num_computed_tokens:
            return 0, False
        # Full blocks only, and never the last prompt token (vLLM recomputes it to sample).
        n = (int(request.num_prompt_tokens) - 1) // self.block_size * self.block_size
        return n, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            rid = str(request.request_id)
            self.claimed.add(rid)
            self.promised[rid] = int(num_external_tokens)
