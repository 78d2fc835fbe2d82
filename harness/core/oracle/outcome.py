"""The outcome words of a request and a cell, and the fault events a stream is decomposed into.

Request outcomes, from best to worst: OK, TRUNCATED, DUPLICATE(k at i), LOSS(k at i), STALE-KV(at i), DIVERGED(at i),
ERROR.
Cell outcomes add CRASH and STALL (findings about vLLM), UNSUPPORTED and TIMEOUT (and ERROR for infrastructure
failures); a cell that ran takes the worst outcome of its requests.  A :class:`FaultEvent` is one shift of a
stream against its reference.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Outcome(enum.Enum):
    OK = "OK"
    # The streams cannot tell: the reference repeats where a shift would show, or the engine's no-pause
    # reference changes with batch composition.  No verdict either way (SKIP in a bisect, UNKNOWN for a
    # workaround), but not an infrastructure failure: the cell ran.
    AMBIGUOUS = "AMBIGUOUS"
    TRUNCATED = "TRUNCATED"
    # Sampled requests (issue 34, harness.core.oracle.sampled): the tokens are right but a delivered logprob is
    # not the model's for the delivered history (another position's, or another history's); or a GRPO group
    # came back broken (a child missing, short, or a duplicate of another).
    LOGPROB_SHIFT = "LOGPROB-SHIFT"
    GROUP_BROKEN = "GROUP-BROKEN"
    DUPLICATE = "DUPLICATE"
    LOSS = "LOSS"
    # A request started after a weight update whose tokens are, token for token, what reading KV the old weights
    # wrote gives (issue 37, harness.core.oracle.stale_kv): a prefix-cache hit across the update.
    STALE_KV = "STALE-KV"
    DIVERGED = "DIVERGED"
    # vLLM's own code raised while a scenario drove it (e.g. the scheduler's ``assert
    # request.num_output_placeholders >= 0``, PR #46066): a finding about vLLM, unlike ERROR (the harness,
    # the environment or the machine failed).
    CRASH = "CRASH"
    # vLLM's scheduler stopped making progress while the harness drove every step (scheduler tier): a request
    # it could run got no token for many steps while nothing else progressed (vllm#42043's drained reset on
    # 0.21.0 leaves a request that never finishes).  A finding, unlike TIMEOUT (a process outlived its
    # wall-clock limit, which says nothing about whose fault it was).
    STALL = "STALL"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    UNSUPPORTED = "UNSUPPORTED"
    BUILD_FAILED = "BUILD-FAILED"  # the vLLM environment could not be built
    FLAKY = "FLAKY"  # --repeat N: the runs of one cell disagree (fractions in CellResult.repeats)

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def is_infra(self) -> bool:
        """No token streams to judge: never GOOD or BAD in a bisect."""
        return self in (Outcome.UNSUPPORTED, Outcome.BUILD_FAILED, Outcome.ERROR, Outcome.TIMEOUT)

    @property
    def is_token_fault(self) -> bool:
        """A wrong token stream (what the harness hunts), as opposed to infrastructure."""
        return self in (Outcome.LOSS, Outcome.DUPLICATE, Outcome.DIVERGED, Outcome.TRUNCATED, Outcome.LOGPROB_SHIFT,
                        Outcome.GROUP_BROKEN, Outcome.STALE_KV)

    @property
    def is_finding(self) -> bool:
        """Something wrong with vLLM: a token fault, vLLM's own code raising (CRASH) or its scheduler making no
        progress (STALL); BAD in a bisect, never retried."""
        return self.is_token_fault or self in (Outcome.CRASH, Outcome.STALL)

    @property
    def is_retryable(self) -> bool:
        """An infrastructure failure worth another attempt (``--retry-infra``): the engine crashed or hung for a
        reason outside vLLM.  A finding never is; neither is UNSUPPORTED (it would say the same again) nor
        BUILD-FAILED (the env build is cached and deterministic)."""
        return self in (Outcome.ERROR, Outcome.TIMEOUT)


_RANK = {o: i for i, o in enumerate((
    Outcome.OK, Outcome.AMBIGUOUS, Outcome.TRUNCATED, Outcome.LOGPROB_SHIFT, Outcome.GROUP_BROKEN, Outcome.DUPLICATE,
    Outcome.LOSS, Outcome.STALE_KV, Outcome.DIVERGED,
    Outcome.CRASH, Outcome.STALL, Outcome.FLAKY, Outcome.UNSUPPORTED, Outcome.BUILD_FAILED, Outcome.ERROR,
    Outcome.TIMEOUT))}
SHIFTS = (Outcome.LOSS, Outcome.DUPLICATE)  # the kinds of fault event, in the order they are tried


@dataclass(frozen=True)
class FaultEvent:
    """One shift of an observed stream against its reference: ``k`` tokens lost (LOSS: the stream resumes k
    tokens further on) or repeated (DUPLICATE: the k tokens before are emitted again) at observed index ``at``."""

    kind: Outcome  # Outcome.LOSS or Outcome.DUPLICATE
    k: int
    at: int

    def __post_init__(self) -> None:
        if self.kind not in SHIFTS or self.k < 1 or self.at < 0:
            raise ValueError(f"not a fault event: {self.kind.value}({self.k} at {self.at})")

    @property
    def shift(self) -> int:
        """How far on in the reference the stream is after this event (negative: back)."""
        return self.k if self.kind is Outcome.LOSS else -self.k

    @property
    def label(self) -> str:
        return f"{self.kind.value}({self.k} at {self.at})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "k": self.k, "at": self.at}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FaultEvent:
        return cls(Outcome(d["kind"]), int(d["k"]), int(d["at"]))


def events_label(events: Sequence[FaultEvent], with_index: bool = True) -> str:
    """``LOSS(1 at 6; 1 at 18)`` when every event is of one kind, else ``LOSS(1 at 6); DUPLICATE(2 at 18)``;
    without the index: ``LOSS(1; 1)``, ``LOSS(1); DUPLICATE(2)``."""
    def one(e: FaultEvent) -> str:
        return f"{e.k} at {e.at}" if with_index else str(e.k)

    if len({e.kind for e in events}) == 1:
        return f"{events[0].kind.value}({'; '.join(one(e) for e in events)})"
    return "; ".join(f"{e.kind.value}({one(e)})" for e in events)


