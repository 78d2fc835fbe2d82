"""CRASH on the engine tier: where vLLM raised (repro.core.crash), the engine core's crash report, the scenario
event it
becomes (repro.scenarios.cell_run.run_cell) and the cell result the harness makes of it; synthetic tracebacks, no
vLLM."""

from __future__ import annotations

import asyncio
import json
import linecache
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from harness.core.cell import Cell
from harness.core.events import as_scenario_event
from harness.core.oracle import Outcome
from harness.run.scenario_results import scenario_result
from repro.core import crash
from repro.core.wire import check_event
from repro.scenarios import cell_run as repro_cell

pytestmark = pytest.mark.unit

SITE = "/venv/lib/python3.11/site-packages/vllm/v1/core/sched/async_scheduler.py"
CORE = "/venv/lib/python3.11/site-packages/vllm/v1/engine/core.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/cuda/memory.py"


def _raise_through(frames: list[tuple[str, str]], exc: BaseException) -> BaseException:
    """``exc`` raised by the last of ``frames`` (file, source of its one line), called by the ones before."""
    ns: dict[str, Any] = {"exc": exc}
    for i, (path, _line) in enumerate(frames):
        nxt = f"f{i + 1}()" if i + 1 < len(frames) else "raise exc"
        exec(compile(f"def f{i}():\n    {nxt}\n", path, "exec"), ns)
    try:
        ns["f0"]()
    except BaseException as caught:
        return caught
    raise AssertionError("nothing raised")


def test_the_innermost_vllm_frame_is_the_crash_site() -> None:
    exc = _raise_through([(CORE, ""), (SITE, "")], AssertionError())
    assert crash.vllm_crash_site(exc) == ("vllm/v1/core/sched/async_scheduler.py:2:f1", "")
    assert crash.innermost_vllm_frame(exc) == "vllm/v1/core/sched/async_scheduler.py:2:f1"
    assert crash.raised_in_vllm(exc)


def test_our_own_frame_inside_vllm_is_not_vllm_raising(tmp_path: Path) -> None:
    ours = str(tmp_path / "repro" / "patches" / "shim.py")
    exc = _raise_through([(CORE, ""), (ours, "")], RuntimeError("a harness bug"))
    assert crash.vllm_crash_site(exc) is not None, "vLLM called us"
    assert not crash.raised_in_vllm(exc, ours=(str(tmp_path / "repro"),))
    # An injected wrapper of ours calling back into vLLM, which raises: vLLM's own code raised.
    wrapped = _raise_through([(CORE, ""), (ours, ""), (SITE, "")], AssertionError())
    assert crash.raised_in_vllm(wrapped, ours=(str(tmp_path / "repro"),))
    # Libraries vLLM calls are passed over.
    assert crash.raised_in_vllm(_raise_through([(CORE, ""), (TORCH, "")], RuntimeError("x")))
    assert not crash.raised_in_vllm(_raise_through([(str(tmp_path / "x.py"), "")], RuntimeError("x")))


@pytest.mark.parametrize(("kind", "message", "why"), [
    ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", "out of memory"),
    ("RuntimeError", "Executor failed.", "a vLLM worker process died"),
    ("RuntimeError", "Worker failed with error 'CUDA error: out of memory'", "out of memory"),
    ("RuntimeError", "uncorrectable ECC error encountered", "the machine failed"),
    ("AssertionError", "", None),
    ("KeyError", "'req-7'", None),
])
def test_infrastructure_failures_vllm_passes_on(kind: str, message: str, why: str | None) -> None:
    assert crash.infra_cause(kind, message) == why


def test_a_report_of_vllm_raising_is_a_crash_event() -> None:
    exc = _raise_through([(CORE, ""), (SITE, "")], AssertionError())
    report = crash.crash_report(exc)
    assert (report["exception_type"], report["in_vllm"], report["infra"]) == ("AssertionError", True, None)
    assert "AssertionError" in report["traceback"]
    fields = crash.scenario_fields({**report, "vllm_source": "assert request.num_output_placeholders >= 0"})
    assert fields["status"] == "crash"
    assert fields["reason"] == ("the engine core died: AssertionError: assert request.num_output_placeholders >= 0 "
                                "at vllm/v1/core/sched/async_scheduler.py:2:f1")
    check_event({"event": "scenario", "id": "s", **fields}, strict=True)


def test_a_report_of_a_dead_worker_or_of_our_code_is_an_error_event(tmp_path: Path) -> None:
    dead = crash.crash_report(_raise_through([(CORE, "")], RuntimeError("Executor failed.")))
    fields = crash.scenario_fields(dead)
    assert (fields["status"], fields["reason"]) == (
        "error", "the engine core died: RuntimeError: Executor failed. (a vLLM worker process died)")
    ours = crash.crash_report(_raise_through([(CORE, ""), (str(tmp_path / "repro" / "x.py"), "")],
                                             RuntimeError("bug")), ours=(str(tmp_path / "repro"),))
    assert crash.scenario_fields(ours)["status"] == "error"
    assert crash.scenario_fields(ours)["reason"].endswith("(raised outside vLLM's code)")
    check_event({"event": "scenario", "id": "s", **fields}, strict=True)


