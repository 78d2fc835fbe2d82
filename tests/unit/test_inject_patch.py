"""repro.patches.inject without vLLM: fault-id parsing, code-shape recognition, and the patches on fake schedulers.

The fake schedulers below copy, line for line where it matters, the code of vLLM 0.21.0 (native bug),
0.22.0 (PR #42117's async_tokens_to_discard counter) and 0.32.0 (PR #48245's stale-output
accounting), reduced to what reset_prefix_cache / _update_request_with_output do to one request.
They are installed as fake ``vllm.v1.core.sched.*`` modules, so the injector inspects and patches
them exactly as it does the real ones.  When the harness's cached vLLM environments exist, the
shape recognition is also checked against the real source files (read, never imported).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from repro.patches import inject, shim
from repro.patches.inject import (
    ASYNC_SCHED_MODULE,
    FAULT_42043,
    SCHED_MODULE,
    SHAPE_COUNTER,
    SHAPE_NATIVE,
    SHAPE_STALE,
    SHAPE_UNKNOWN,
    InjectError,
    SchedulerSources,
    classify_shape,
    parse_faults,
)

pytestmark = pytest.mark.unit


# --------------------------------------------------------------------------- parsing


def test_parse_faults_unset_or_empty_means_no_injection() -> None:
    assert parse_faults(None) == ()
    assert parse_faults("") == ()
    assert parse_faults(" , ") == ()


def test_parse_faults_keeps_order_and_drops_duplicates() -> None:
    assert parse_faults(" vllm#42043 ,vllm#42043") == (FAULT_42043,)


@pytest.mark.parametrize("value", ["vllm#4204", "VLLM#42043", "vllm#42043,bogus"])
def test_parse_faults_refuses_unknown_ids(value: str) -> None:
    with pytest.raises(InjectError, match=r"unknown fault .*valid: crash#reset, hang#pause, vllm#42043"):
        parse_faults(value)


# --------------------------------------------------------------------------- fake vLLM schedulers


class Req:
    """The fields of vllm.v1.request.Request the schedulers below touch."""

    def __init__(self, rid: str, in_flight: int = 0) -> None:
        self.request_id = rid
        self.status = "RUNNING"
        self.output: list[int] = []
        self.num_output_placeholders = in_flight
        self.num_in_flight_tokens = in_flight
        self.async_tokens_to_discard = 0
        self.discard_latest_async_tokens = False
        self.num_stale_output_tokens = 0
        self.drop_stale_output = False


def make_native() -> tuple[type, type]:
    class Scheduler:  # vLLM 0.21.0
        def __init__(self, reqs: list[Req]) -> None:
            self.running = list(reqs)

        def _preempt_request(self, request: Req, timestamp: float) -> None:
            request.status = "PREEMPTED"

        def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
            if reset_running_requests:
                timestamp = 0.0
                while self.running:
                    request = self.running.pop()
                    self._preempt_request(request, timestamp)
                    request.num_output_placeholders = 0
                    request.discard_latest_async_tokens = True
            return True

        def _update_request_with_output(self, request: Req, new_token_ids: list[int]) -> tuple[list[int], bool]:
            request.output += new_token_ids
            return new_token_ids, False

    class AsyncScheduler(Scheduler):
        def _update_request_with_output(self, request: Req, new_token_ids: list[int]) -> tuple[list[int], bool]:
            if request.discard_latest_async_tokens:
                request.discard_latest_async_tokens = False
                return [], False
            new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)
            request.num_output_placeholders -= len(new_token_ids)
            return new_token_ids, stopped

    return Scheduler, AsyncScheduler


def make_counter() -> tuple[type, type]:
    class Scheduler:  # vLLM 0.22.0-0.26.0 (PR #42117)
        def __init__(self, reqs: list[Req]) -> None:
            self.running = list(reqs)

        def _preempt_request(self, request: Req, timestamp: float) -> None:
            request.status = "PREEMPTED"

        def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
            if reset_running_requests:
                timestamp = 0.0
                while self.running:
                    request = self.running.pop()
                    self._preempt_request(request, timestamp)
                    request.async_tokens_to_discard = request.num_output_placeholders
                    request.num_output_placeholders = 0
            return True

        def _update_request_with_output(self, request: Req, new_token_ids: list[int]) -> tuple[list[int], bool]:
            request.output += new_token_ids
            return new_token_ids, False

    class AsyncScheduler(Scheduler):
        def _update_request_with_output(self, request: Req, new_token_ids: list[int]) -> tuple[list[int], bool]:
            if request.async_tokens_to_discard > 0:
                request.async_tokens_to_discard -= 1
                return [], False
            new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)
            request.num_output_placeholders -= len(new_token_ids)
            return new_token_ids, stopped

    return Scheduler, AsyncScheduler


def make_stale() -> tuple[type, type]:
    class Scheduler:  # vLLM 0.32.0 (PR #48245)
        def __init__(self, reqs: list[Req]) -> None:
            self.running = list(reqs)

        def _preempt_request(self, request: Req, timestamp: float, drop_stale_output: bool = False) -> None:
            request.status = "PREEMPTED"
            request.drop_stale_output = drop_stale_output
            request.num_stale_output_tokens = request.num_in_flight_tokens
            request.num_output_placeholders = 0

        def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
            if reset_running_requests:
                timestamp = 0.0
                while self.running:
                    request = self.running.pop()
                    self._preempt_request(request, timestamp, drop_stale_output=True)
            return True

        def update_from_output(self, request: Req, new_token_ids: list[int]) -> list[int]:
            output_is_stale = request.num_stale_output_tokens > 0
            if output_is_stale:
                request.num_stale_output_tokens -= 1
                request.num_in_flight_tokens -= 1
            if output_is_stale and request.drop_stale_output:
                return []
            return self._update_request_with_output(request, new_token_ids, is_stale=output_is_stale)[0]

        def _update_request_with_output(self, request: Req, new_token_ids: list[int]) -> tuple[list[int], bool]:
            request.output += new_token_ids
            return new_token_ids, False

    class AsyncScheduler(Scheduler):
        def _update_request_with_output(self, request: Req, new_token_ids: list[int],
                                        is_stale: bool = False) -> tuple[list[int], bool]:
            new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)
            if not is_stale:
                request.num_output_placeholders -= len(new_token_ids)
            return new_token_ids, stopped

    return Scheduler, AsyncScheduler


def make_unknown() -> tuple[type, type]:
    sched, async_sched = make_counter()

    def reset_prefix_cache(self: Any, reset_running_requests: bool = False) -> bool:
        self.running.clear()  # some future shape: no per-request preemption loop
        return True

    sched.reset_prefix_cache = reset_prefix_cache  # type: ignore[attr-defined]
    return sched, async_sched


Hooks = dict[str, Callable[[Any], None]]


@pytest.fixture()
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in list(inject.STATE.items()):
        monkeypatch.setitem(inject.STATE, key, type(value)() if isinstance(value, (list, dict)) else value)
    for key in ("marked", "skipped_in_flight", "discarded"):
        monkeypatch.setitem(inject.STATE, key, 0)
    yield


def install_fake_vllm(monkeypatch: pytest.MonkeyPatch, classes: tuple[type, type],
                      async_initialised: bool = True) -> tuple[types.ModuleType, types.ModuleType]:
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "9.9.9"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    for name in ("vllm.v1", "vllm.v1.core", "vllm.v1.core.sched"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sched_mod = types.ModuleType(SCHED_MODULE)
    sched_mod.Scheduler = classes[0]  # type: ignore[attr-defined]
    async_mod = types.ModuleType(ASYNC_SCHED_MODULE)
    if async_initialised:
        async_mod.AsyncScheduler = classes[1]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, SCHED_MODULE, sched_mod)
    monkeypatch.setitem(sys.modules, ASYNC_SCHED_MODULE, async_mod)
    return sched_mod, async_mod


def arm(value: str) -> Hooks:
    """activate() with an after_import that records hooks instead of waiting for imports."""
    hooks: Hooks = {}

    def after_import(name: str, patch: Callable[[Any], None]) -> None:
        hooks[name] = patch

    inject.activate(value, after_import)
    return hooks


def fire(hooks: Hooks) -> None:
    for name, patch in hooks.items():
        patch(sys.modules[name])


# --------------------------------------------------------------------------- activation


def test_no_injection_requested_arms_nothing(fresh_state: None) -> None:
    assert arm("") == {}
    assert inject.probe()["requested"] == [] and inject.probe()["error"] is None


def test_unknown_fault_raises_and_arms_nothing(fresh_state: None) -> None:
    with pytest.raises(InjectError):
        arm("vllm#42043,vllm#99999")
    assert inject.STATE["requested"] == [] and inject.STATE["pending"] == []


def test_register_fails_loudly_on_unknown_fault(monkeypatch: pytest.MonkeyPatch, fresh_state: None) -> None:
    monkeypatch.setitem(shim.STATE, "registered", False)
    monkeypatch.setitem(shim.STATE, "problems", [])
    monkeypatch.setenv(inject.ENV_INJECT, "nope#1")
    monkeypatch.delenv(shim.ENV_CPU_ASYNC, raising=False)
    with pytest.raises(InjectError, match="nope#1"):
        shim.register()


def test_requested_but_scheduler_never_imported_is_reported_not_applied(fresh_state: None) -> None:
    hooks = arm(FAULT_42043)
    assert set(hooks) == {SCHED_MODULE, ASYNC_SCHED_MODULE}
    p = inject.probe()
    assert p["applied"] == {} and p["pending"] == [FAULT_42043]
    assert "never imported" in p["reasons"][FAULT_42043] and p["error"]


def test_waits_while_async_scheduler_is_still_importing(monkeypatch: pytest.MonkeyPatch, fresh_state: None) -> None:
    # The engine core imports async_scheduler, which imports scheduler: scheduler's hook fires while
    # async_scheduler is half-initialised, and must not install (or fail) then.
    _, async_mod = install_fake_vllm(monkeypatch, make_counter(), async_initialised=False)
    hooks = arm(FAULT_42043)
    hooks[SCHED_MODULE](sys.modules[SCHED_MODULE])
    assert inject.STATE["pending"] == [FAULT_42043] and inject.STATE["not_applicable"] == {}
    async_mod.AsyncScheduler = make_counter()[1]  # type: ignore[attr-defined]
    hooks[ASYNC_SCHED_MODULE](async_mod)
    assert FAULT_42043 in inject.STATE["applied"] and inject.STATE["pending"] == []


# --------------------------------------------------------------------------- the patches


def test_native_bug_is_reported_and_nothing_patched(monkeypatch: pytest.MonkeyPatch, fresh_state: None) -> None:
    sched, async_sched = make_native()
    install_fake_vllm(monkeypatch, (sched, async_sched))
    fire(arm(FAULT_42043))
    p = inject.probe()
    assert p["applied"] == {} and FAULT_42043 in p["native"]
    assert "native" in p["reasons"][FAULT_42043] and "9.9.9" in p["reasons"][FAULT_42043]
    assert not getattr(sched.reset_prefix_cache, "__repro_inject__", False)
    assert not getattr(async_sched._update_request_with_output, "__repro_inject__", False)


def test_unrecognised_shape_is_not_applicable_and_unpatched(monkeypatch: pytest.MonkeyPatch,
                                                             fresh_state: None) -> None:
    sched, async_sched = make_unknown()
    install_fake_vllm(monkeypatch, (sched, async_sched))
    fire(arm(FAULT_42043))
    p = inject.probe()
    assert p["applied"] == {} and "not recognised" in p["not_applicable"][FAULT_42043]
    assert not getattr(sched.reset_prefix_cache, "__repro_inject__", False)


def test_counter_shape_drops_first_post_resume_frame(monkeypatch: pytest.MonkeyPatch, fresh_state: None) -> None:
    sched, async_sched = make_counter()
    install_fake_vllm(monkeypatch, (sched, async_sched))
    fire(arm(FAULT_42043))
    p = inject.probe()
    assert p["shape"]["kind"] == SHAPE_COUNTER and "reset_prefix_cache" in p["applied"][FAULT_42043]

    # Keep-mode pause: drained, nothing in flight.  Upstream alone would discard nothing.
    a, b = Req("a"), Req("b")
    s = async_sched([a, b])
    assert inject.probe(s)["effective"]["ok"] is True
    s.reset_prefix_cache(reset_running_requests=True)
    assert a.async_tokens_to_discard == 1 and b.async_tokens_to_discard == 1
    assert s._update_request_with_output(a, [7]) == ([], False)  # the real first post-resume token
    assert s._update_request_with_output(a, [8]) == ([8], False)
    assert a.output == [8]
    assert s._update_request_with_output(b, [3]) == ([], False)
    p = inject.probe()
    assert p["marked"] == 2 and p["discarded"] == 2
    assert p["discarded_frames"] == [{"request_id": "a", "token_ids": [7]}, {"request_id": "b", "token_ids": [3]}]


def test_counter_shape_mid_step_loses_nothing_like_0_21(monkeypatch: pytest.MonkeyPatch, fresh_state: None) -> None:
    # One frame in flight at the reset: 0.21.0's flag was spent on that stale frame, so no real token is lost.
    sched, async_sched = make_counter()
    install_fake_vllm(monkeypatch, (sched, async_sched))
    fire(arm(FAULT_42043))
    r = Req("r", in_flight=1)
    s = async_sched([r])
    s.reset_prefix_cache(reset_running_requests=True)
    assert s._update_request_with_output(r, [99]) == ([], False)  # stale frame
    assert s._update_request_with_output(r, [5]) == ([5], False)
    assert r.output == [5]


def test_reset_without_preemption_marks_nothing(monkeypatch: pytest.MonkeyPatch, fresh_state: None) -> None:
    sched, async_sched = make_counter()
    install_fake_vllm(monkeypatch, (sched, async_sched))
    fire(arm(FAULT_42043))
    r = Req("r")
    s = async_sched([r])
    s.reset_prefix_cache()  # clear_cache without force-preemption (e.g. nothing to preempt)
    assert r.async_tokens_to_discard == 0 and s._update_request_with_output(r, [4]) == ([4], False)
    assert inject.probe()["marked"] == 0


def test_sync_scheduler_is_never_marked(monkeypatch: pytest.MonkeyPatch, fresh_state: None) -> None:
    sched, async_sched = make_counter()
    install_fake_vllm(monkeypatch, (sched, async_sched))
    fire(arm(FAULT_42043))
    r = Req("r")
    s = sched([r])
    eff = inject.probe(s)["effective"]
    assert eff["ok"] is False and "not an AsyncScheduler" in eff["reason"]
    s.reset_prefix_cache(reset_running_requests=True)
    assert r.async_tokens_to_discard == 0 and inject.probe()["marked"] == 0


def test_stale_shape_drops_first_post_resume_frame(monkeypatch: pytest.MonkeyPatch, fresh_state: None) -> None:
    sched, async_sched = make_stale()
    install_fake_vllm(monkeypatch, (sched, async_sched))
    fire(arm(FAULT_42043))
    assert inject.probe()["shape"]["kind"] == SHAPE_STALE
    drained, busy = Req("drained"), Req("busy", in_flight=1)
    s = async_sched([drained, busy])
    s.reset_prefix_cache(reset_running_requests=True)
    p = inject.probe()
    assert p["marked"] == 1 and p["skipped_in_flight"] == 1

    # Drained request: its first frame is dropped before super(), placeholders untouched.
    drained.num_output_placeholders = 1
    assert s.update_from_output(drained, [7]) == []
    assert drained.output == [] and drained.num_output_placeholders == 1
    assert s.update_from_output(drained, [8]) == [8]
    # Request with output in flight: vLLM drops the stale frame itself, the next real one arrives.
    assert s.update_from_output(busy, [99]) == []
    assert s.update_from_output(busy, [5]) == [5]
    assert busy.output == [5]
    assert inject.probe()["discarded"] == 1


def test_subclass_overriding_update_is_reported_not_effective(monkeypatch: pytest.MonkeyPatch,
                                                              fresh_state: None) -> None:
    sched, async_sched = make_counter()
    install_fake_vllm(monkeypatch, (sched, async_sched))
    fire(arm(FAULT_42043))

    class PlatformScheduler(async_sched):  # type: ignore[misc, valid-type]
        def _update_request_with_output(self, request: Req, new_token_ids: list[int]) -> tuple[list[int], bool]:
            return new_token_ids, False

    eff = inject.probe(PlatformScheduler([]))["effective"]
    assert eff["ok"] is False and "overrides _update_request_with_output" in eff["reason"]


# --------------------------------------------------------------------------- shape recognition


def sources_of(classes: tuple[type, type]) -> SchedulerSources:
    import inspect

    def own(cls: type, name: str) -> str | None:
        f = cls.__dict__.get(name)
        return inspect.getsource(f) if f is not None else None

    sched, async_sched = classes
    return SchedulerSources(reset=own(sched, "reset_prefix_cache"), preempt=own(sched, "_preempt_request"),
                            update_from_output=own(sched, "update_from_output"),
                            async_update=own(async_sched, "_update_request_with_output"))


@pytest.mark.parametrize(("factory", "kind"), [
    (make_native, SHAPE_NATIVE), (make_counter, SHAPE_COUNTER), (make_stale, SHAPE_STALE),
    (make_unknown, SHAPE_UNKNOWN)])
def test_classify_fake_shapes(factory: Callable[[], tuple[type, type]], kind: str) -> None:
    assert classify_shape(sources_of(factory())).kind == kind


def test_classify_refuses_partial_shapes() -> None:
    stale = sources_of(make_stale())
    assert classify_shape(SchedulerSources(None, None, None, None)).kind == SHAPE_UNKNOWN
    no_skip = SchedulerSources(stale.reset, stale.preempt, "def update_from_output(self): pass", stale.async_update)
    shape = classify_shape(no_skip)
    assert shape.kind == SHAPE_UNKNOWN and "skip of drop-mode stale frames" in shape.reason
    assert classify_shape(SchedulerSources(stale.reset, stale.preempt, stale.update_from_output, None)).kind \
        == SHAPE_UNKNOWN
    counter = sources_of(make_counter())
    undrained = SchedulerSources(counter.reset, counter.preempt, None, "def f(self, request, new_token_ids): pass")
    assert classify_shape(undrained).kind == SHAPE_UNKNOWN


def test_hang_pause_returns_a_future_nobody_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    import types
    from concurrent.futures import Future

    from repro.patches import inject

    calls: list[tuple] = []

    class EngineCore:
        def pause_scheduler(self, mode: str = "abort", clear_cache: bool = True) -> None:
            calls.append((mode, clear_cache))

    class EngineCoreProc(EngineCore):
        def pause_scheduler(self, mode: str = "abort", clear_cache: bool = True) -> Future:
            calls.append(("proc", mode))
            done: Future = Future()
            done.set_result(None)
            return done

    mod = types.ModuleType(inject.CORE_MODULE)
    for cls in (EngineCore, EngineCoreProc):
        cls.__module__ = inject.CORE_MODULE
        setattr(mod, cls.__name__, cls)
    monkeypatch.setattr(inject, "STATE", {**inject.STATE, "applied": {}, "not_applicable": {}, "pending": []})
    inject.activate("hang#pause", lambda name, patch: patch(mod))
    fut = EngineCoreProc().pause_scheduler(mode="keep")
    assert isinstance(fut, Future) and not fut.done()
    assert calls == [("proc", "keep")], "the engine must still pause; only the acknowledgement hangs"
    assert sorted(inject.STATE["applied"]["hang#pause"]) == [
        f"{inject.CORE_MODULE}:EngineCore.pause_scheduler", f"{inject.CORE_MODULE}:EngineCoreProc.pause_scheduler"]
