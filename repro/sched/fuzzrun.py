"""What a scheduler fuzz run shares across its examples, and the checks and replays around the state machine.

``repro/sched/fuzz.py`` holds Hypothesis' state machine (the rules) and ``run_fuzz``; this module the rest it
runs with: the run's statistics and last failure, the :class:`FuzzRun` every example shares (the release's
adapter, what it can build, reach measurement), the invariant and teardown checks, the setups a release can
draw (each tried once), and the falsifying example's minimising and replay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis.control import current_build_context

from repro.core.crash import vllm_crash_site
from repro.core.wire import FuzzSpec
from repro.sched.adapter import Unsupported
from repro.sched.executor import Executor
from repro.sched.known import Match, Row, classify
from repro.sched.opmodel import FuzzState, failure_kind, finish_fault, minimise, setup_for, stream_fault
from repro.sched.reach import CHECKPOINTS
from repro.sched.scenario import run_scenario
from repro.sched.script import Op, Script, Setup
from repro.sched.signatures import finishes_all_on_none, param_names


@dataclass
class Failure:
    script: Script
    failure: str  # the exception Hypothesis saw: "AssertionError: r0: position 3: ..."
    final: bool  # recorded during Hypothesis' final replay of the shrunk example
    kind: str  # opmodel.failure_kind: what a smaller script must hit to fail alike


@dataclass
class KnownHit:
    """A known-bug row the run met: the first example that hit it, and how many examples did (each dropped)."""

    match: Match
    script: Script  # the first example's script (minimised once the run ends)
    failure: str
    kind: str
    first_example: int
    examples: int = 1

    def to_json(self, script: Script | None = None) -> dict[str, Any]:
        s = script or self.script
        return {"bug": self.match.bug, "scenario": self.match.scenario, "expect": self.match.expect,
                "failure": self.failure, "first_example": self.first_example, "examples": self.examples,
                "script": s.to_dict(), "ops": len(s.ops)}


@dataclass
class FuzzStats:
    """What the run did, gathered by every example: how many, what they covered, and the last failure."""

    examples: int = 0
    examples_to_failure: int | None = None
    ops: Counter[str] = field(default_factory=Counter)
    setups: Counter[str] = field(default_factory=Counter)
    inflight_resets: int = 0
    kv_pressure_examples: int = 0  # vLLM preempted more often than the resets did: memory pressure
    finished_by_length: int = 0
    requests: Counter[int] = field(default_factory=Counter)  # requests per example that ran to completion
    failure: Failure | None = None
    known: dict[str, KnownHit] = field(default_factory=dict)  # by "<bug> (<scenario>)": each reported once

    def known_hit(self, match: Match, script: Script, failure: str, kind: str) -> None:
        key = f"{match.bug} ({match.scenario})"
        hit = self.known.get(key)
        if hit is None:
            self.known[key] = KnownHit(match, script, failure, kind, self.examples)
        else:
            hit.examples += 1

    def failed(self, state: FuzzState, exc: BaseException) -> None:
        if self.examples_to_failure is None:
            self.examples_to_failure = self.examples
        final = _is_final(current_build_context)
        if self.failure is None or final or not self.failure.final:
            self.failure = Failure(state.script(), describe(exc), final, kind_of(exc))

    def coverage(self) -> dict[str, Any]:
        return {"ops": dict(sorted(self.ops.items())), "setups": dict(sorted(self.setups.items())),
                "inflight_resets": self.inflight_resets, "kv_pressure_examples": self.kv_pressure_examples,
                "finished_by_length": self.finished_by_length,
                "requests_per_example": {str(k): v for k, v in sorted(self.requests.items())}}


def describe(exc: BaseException) -> str:
    """An exception on one line; one raised in vLLM's code names its frame and source line (a bare assert has no
    message)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    site = vllm_crash_site(exc)
    return text if site is None else f"{text} {site[1]} at {site[0]}".replace(":  ", ": ")


def kind_of(exc: BaseException) -> str:
    site = vllm_crash_site(exc)
    return failure_kind(str(exc), None if site is None else site[0])


def _is_final(context: Callable[[], Any]) -> bool:
    try:
        return bool(context().is_final)
    except Exception:  # no build context: not inside a Hypothesis example
        return False


def setup_label(setup: Setup) -> str:
    return (f"D={setup.depth}" + (f",k={setup.spec_tokens}" if setup.spec_tokens else "")
            + (",kv" if setup.kv_consumer else ""))