def test_the_first_report_wins_and_is_claimed_once(tmp_path: Path) -> None:
    path = tmp_path / "engine_core_crash.json"
    assert crash.claim_report(path) is None and crash.claim_report(None) is None
    crash.write_report(path, {"n": 1})
    crash.write_report(path, {"n": 2})  # a later death is a consequence of the first
    assert crash.claim_report(path) == {"n": 1}
    assert crash.claim_report(path) is None


def _fake_core_module() -> types.ModuleType:
    core = types.ModuleType(crash.CORE_MODULE)

    class EngineCoreProc:
        sent: ClassVar[list[str]] = []

        def _send_engine_dead(self) -> None:
            self.sent.append("dead")

        @staticmethod
        def run_engine_core(step: Any) -> None:
            # vLLM's shape (0.17-0.32): the fatal exception is logged, the client told, then re-raised.
            proc = EngineCoreProc()
            try:
                step()
            except Exception:
                proc._send_engine_dead()
                raise

    EngineCoreProc.__module__ = crash.CORE_MODULE
    core.EngineCoreProc = EngineCoreProc  # type: ignore[attr-defined]
    return core


def test_the_engine_core_hook_reports_the_fatal_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = _fake_core_module()
    assert crash.install_engine_core_hook(core) == [f"{crash.CORE_MODULE}:EngineCoreProc._send_engine_dead"]
    assert crash.install_engine_core_hook(core) == [], "installed once"
    path = tmp_path / "engine_core_crash.json"
    monkeypatch.setenv(crash.ENV_CRASH_FILE, str(path))
    exc = _raise_through([(SITE, "")], AssertionError())
    with pytest.raises(AssertionError):
        core.EngineCoreProc.run_engine_core(lambda: (_ for _ in ()).throw(exc))
    assert core.EngineCoreProc.sent == ["dead"], "vLLM still tells its client"
    report = json.loads(path.read_text())
    assert (report["exception_type"], report["vllm_frame"], report["in_vllm"]) == (
        "AssertionError", "vllm/v1/core/sched/async_scheduler.py:2:f0", True)


# --------------------------------------------------------------------------- repro.scenarios.cell_run.run_cell


class _DeadLLM:
    errored = True


def _run_cell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, scenario: Any, report: dict[str, Any] | None,
              llm: Any = None) -> tuple[list[dict[str, Any]], BaseException | None]:
    path = tmp_path / "engine_core_crash.json"
    monkeypatch.setenv(crash.ENV_CRASH_FILE, str(path))
    if report is not None:
        crash.write_report(path, report)
    monkeypatch.setattr(repro_cell, "run_scenario", scenario)

    async def probe(_llm: Any) -> dict[str, Any]:
        return {"core": {}}

    monkeypatch.setattr(repro_cell, "probe_engine", probe)
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append(check_event({"event": kind, **fields}, strict=True))  # type: ignore[arg-type]

    try:
        asyncio.run(repro_cell.run_cell(llm or _DeadLLM(), {"id": "keep-clear"}, None, 5.0, None, emit))  # type: ignore[arg-type]
    except RuntimeError as exc:
        return events, exc
    return events, None


VLLM_ASSERT = {**crash.crash_report(_raise_through([(CORE, ""), (SITE, "")], AssertionError())),
               "vllm_source": "assert request.num_output_placeholders >= 0"}


