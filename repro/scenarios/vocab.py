"""A scenario's vocabulary: the plan (requests, pauses, in-flight operations), what a scenario knows about
the engine, and the errors it raises.

A scenario module turns its JSON parameters into a :class:`Plan`: which
requests exist, when each is submitted (at start, during pause *k*, after
resume *k*, or after in-flight operation *k*), a list of in-flight operations
(a prefix-cache reset or an abort of some requests, done while the engine keeps
generating) and a list of pauses (mode, clear_cache, the token count that
triggers it).  ``repro.scenarios.runs`` plays it (``repro.scenarios.driver``) and
returns one record per request; judging the records is the harness's job
(``harness/core/oracle.py``).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from repro.models.deterministic import BigramCycleSpec

PAUSE_MODES = ("keep", "wait", "abort")
# The engine's max_model_len (repro.engine.main): prompt + max_tokens + REFERENCE_MARGIN must fit.
MAX_MODEL_LEN = 256
# The engine's max_num_batched_tokens (repro.engine.main): a step holds every prompt a default cell makes the engine
# prefill at once, so no prefill is chunked whatever the timing.  The largest: a keep + clear_cache pause of the
# sampled cells (harness.run.spec.SAMPLED_SHAPE: 4 groups of 4 children) recomputes every child's prompt and output
# at the resume, at most 16 x (6 + 48) = 864 tokens; a chunked one kills vLLM's CPU worker when the request is
# seeded ("CPU Generator does not use offset", repro.scenarios.seeded_prefill).  With 256 that fitted only while the
# pause came within 13 tokens (12 x (6 + 13) + 4 x 6 = 252), which a busy machine overran (docs/upstream-bugs.md).
MAX_NUM_BATCHED_TOKENS = 1024
# A reference run's stand-in for a pause: nothing pauses, the requests submitted during or after the pause
# join at its trigger, so the reference is batched as the paused run is.
STAGGER = "stagger"
# The reference runs this many tokens past max_tokens, so the tail of a
# stream that lost tokens can still be checked against it.
REFERENCE_MARGIN = 8


class DoorError(Exception):
    """vLLM's answer through a door other than the engine's own API (the server door's ``ServerError``): defined
    here so that a scenario can tell it apart without importing the door above it (docs/architecture.md)."""


class ScenarioUnsupported(Exception):
    """The vLLM under test cannot run this scenario (e.g. no keep-mode pause)."""


class ScenarioFailed(Exception):
    """The scenario could not be completed (an engine or request error)."""


class ScenarioTimeout(ScenarioFailed):
    """The engine did not reach an expected state within the scenario timeout."""


# Run while the engine is paused, after the client holds every pre-pause token
# and before resume (e.g. a weight update); returns facts for the event log.
PauseAction = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class PauseSpec:
    mode: str
    clear_cache: bool
    after_tokens: int  # pause once every running request has this many tokens
    action: PauseAction | None = field(default=None, compare=False)
    # What pauses and resumes the engine, when not pause_generation(mode, clear_cache) / resume_generation()
    # (the sleep scenario: sleep(level, mode) / wake_up()); each returns facts for the event log.
    enter: PauseAction | None = field(default=None, compare=False)
    leave: PauseAction | None = field(default=None, compare=False)
    # The requests submitted during the pause reach the paused engine *before* ``action`` runs (vllm#51476: they
    # arrive under the weights the action replaces); by default they are submitted after it.
    admit_before_action: bool = False


INFLIGHT_OPS = ("reset", "abort")


@dataclass(frozen=True)
class InflightSpec:
    """An operation on the engine while it keeps generating (no pause).

    ``reset``: ``reset_prefix_cache(reset_running_requests=True)``, vLLM's own
    mid-generation reset (tests/v1/core/test_reset_prefix_cache_e2e.py): every
    running request is preempted and must resume with exactly the tokens it
    would have produced.  ``abort``: ``AsyncLLM.abort`` of the ``targets``
    (request ids of the plan) at once; the other requests keep generating.
    """

    op: str
    after_tokens: int  # once every running request it concerns has this many tokens
    targets: tuple[str, ...] = ()  # abort: the requests aborted

    def __post_init__(self) -> None:
        if self.op not in INFLIGHT_OPS:
            raise ValueError(f"unknown in-flight operation {self.op!r}; valid: {', '.join(INFLIGHT_OPS)}")
        if (self.op == "abort") != bool(self.targets):
            raise ValueError("an abort names the requests it aborts; a reset names none")


@dataclass(frozen=True)
class RequestSpec:
    rid: str
    prompt: list[int]
    max_tokens: int
    # "start", or ("during", k) / ("after", k): submitted while pause k is in
    # effect, or right after resume k; ("after_op", k): right after in-flight operation k;
    # ("tokens", n): once every request submitted at start has n tokens (or ended), before any
    # in-flight operation or pause.
    submit: tuple[str, int] | str = "start"
    # SamplingParams fields beyond greedy's (repro.scenarios.sampling.sampling_kwargs); "n" > 1: a group of
    # children, each recorded as a stream of its own.
    sampling: dict[str, Any] = field(default_factory=dict)
    # (name, int id, path): sent as LoRARequest(name, id, path) (the stale-kv LoRA door: repro.scenarios.stale_kv_lora)
    lora: tuple[str, int, str] | None = None

    @property
    def n(self) -> int:
        return int(self.sampling.get("n", 1))


def submit_kind(submit: tuple[str, int] | str | list[Any]) -> str:
    """``start``, ``during``, ``after``, ``after_op`` or ``tokens``: when a request is submitted."""
    return submit if isinstance(submit, str) else str(submit[0])


@dataclass
class Plan:
    requests: list[RequestSpec]
    pauses: list[PauseSpec]
    # Played in order before the pauses (no scenario mixes the two yet).
    inflight: list[InflightSpec] = field(default_factory=list)


@dataclass(frozen=True)
class EngineContext:
    """What a scenario that changes the engine (weight sync) knows about it beyond the AsyncLLM."""

    model_spec: BigramCycleSpec | Any  # the checkpoint the engine started with (A); None for a user's model
    model_dir: Path
    perm: list[int] | None  # bigram-cycle: the cycle its greedy stream walks; None for other models
    model_cache: Path
    work_dir: Path  # where side logs (e.g. the weight trainer's) go
    tensor_parallel_size: int
    # A new AsyncLLM with this engine's arguments but another checkpoint
    # (the caller shuts it down).
    start_engine: Callable[[Path], Any]
    model_kind: str = "bigram-cycle"  # repro.core.wire.MODEL_KINDS
    vocab_size: int = 0  # token ids prompts may use; 0: len(perm)

    @property
    def vocab(self) -> int:
        return self.vocab_size or len(self.perm or ())


def make_prompts(n: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Distinct token-id prompts (ids 2.. to stay clear of BOS/EOS)."""
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    prompts: list[list[int]] = []
    while len(prompts) < n:
        p = tuple(rng.randrange(2, vocab_size) for _ in range(length))
        if p not in seen:
            seen.add(p)
            prompts.append(list(p))
    return prompts


_P = TypeVar("_P")


def params_from_dict(cls: type[_P], data: dict[str, Any], what: str) -> _P:
    """A scenario's parameter dataclass from its spec entry; an unknown key is an error, never ignored."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; valid: {sorted(known)}")
    return cls(**data)
