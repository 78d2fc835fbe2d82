"""``python -m repro.sched SPEC.json OUT.jsonl``: run scheduler-tier scenarios and append events to OUT.

See the package docstring (``repro/sched/__init__.py``) for the SPEC and event formats.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from repro.core.wire import FuzzSpec, check_event
from repro.models.deterministic import BigramCycleSpec, build_checkpoint, load_perm
from repro.sched.scenario import run_scenario
from repro.sched.script import SCHEMA_VERSION, ScriptError

Emit = Callable[..., None]


class Emitter:
    """Appends one JSON line per event, flushed and fsynced (a crash loses nothing already measured)."""

    def __init__(self, path: Path, fsync: bool = True) -> None:
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives for the run
        self.fsync = fsync

    def __call__(self, event: str, **data: Any) -> None:
        # The one wire format (repro.core.wire), checked strictly as the engine's events are.
        ev = check_event(json.loads(json.dumps({"event": event, "t": time.time(), **data}, default=str)), strict=True)
        self.f.write(json.dumps(ev) + "\n")
        self.f.flush()
        if self.fsync:
            os.fsync(self.f.fileno())


def model_dir_of(spec: dict[str, Any]) -> Path:
    """The checkpoint folder: ``model_dir`` as given, or the bigram-cycle checkpoint built under ``model_cache``."""
    if spec.get("model_dir"):
        return Path(spec["model_dir"])
    if not spec.get("model_cache"):
        raise ScriptError("spec needs model_dir or model_cache")
    model = spec.get("model") or {}
    if model.get("kind", "bigram-cycle") != "bigram-cycle":
        raise ScriptError(f"unknown model kind {model.get('kind')!r}; valid: ['bigram-cycle']")
    return build_checkpoint(BigramCycleSpec.from_dict(model.get("params", {})), Path(spec["model_cache"]))


def scenario_stream(spec: dict[str, Any], stdin: TextIO) -> Iterator[dict[str, Any]]:
    """The spec's scenarios, then — with ``"interactive": true`` — one JSON scenario per stdin line until
    EOF or ``{"op": "stop"}`` (session mode: a fuzzer pays vLLM's import once, not per example)."""
    yield from spec["scenarios"]
    if not spec.get("interactive"):
        return
    for line in stdin:
        if not line.strip():
            continue
        sc = json.loads(line)
        if sc.get("op") == "stop":
            return
        yield sc


def run(spec: dict[str, Any], emit: Emit, stdin: TextIO | None = None,
        make_adapter: Callable[[], Any] | None = None) -> None:
    """Load vLLM (forcing the CPU platform), emit the ``sched`` facts, then one event per scenario."""
    from repro.sched.adapter import Adapter, Unsupported
    from repro.sched.reach import start as start_reach

    # Before vLLM is imported, so its module-level lines count as under ``coverage run``.
    reach = start_reach(spec.get("fuzz"))
    t0 = time.monotonic()
    model_dir = model_dir_of(spec)
    perm = load_perm(model_dir)
    scenarios = scenario_stream(spec, stdin or sys.stdin)
    try:
        adapter = (make_adapter or Adapter)()
    except (ImportError, Unsupported) as exc:
        reason = f"cannot load vLLM's scheduler: {type(exc).__name__}: {exc}"
        emit("sched", python=platform.python_version(), unsupported_reason=reason, version_label=spec.get(
            "version_label"))
        for sc in scenarios:
            emit("scenario", id=sc["id"], status="unsupported", reason=reason)
        if spec.get("fuzz") is not None:
            emit("fuzz", status="unsupported", reason=reason)
        return
    facts = adapter.facts() if hasattr(adapter, "facts") else {}
    emit("sched", **facts, python=platform.python_version(), version_label=spec.get("version_label"),
         model_dir=str(model_dir), load_s=round(time.monotonic() - t0, 3))
    for sc in scenarios:
        try:
            result = run_scenario(adapter, sc, model_dir, perm)
        except Exception as exc:  # our own failure outside the scenario's ops
            result = {"status": "error", "reason": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()}
        emit("scenario", id=sc.get("id"), **result)
    if spec.get("fuzz") is not None:
        emit("fuzz", **fuzz_result(adapter, model_dir, perm, spec["fuzz"], reach))


def fuzz_result(adapter: Any, model_dir: Path, perm: list[int], doc: dict[str, Any],
                reach: Any = None) -> dict[str, Any]:
    """The ``fuzz`` event's fields for the spec's ``fuzz`` (a repro.core.wire.FuzzSpec); our own failure is
    ``error``."""
    try:
        from repro.sched.fuzz import run_fuzz
    except ImportError as exc:  # the harness stages Hypothesis beside repro (harness.run.runner.stage_distribution)
        return {"status": "error", "reason": f"the fuzzer cannot be imported here: {type(exc).__name__}: {exc}"}
    try:
        return run_fuzz(adapter, model_dir, perm, FuzzSpec.from_json(doc), reach)
    except Exception as exc:
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m repro.sched SPEC.json OUT.jsonl", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    if spec.get("schema_version") != SCHEMA_VERSION:
        print(f"spec schema_version {spec.get('schema_version')!r}; this runner reads {SCHEMA_VERSION}",
              file=sys.stderr)
        return 2
    emit = Emitter(Path(argv[1]), fsync=bool(spec.get("fsync", True)))
    t0 = time.monotonic()
    emit("start", pid=os.getpid(), pgid=os.getpgid(0), python=sys.executable)
    try:
        run(spec, emit)
    except BaseException as exc:
        emit("fatal", reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return 1
    emit("done", wall_s=round(time.monotonic() - t0, 3))
    return 0
