"""Every scenario a cell can name, declared once: its pause shape, its engine profile and its tiers.

The ``scenario`` axis of :mod:`harness.core.axes` takes its values from :data:`SCENARIO_TABLE`.  A scenario
says which pause modes it plays (none for a scenario that never pauses: then the ``mode`` and
``clear_cache`` axes do not apply, its cells keep their defaults and their ids leave both out, e.g.
``vllm0.21.0-mp-async_on-reset_inflight``), which clear_cache values are meaningful, which *engine
profile* it needs and which tiers implement it.

An engine profile is a set of engine arguments a scenario needs on top of the cell's engine axes (a tiny
KV cache to force preemption, speculative decoding, a small token budget for chunked prefill).  It is part
of the engine key: scenarios with the same profile share one engine, so the default profile's scenarios
(pause, weight sync, resets, aborts) still cost one engine start per engine config.

Adding a scenario is one entry here plus its implementation on each tier it lists
(``repro/scenarios/`` for the engine tier, ``repro/sched/`` through ``harness.sched_tier`` for the
scheduler tier).  A tier not listed makes the cell UNSUPPORTED with the reason, never OK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MODES = ("keep", "wait", "abort")
TIERS = ("engine", "scheduler")
DEFAULT_PROFILE = "default"


@dataclass(frozen=True)
class EngineProfile:
    """Engine arguments (``AsyncEngineArgs`` fields) a scenario needs, and why."""

    name: str
    engine_args: tuple[tuple[str, Any], ...] = ()
    why: str = ""

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.engine_args)


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


PROFILES: dict[str, EngineProfile] = {
    p.name: p for p in (
        EngineProfile(DEFAULT_PROFILE, why="the harness's own engine settings"),
    )
}

SCENARIO_TABLE: tuple[Scenario, ...] = (
    # "pause" spells as nothing: the first (and default) scenario, whose ids predate the axis.
    Scenario("pause", "pause in a mode (keep/wait/abort), resume, check every token", modes=MODES,
             tiers=TIERS, refs=("vllm#42043", "PR #42117"), spelling=""),
    # The RLHF flow of upstream's examples/rl/rlhf_async_new_apis.py.
    Scenario("weight-sync", "keep pause, swap the weights to a second checkpoint, resume", modes=("keep",),
             refs=("vllm#42043",)),
)

BY_SCENARIO: dict[str, Scenario] = {s.name: s for s in SCENARIO_TABLE}
SCENARIOS: tuple[str, ...] = tuple(BY_SCENARIO)
# Pause modes per scenario (a non-pausing scenario: its cells carry the default mode, which is not played).
SCENARIO_MODES: dict[str, tuple[str, ...]] = {s.name: s.modes or MODES[:1] for s in SCENARIO_TABLE}


def scenario(name: str) -> Scenario | None:
    return BY_SCENARIO.get(name)


def pauses(name: str) -> bool:
    """Whether the scenario ``name`` pauses (unknown names do: their ids keep every segment)."""
    s = BY_SCENARIO.get(name)
    return s is None or s.pauses


def profile_of(name: str) -> str:
    s = BY_SCENARIO.get(name)
    return s.profile if s is not None else DEFAULT_PROFILE