def test_a_scenario_the_engine_core_died_under_is_its_crash(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async def requests_failed(*_a: Any) -> dict[str, Any]:
        # What the driver records when the engine dies: every request ends with EngineDeadError.
        return {"records": [{"rid": "r0", "error": "EngineDeadError: EngineCore encountered an issue."}]}

    events, raised = _run_cell(monkeypatch, tmp_path, requests_failed, VLLM_ASSERT)
    (ev,) = events
    assert ev["status"] == "crash" and ev["vllm_frame"] == "vllm/v1/core/sched/async_scheduler.py:2:f1"
    assert isinstance(raised, RuntimeError) and "engine is dead" in str(raised)
    res = scenario_result(Cell("0.32.0", "mp", True, "keep", True), as_scenario_event(ev), None)
    assert res.outcome is Outcome.CRASH and res.label == "CRASH"
    assert res.reason == ("the engine core died: AssertionError: assert request.num_output_placeholders >= 0 at "
                          "vllm/v1/core/sched/async_scheduler.py:2:f1")


def test_an_exception_in_the_scenario_is_the_crash_when_the_engine_core_died(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    async def dead(*_a: Any) -> dict[str, Any]:
        raise RuntimeError("EngineDeadError: reference request failed")

    events, raised = _run_cell(monkeypatch, tmp_path, dead, VLLM_ASSERT)
    assert [e["status"] for e in events] == ["crash"] and raised is not None
    # Without a crash report (the engine core was killed, or nothing died): ERROR as before.
    events, raised = _run_cell(monkeypatch, tmp_path / "b", dead, None)
    assert [e["status"] for e in events] == ["error"] and raised is not None
    res = scenario_result(Cell("0.32.0", "mp", True, "keep", True), as_scenario_event(events[0]), None)
    assert res.outcome is Outcome.ERROR


def test_a_dead_worker_stays_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async def dead(*_a: Any) -> dict[str, Any]:
        raise RuntimeError("EngineDeadError")

    report = crash.crash_report(_raise_through([(CORE, "")], RuntimeError("Executor failed.")))
    events, _ = _run_cell(monkeypatch, tmp_path, dead, report)
    (ev,) = events
    assert ev["status"] == "error" and "a vLLM worker process died" in ev["reason"]
    cell = Cell("0.32.0", "mp", True, "keep", True)
    assert scenario_result(cell, as_scenario_event(ev), None).outcome is Outcome.ERROR


def test_a_scenario_that_ran_on_a_live_engine_is_judged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class Live:
        errored = False

    async def ran(*_a: Any) -> dict[str, Any]:
        return {"records": []}

    events, raised = _run_cell(monkeypatch, tmp_path, ran, None, Live())
    assert [e["status"] for e in events] == ["ran"] and events[0]["probe_after"] == {"core": {}} and raised is None


# --------------------------------------------------------------------------- crash#reset (repro/patches/inject.py)


def test_injected_crash_makes_vllms_own_assert_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.patches import inject

    for key, value in list(inject.STATE.items()):
        monkeypatch.setitem(inject.STATE, key, type(value)() if isinstance(value, (list, dict, int)) else value)
    src = ("class Scheduler:\n"
           "    def __init__(self, reqs):\n        self.running = list(reqs)\n"
           "    def reset_prefix_cache(self, reset_running_requests=False):\n"
           "        self.running.clear()\n        return True\n"
           "    def _update_request_with_output(self, request, new_token_ids):\n"
           "        return new_token_ids, False\n"
           "class AsyncScheduler(Scheduler):\n"
           "    def _update_request_with_output(self, request, new_token_ids):\n"
           "        new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)\n"
           "        request.num_output_placeholders -= len(new_token_ids)\n"
           "        assert request.num_output_placeholders >= 0\n"
           "        return new_token_ids, stopped\n")
    path = "/venv/lib/python3.11/site-packages/vllm/v1/core/sched/async_scheduler.py"
    mod = types.ModuleType(inject.ASYNC_SCHED_MODULE)
    exec(compile(src, path, "exec"), mod.__dict__)
    sched = types.ModuleType(inject.SCHED_MODULE)
    sched.Scheduler = mod.Scheduler  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, inject.SCHED_MODULE, sched)
    monkeypatch.setitem(sys.modules, inject.ASYNC_SCHED_MODULE, mod)
    monkeypatch.setitem(linecache.cache, path, (len(src), None, src.splitlines(True), path))  # its source lines
    monkeypatch.setattr(inject, "_own_source", lambda cls, name: src if cls is mod.AsyncScheduler else "")
    monkeypatch.setattr(mod.Scheduler, "reset_prefix_cache", mod.Scheduler.reset_prefix_cache)
    monkeypatch.setattr(mod.AsyncScheduler, "_update_request_with_output",
                        mod.AsyncScheduler._update_request_with_output)
    inject.activate(inject.FAULT_CRASH_RESET, lambda name, patch: patch(sys.modules[name]))
    assert inject.FAULT_CRASH_RESET in inject.STATE["applied"], inject.probe()

    req = types.SimpleNamespace(num_output_placeholders=1)
    s = mod.AsyncScheduler([req])
    assert s._update_request_with_output(req, [7]) == ([7], False), "untouched before a reset"
    req.num_output_placeholders = 1
    s.reset_prefix_cache(reset_running_requests=True)
    assert inject.STATE["crash_armed"] == 1
    with pytest.raises(AssertionError) as info:
        s._update_request_with_output(req, [8])
    report = crash.crash_report(info.value)
    assert report["vllm_frame"].startswith("vllm/v1/core/sched/async_scheduler.py:")
    assert report["vllm_source"] == "assert request.num_output_placeholders >= 0"
    assert report["in_vllm"] and crash.scenario_fields(report)["status"] == "crash"
