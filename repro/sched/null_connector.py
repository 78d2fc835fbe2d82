"""A KV connector that transfers nothing, for the scheduler tier's ``kv_consumer`` setup (vllm#49674).

vLLM's scheduler changes how it frees KV blocks as soon as a *consumer* KV connector is configured with
more than one batch in flight (PR #45357: ``Scheduler.defer_block_free``, the freed blocks of a request
stay fenced until its last in-flight step has been processed).  That fence, and the preemption retry
that vllm#49674 says cascades on it, depend only on ``kv_transfer_config.is_kv_consumer`` and
``max_concurrent_batches``, not on what the connector moves.  This connector says "no external hit"
for every request and keeps no state beyond a record of its ``reset_cache()`` calls, so every scheduling
decision is vLLM's own; it is loaded by vLLM's
``KVConnectorFactory`` through ``kv_connector_module_path`` (the documented way to plug in an
out-of-tree connector), and only its scheduler-side role is ever built here (no worker exists).

Imports vLLM: it is loaded inside the vLLM environment only (``repro`` staged there).
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

MODULE_PATH = "repro.sched.null_connector"
CLASS_NAME = "ReproNullConsumerConnector"


class ReproNullConsumerConnector(KVConnectorBase_V1):
    """Scheduler side: no external tokens, no metadata, ``reset_cache()`` recorded; worker side: never built here
    (no-ops)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        # External connectors must take kv_cache_config (0.32's factory refuses a 2-argument constructor);
        # older bases take two arguments.
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:
            super().__init__(vllm_config, role)
        # What each reset_cache() call returned, in order (repro.sched.reset_connector reads it).
        self.reset_calls: list[bool | None] = []

    # ---- scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def reset_cache(self) -> bool | None:
        """``Scheduler.reset_connector_cache`` calls it (``reset_prefix_cache(reset_connector=True)``): nothing is
        cached here, so the reset succeeds (True; False would make vLLM's reset fail, None is the base's
        "not implemented", also success)."""
        self.reset_calls.append(True)
        return True

    # ---- worker side (abstract in the base; unused: this tier has no worker)
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None
