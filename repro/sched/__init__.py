"""The scheduler tier, engine side: drive vLLM's real Scheduler / AsyncScheduler in-process.

No engine process and no model forward: ``adapter.py`` builds a real
``VllmConfig`` (from the local bigram checkpoint), ``KVCacheConfig``,
``Scheduler`` or ``AsyncScheduler`` and ``Request`` objects from vLLM's public
classes (forcing the CPU platform, so a CUDA wheel runs on a CPU-only
machine); ``executor.py`` keeps D = 1..3 output frames in flight and answers
every frame with tokens fixed when it was scheduled (output position ``p`` of
a request gets the ``p``-th step of the bigram cycle from its prompt's last
token, ``script.token_at``); ``script.py`` holds the operations and named
scenarios (pure Python: the harness may import it).

Entry point::

    python -m repro.sched SPEC.json OUT.jsonl

SPEC (JSON)::

    {"schema_version": 2,                         # 2 since a spec may carry "fuzz"
     "version_label": "0.21.0",                  # echoed in the sched event
     "model_dir": "/path/ckpt"                    # a checkpoint built by
     repro.models.deterministic.build_checkpoint, or
     "model_cache": "/path/cache",                # where to build the bigram checkpoint
     "model": {"kind": "bigram-cycle", "params": {...}},   # optional, with model_cache
     "scenarios": [{"id": "s1", "scenario": "drained_reset", "params": {...}, "seed": 0}, ...],
     "interactive": false,                        # true: then one scenario per stdin line, until EOF
                                                  # or {"op": "stop"}, one scenario event each
     "fsync": true,                               # false: flush only (a fuzzer's many small events)
     "fuzz": {"examples": 200, "steps": 25, "seed": 1,   # optional (repro.core.wire.FuzzSpec): after the scenarios,
              "depths": [1, 2, 3], "spec_tokens": [0], "max_requests": 8,    # a Hypothesis run (fuzz.py);
              "reach": true}}                        # reach: coverage.py over vLLM's scheduler files (reach.py)

Scenarios (``script.SCENARIOS``): ``drained_reset`` (vllm#42043), ``inflight_reset`` (the other half
of PR #42117), ``preempt_pressure`` (negative control), ``abort_inflight``, ``spec_decode`` (control
for scripted speculative decoding), ``spec_reset`` (PRs #42117, #46066, #48245), ``inflight_add_abort``
(``inflight.py``: adds and aborts between ``schedule(N+1)`` and ``update_from_output(N)``, as vLLM 0.34.0's
``EngineCoreProc._wait_for_output`` handles them; its event adds ``precondition`` and ``end_state``),
``reset_connector`` (``reset_connector.py``: a drained reset with ``reset_connector`` true or false and the null
connector recording ``reset_cache()``; its event adds ``precondition`` and ``connector``) and
``ops`` (an explicit script: setup fields, ``requests`` [{rid, prompt, max_tokens}] and ``ops`` [{op, rid, n,
tokens, in_flight, optional}] — ``Script.to_dict()`` gives it, so a fuzzer replays what it drew).  Every
scenario takes the setup fields of ``script.Setup``: ``scheduler`` ("async" | "sync"), ``depth`` (D),
``num_blocks``, ``block_size``, ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
``enable_prefix_caching``, ``spec_tokens``, ``spec_accepted``, ``max_steps``; the named ones also
``n_requests``, ``prompt_len``, ``max_tokens`` and their own (``reset_after``, ``in_flight``,
``resets``, ``abort_after``).  Operations: ``script.OP_KINDS``.  The sync Scheduler runs with D=1; the
AsyncScheduler with D=2 or 3 (EngineCore's batch queue holds 2 frames whenever async scheduling is on,
more with pipeline parallelism).  Frames never finish early: the oldest is processed only when D are
in flight or nothing more can be scheduled (the most pipelined an engine gets).

OUT (JSON lines, appended and flushed (fsynced unless ``fsync`` is false) as they happen; every line
has ``event`` and ``t``):

* ``start``: pid, python.
* ``sched``: facts detected in this environment — ``vllm_version``, ``torch_version``, ``python``,
  ``platform`` {forced, previously_resolved}, ``scheduler_classes``, the API shape
  (``scheduler_init_params``, ``reset_prefix_cache_params``, ``pause_state``, ``discard_mechanism``:
  the Request field that drops stale output after a forced preemption, ``model_runner_output_fields``,
  ``request_init_params``), ``import_s``, ``load_s``, ``version_label``, ``model_dir``.  When vLLM's
  scheduler cannot even be imported: ``unsupported_reason`` instead, and every scenario is unsupported.
* ``scenario`` (one per spec scenario): ``id``, ``status`` and

  - ``ran``: ``records`` (one per submitted request, the fields ``harness/core/oracle.py``'s
    ``cell_verdict`` reads: ``rid``, ``submit`` ("start"), ``prompt``, ``max_tokens``, ``reference``
    (positions 0..max_tokens+15 of the scripted stream), ``observed`` (the token ids
    ``update_from_output`` delivered, in order), ``finish_reason`` ("length", "abort", ... or None when
    it never finished), ``error`` (None), ``pauses`` (one per reset — mode "keep", clear_cache true,
    ``client_tokens`` delivered before it, ``frozen`` = running at the reset, ``in_flight_frames`` — and
    one per abort, mode "abort"), ``reference_matches_model`` (true: the reference *is* the model) and
    ``frames`` (per frame that scheduled it: the scripted ``positions`` and the ``delivered`` ids),
    ``num_preemptions`` (vLLM's count: resets and memory pressure)),
    ``ops_log`` (per op: the op, frames in flight before/after, what it returned or why skipped),
    ``stalled`` (None, or why a step_until/run hit ``max_steps``, or scheduled and delivered nothing for 64
    iterations (``executor.IDLE_LIMIT``): vLLM never finished a request — STALL, a finding (the engine
    tier would see the same hang as TIMEOUT); the reason ends with the step and the scheduler's state
    (``repro.sched.stall``), also given as ``stall_state``; its requests then look TRUNCATED to the oracle),
    ``scheduler``, ``scheduler_class``, ``depth``, ``setup`` (the ``ops``-scenario params that replay
    it), ``iterations``, ``frames``, ``setup_s``, ``duration_s``, and with scripted speculative decoding
    ``spec_method`` (the drafter config vLLM accepted with async scheduling: EAGLE on every release 0.12-0.32);
  - ``unsupported``: ``reason`` — this release cannot be driven as asked (a constructor needs what
    the adapter cannot supply, a non-optional pause on a scheduler without pause state, a speculative
    config vLLM refuses); never counted as OK;
  - ``crash``: vLLM's own scheduler code raised while driven (e.g. ``assert
    request.num_output_placeholders >= 0``) — a finding about vLLM: ``reason``, ``exception_type``,
    ``message``, ``vllm_frame`` (``vllm/...py:LINE:function`` of the innermost frame inside the vllm
    package), ``vllm_source`` (that line's source, e.g. the assert), ``traceback``, and the ``records`` /
    ``ops_log`` up to the crash;
  - ``error``: the harness side failed (bad scenario, our own exception): ``reason``, ``traceback``.
* ``fuzz`` (with ``fuzz`` in the spec): the state machine of ``fuzz.py`` over this release's scheduler —
  ``status`` ran / unsupported (no setup of ``depths`` x ``spec_tokens`` builds here) / error (our side, or
  Hypothesis refusing), ``examples`` (every example run, shrinking included), ``examples_to_failure``,
  ``wall_s``, ``examples_per_s``, ``cpu_s``, ``seed``, ``settings``, ``hypothesis_version``, ``coverage``
  (ops applied, setups drawn, resets with frames in flight, examples with KV-cache preemptions), ``reach``
  (with ``"reach": true``; ``reach.py``: per file of vLLM's ``v1/core/sched/``, ``kv_cache_manager.py`` and
  ``block_pool.py`` statements, branches and how many ran, the lines and branches never run, ``growth`` after
  32, 64, 128, ... examples, and ``reachable``: scheduler.py without the functions no CPU run enters; or
  ``{"error": ...}`` when coverage.py is not there),
  ``dropped`` (setups this release cannot build, and why), and ``falsifying``: None, or the shrunk example's
  ``script`` (the ``ops`` scenario's params), ``failure`` (what the machine saw), ``ops``, ``shrunk`` and
  ``replay`` (the fields of a ``scenario`` event: that script run once more as an ``ops`` scenario).
* ``done``: ``wall_s`` (including the vLLM import); or ``fatal`` with ``reason`` and ``traceback``.

Runs inside a vLLM environment with only ``repro`` staged; never imports ``harness``.
"""