@dataclass
class FuzzRun:
    """What every example of one run shares: the release's adapter, the checkpoint, the settings and the stats."""

    adapter: Any
    model_dir: Path
    perm: list[int]
    spec: FuzzSpec
    stats: FuzzStats
    reach: Any = None  # repro.sched.reach.Reach while measuring
    tracing: bool = False  # inside traced()
    kv_consumer: bool = True  # the release builds the null consumer KV connector (drawable_extras)
    sync_spec: bool = True  # ... and the sync Scheduler with drafts
    sessions: bool = True  # ... and resumable requests (streaming-input sessions)
    resets: bool = True  # its reset_prefix_cache takes reset_running_requests (0.12.0 on; release_ops)
    abort_all: bool = True  # its finish_requests takes None for "every request" (release_ops)
    rows: tuple[Row, ...] = ()  # the known-bug rows covering this release (repro.sched.known)

    def known(self, script: Script, exc: BaseException) -> Match | None:
        """The known-bug row a failure of ``script`` is (its control replayed here), or None: a new finding."""
        if not self.rows:
            return None
        kind = kind_of(exc)
        return classify(script, kind, describe(exc), self.rows, lambda control: fails_kind(self, control, kind))

    def traced(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` with reach measured (tracing is paused between rules: :meth:`repro.sched.reach.Reach.pause`).
        Everything that calls vLLM runs through here: the set-up, every rule and the teardown."""
        if self.reach is None or self.tracing:  # nested (the set-up's adds): the outer call pauses
            return fn()
        self.reach.resume()
        self.tracing = True
        try:
            return fn()
        finally:
            self.tracing = False
            self.reach.pause()

    def started_example(self) -> None:
        """Count an example; after 32, 64, 128, ... record the reach so far."""
        done = self.stats.examples
        if self.reach is not None and done in CHECKPOINTS:
            self.reach.checkpoint(done)
        self.stats.examples += 1


def apply(ex: Executor, op: Op) -> dict[str, Any]:
    """One op; the executor's bound (vLLM never finished a request) as the failure it is."""
    try:
        return ex.apply(op)
    except StopIteration:
        raise AssertionError(f"stalled: {ex.stalled}") from None


def check_streams(ex: Executor) -> None:
    """The invariant: every delivered stream is the tokens of its positions."""
    for s in ex.streams.values():
        fault = stream_fault(s.reference, s.observed, s.max_tokens) if s.submitted else None
        assert fault is None, f"{s.rid}: {fault}"


def check_finished(ex: Executor) -> None:
    """After the run to completion: every request not aborted finished with all its tokens."""
    for s in ex.streams.values():
        fault = finish_fault(len(s.observed), s.max_tokens, s.finish_reason, s.aborted) if s.submitted else None
        assert fault is None, f"{s.rid}: {fault}"


def count_finish(ex: Executor, stats: FuzzStats) -> None:
    by_resets = sum(e.get("running_at_reset", 0) for e in ex.log)
    recs = [s for s in ex.streams.values() if s.submitted]
    stats.finished_by_length += sum(1 for s in recs if not s.aborted)
    stats.requests[len(recs)] += 1
    if sum(getattr(s.request, "num_preemptions", 0) or 0 for s in recs) > by_resets:
        stats.kv_pressure_examples += 1


def drawable(adapter: Any, model_dir: Path, spec: FuzzSpec) -> tuple[FuzzSpec, dict[str, str]]:
    """``spec`` without the setups this release cannot build (each tried once), and why each was dropped."""
    dropped: dict[str, str] = {}

    def builds(depth: int, k: int) -> bool:
        try:
            adapter.scheduler(model_dir, setup_for(depth, 8, k, 0))
        except Unsupported as exc:
            dropped[f"depth={depth}" + (f", spec_tokens={k}" if k else "")] = str(exc)
            return False
        return True

    depths = tuple(d for d in spec.depths if builds(d, 0))
    ks = tuple(k for k in spec.spec_tokens if k == 0 or all(builds(d, k) for d in depths if d > 1))
    if not depths or not ks:
        return spec, dropped
    return replace(spec, depths=depths, spec_tokens=ks), dropped


def drawable_extras(adapter: Any, model_dir: Path, spec: FuzzSpec, dropped: dict[str, str]
                    ) -> tuple[bool, bool, bool]:
    """Whether this release builds the null consumer KV connector, the sync Scheduler with drafts and resumable
    requests (each tried once; why not is added to ``dropped``, and the examples are drawn without it)."""
    def builds(what: str, setup: Setup) -> bool:
        try:
            adapter.scheduler(model_dir, setup)
        except Unsupported as exc:
            dropped[what] = str(exc)
            return False
        return True

    kv = builds("kv_consumer", replace(setup_for(max(spec.depths), 8), kv_consumer=True))
    ks = [k for k in spec.spec_tokens if k]
    sync = 1 not in spec.depths or not ks or builds("spec_tokens on the sync Scheduler", setup_for(1, 8, ks[0], 0))
    try:
        adapter.request("probe", [2, 3], 1, None, resumable=True)
        sessions = hasattr(getattr(adapter, "classes", {}).get("sync"), "_update_request_as_session")
    except (Unsupported, TypeError) as exc:  # TypeError: a builder that takes no resumable at all
        dropped["streaming-input sessions"], sessions = str(exc), False
    if not sessions:
        dropped.setdefault("streaming-input sessions", "the scheduler has no streaming-input sessions")
    return kv, sync, sessions


def release_ops(adapter: Any, dropped: dict[str, str]) -> tuple[bool, bool]:
    """Whether this release's scheduler has the reset of running requests and the abort of every request
    (``finish_requests(None)``) the reset and abort_all rules call; why not is added to ``dropped``.  Before
    0.12.0 ``reset_prefix_cache()`` takes no argument, and ``finish_requests`` of 0.11-0.13 iterates its ids:
    called as newer releases are, they raise a TypeError that is the harness's, not vLLM's."""
    sched = getattr(adapter, "classes", {}).get("sync")
    names = param_names(getattr(sched, "reset_prefix_cache", None)) if sched is not None else None
    resets = names is None or "reset_running_requests" in names
    if not resets:
        dropped["reset"] = "reset_prefix_cache takes no reset_running_requests in this release"
    finish = getattr(sched, "finish_requests", None)
    abort_all = finish is None or finishes_all_on_none(finish)
    if not abort_all:
        dropped["abort_all"] = "finish_requests takes no None (every request) in this release"
    return resets, abort_all


def known_findings(run: FuzzRun, budget: int = 60) -> list[dict[str, Any]]:
    """Every known row the run met, once, with its first example minimised (still failing alike, still that row)."""
    out = []
    for hit in run.stats.known.values():
        script = minimise(hit.script, lambda smaller, h=hit: fails_alike(run, smaller, h.kind, known=h.match),
                          budget=budget)
        out.append(hit.to_json(script))
    return out


def falsifying(run: FuzzRun, failure: Failure) -> dict[str, Any]:
    """The shrunk example, minimised further (:func:`opmodel.minimise`): its op script, Hypothesis' failure, and the
    script replayed as an ``ops`` scenario."""
    script = minimise(failure.script, lambda smaller: fails_alike(run, smaller, failure.kind))
    params = script.to_dict()
    replay = run_scenario(run.adapter, {"id": "falsifying", "scenario": "ops", "params": params}, run.model_dir,
                          run.perm)
    return {"script": params, "failure": failure.failure, "ops": len(script.ops), "shrunk": failure.final,
            "hypothesis_ops": len(failure.script.ops), "replay": replay}


def fails_alike(run: FuzzRun, script: Script, kind: str, known: Match | None = None) -> bool:
    """Whether ``script``, played on a fresh scheduler with the machine's checks, fails with a failure of ``kind``.
    ``known``: the failure must be that known row's too; else (minimising a new finding) it must not be a known one,
    so a new finding is never cut down into a known bug."""
    try:
        fail = _replay(run, script)
    except Unsupported:
        return False
    if fail is None or kind_of(fail) != kind:
        return False
    if known is None and not run.rows:
        return True
    try:
        now = run.known(script, fail)
    except Unsupported:
        return False
    return now == known


def fails_kind(run: FuzzRun, script: Script, kind: str) -> bool:
    """Whether ``script`` fails with a failure of ``kind``, whatever row it would be (a known signature's control)."""
    try:
        fail = _replay(run, script)
    except Unsupported:
        return False
    return fail is not None and kind_of(fail) == kind


def _replay(run: FuzzRun, script: Script) -> Exception | None:
    """What ``script`` raises on a fresh scheduler with the machine's checks (None: it passes)."""
    try:
        sched = run.adapter.scheduler(run.model_dir, script.setup)
        ex = Executor(script, sched, run.adapter, run.perm, run.adapter.block_hasher(script.setup.block_size))
        for op in script.ops:
            apply(ex, op)
            check_streams(ex)
        check_finished(ex)
    except Unsupported:
        raise
    except Exception as exc:
        return exc
    return None
