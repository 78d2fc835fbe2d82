"""The oracle: pure functions that judge observed token streams against references.

Request outcomes, from best to worst: OK, TRUNCATED, DUPLICATE(k at i),
LOSS(k at i), DIVERGED(at i), ERROR.  Cell outcomes add UNSUPPORTED and
TIMEOUT (and ERROR for infrastructure failures); a cell that ran takes the
worst outcome of its requests.

The classification relies on references without repeated tokens (what a
bigram-cycle model produces): then a drop of k tokens at i is only explained
as LOSS(k at i).  With merely no *adjacent* repeats, a periodic reference can
make a loss of k >= 2 look like a shorter truncation; a loss of one token is
still found (shifts are tried smallest first, loss before duplicate).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class Outcome(enum.Enum):
    OK = "OK"
    TRUNCATED = "TRUNCATED"
    DUPLICATE = "DUPLICATE"
    LOSS = "LOSS"
    DIVERGED = "DIVERGED"
    # vLLM's own code raised while a scenario drove it (e.g. the scheduler's ``assert
    # request.num_output_placeholders >= 0``, PR #46066): a finding about vLLM, unlike ERROR (the harness,
    # the environment or the machine failed).
    CRASH = "CRASH"
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
        return self in (Outcome.LOSS, Outcome.DUPLICATE, Outcome.DIVERGED, Outcome.TRUNCATED)

    @property
    def is_finding(self) -> bool:
        """Something wrong with vLLM: a token fault, or vLLM's own code raising (CRASH); BAD in a bisect."""
        return self.is_token_fault or self is Outcome.CRASH


_RANK = {
    Outcome.OK: 0,
    Outcome.TRUNCATED: 1,
    Outcome.DUPLICATE: 2,
    Outcome.LOSS: 3,
    Outcome.DIVERGED: 4,
    Outcome.CRASH: 5,
    Outcome.FLAKY: 6,
    Outcome.UNSUPPORTED: 7,
    Outcome.BUILD_FAILED: 8,
    Outcome.ERROR: 9,
    Outcome.TIMEOUT: 10,
}


@dataclass(frozen=True)
class StreamVerdict:
    outcome: Outcome
    at: int | None = None  # index in the observed stream where it deviates
    k: int | None = None  # tokens lost or duplicated
    detail: str = ""

    @property
    def label(self) -> str:
        o = self.outcome.value
        if self.outcome in (Outcome.LOSS, Outcome.DUPLICATE):
            return f"{o}({self.k} at {self.at})"
        if self.outcome is Outcome.DIVERGED or (self.outcome is Outcome.TRUNCATED and self.at is not None):
            return f"{o}(at {self.at})"
        return o


def classify_stream(
    reference: Sequence[int],
    observed: Sequence[int],
    expected_len: int | None = None,
    prefix_ok: bool = False,
    max_shift: int = 8,
) -> StreamVerdict:
    """Judge ``observed`` against ``reference`` (which may be longer than needed).

    ``expected_len``: tokens a complete stream has (max_tokens); a shorter
    stream that matches is TRUNCATED unless ``prefix_ok`` (aborted requests).
    """
    n = len(observed)
    i = next((j for j in range(min(n, len(reference))) if observed[j] != reference[j]), None)
    if i is None:
        if n > len(reference):
            return StreamVerdict(Outcome.DIVERGED, len(reference), detail="longer than the reference")
        if expected_len is not None and n < expected_len and not prefix_ok:
            return StreamVerdict(Outcome.TRUNCATED, n, detail=f"{n} of {expected_len} tokens")
        return StreamVerdict(Outcome.OK)
    tail = observed[i:]
    for d in range(1, max_shift + 1):
        # LOSS(d): the stream resumes d tokens further on in the reference.
        if _matches(reference, i + d, tail):
            return StreamVerdict(Outcome.LOSS, i, d, f"expected {reference[i]}, got {observed[i]}")
        # DUPLICATE(d): the stream repeats the d tokens before i.
        if i - d >= 0 and _matches(reference, i - d, tail):
            return StreamVerdict(Outcome.DUPLICATE, i, d, f"expected {reference[i]}, got {observed[i]}")
    return StreamVerdict(Outcome.DIVERGED, i, detail=f"expected {reference[i]}, got {observed[i]}")


def _matches(reference: Sequence[int], start: int, tail: Sequence[int]) -> bool:
    """``tail`` equals reference[start:] over their overlap, which must be non-empty."""
    if start < 0 or start >= len(reference):
        return False
    m = min(len(tail), len(reference) - start)
    return list(tail[:m]) == list(reference[start : start + m])


@dataclass(frozen=True)
class RequestVerdict:
    rid: str
    verdict: StreamVerdict
    running_at_pause: bool  # frozen or in flight when the first pause happened
    pause_index: int | None  # tokens received before resume (keep) / before the pause ended
    first_post_resume: dict[str, int | None] | None  # {"index", "expected", "observed"}

    @property
    def outcome(self) -> Outcome:
        return self.verdict.outcome

    def to_dict(self) -> dict[str, Any]:
        return {
            "rid": self.rid,
            "outcome": self.outcome.value,
            "label": self.verdict.label,
            "at": self.verdict.at,
            "k": self.verdict.k,
            "detail": self.verdict.detail,
            "running_at_pause": self.running_at_pause,
            "pause_index": self.pause_index,
            "first_post_resume": self.first_post_resume,
        }


def classify_request(record: dict[str, Any]) -> RequestVerdict:
    """Judge one request record written by ``repro.cell``."""
    rid = record["rid"]
    ref, obs = record["reference"], record["observed"]
    pauses = record.get("pauses") or []
    # In-flight operations (a reset or an abort with no pause) count as the pause does: the request ran
    # through one; aborted by one, it may end early.
    interrupts = record.get("interrupts") or []
    running = bool(pauses or interrupts)
    aborted = any(p.get("mode") == "abort" for p in pauses) or any(
        i.get("op") == "abort" and i.get("target") for i in interrupts)
    frozen = [p for p in pauses if p.get("frozen")]
    pause_index = (pauses or interrupts)[0]["client_tokens"] if running else None
    fpr: dict[str, int | None] | None = None
    if frozen:
        idx = frozen[0]["client_tokens"]
        fpr = {"index": idx, "expected": _at(ref, idx), "observed": _at(obs, idx)}
    elif record.get("submit") not in ("start", None):
        # Submitted during the pause or after resume: token 0 is post-resume.
        fpr = {"index": 0, "expected": _at(ref, 0), "observed": _at(obs, 0)}
    if record.get("error"):
        v = StreamVerdict(Outcome.ERROR, detail=str(record["error"]))
    else:
        v = classify_stream(ref, obs, expected_len=record["max_tokens"], prefix_ok=aborted)
        short = len(obs) < record["max_tokens"]
        if v.outcome is Outcome.OK and aborted and short and record.get("finish_reason") != "abort":
            v = StreamVerdict(
                Outcome.TRUNCATED, len(obs),
                detail=f"ended with finish_reason {record.get('finish_reason')!r}, not 'abort'",
            )
    return RequestVerdict(rid, v, running, pause_index, fpr)


def _at(seq: Sequence[int], i: int) -> int | None:
    return seq[i] if 0 <= i < len(seq) else None


@dataclass(frozen=True)
class CellVerdict:
    outcome: Outcome
    summary: str  # e.g. "LOSS(1) in 8/10 requests (8/8 running at pause)"
    counts: dict[str, int] = field(default_factory=dict)
    requests: tuple[RequestVerdict, ...] = ()
    reason: str | None = None
    label: str = ""  # the summary's head: "LOSS(1)", "LOSS(1,2)", "OK"; "" = the outcome

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.outcome.value)


def cell_verdict(records: list[dict[str, Any]]) -> CellVerdict:
    """Worst request outcome, with counts, for a cell whose scenario ran."""
    reqs = tuple(classify_request(r) for r in records)
    if not reqs:
        return CellVerdict(Outcome.ERROR, "no requests recorded", reason="scenario produced no requests")
    for r in records:
        if not r.get("reference_matches_model", True):
            return CellVerdict(
                Outcome.ERROR,
                "model check failed",
                requests=reqs,
                reason=f"the engine's no-pause stream for {r['rid']} does not follow the bigram cycle; "
                "token loss would not be visible",
            )
    worst = max(reqs, key=lambda r: r.outcome.rank)
    counts = Counter(_short(r.verdict) for r in reqs)
    bad = [r for r in reqs if r.outcome is worst.outcome]
    reason = None
    label = worst.outcome.value
    if worst.outcome is Outcome.OK:
        summary = f"OK {len(reqs)}/{len(reqs)}"
    else:
        running = [r for r in reqs if r.running_at_pause]
        bad_running = [r for r in bad if r.running_at_pause]
        # One label per distinct size, so the count always matches the label:
        # "LOSS(1) in 8/10", or "LOSS(1,2) in 3/10" when sizes differ.
        ks = sorted({r.verdict.k for r in bad if r.verdict.k is not None})
        label = worst.outcome.value + (f"({','.join(map(str, ks))})" if ks else "")
        summary = f"{label} in {len(bad)}/{len(reqs)} requests"
        if running:
            summary += f" ({len(bad_running)}/{len(running)} running at pause)"
        if worst.outcome is Outcome.ERROR:
            reason = f"{len(bad)} request(s) failed; first: {worst.rid}: {worst.verdict.detail}"
    return CellVerdict(worst.outcome, summary, dict(sorted(counts.items())), reqs, reason, label)


def _short(v: StreamVerdict) -> str:
    if v.outcome in (Outcome.LOSS, Outcome.DUPLICATE):
        return f"{v.outcome.value}({v.k})"
    return v.outcome.value


def predicted_stream(reference: Sequence[int], loss_points: Sequence[int], n: int) -> list[int]:
    """The stream a request shows when it loses one token at each observed index in ``loss_points``.

    ``loss_points`` are positions in the *observed* stream (e.g. the pause
    index of each keep+clear_cache pause the request was preempted at); the
    stream is cut to ``n`` tokens.  With no loss points it is ``reference[:n]``.
    """
    points = sorted(loss_points)
    out: list[int] = []
    r = 0
    for i in range(n):
        while points and points[0] == i:
            points.pop(0)
            r += 1
        if r >= len(reference):
            break
        out.append(reference[r])
        r += 1
    return out


def preempted_at_keep_clear(record: dict[str, Any]) -> list[int]:
    """Observed indices at which vLLM #42043 drops a token from this request.

    One per keep-mode pause with clear_cache=True at which the cache reset
    force-preempted the request, i.e. it was running: the engine's preemption
    count for it went up at that pause.  A request still queued (never
    scheduled, or not yet rescheduled after an earlier pause) is not touched.
    """
    out = []
    seen = 0
    for p in record.get("pauses") or []:
        count = p.get("engine_preemptions")
        if count is None:
            preempted = "PREEMPTED" in str(p.get("engine_status") or "")
        else:
            preempted, seen = count > seen, max(seen, count)
        if preempted and p.get("mode") == "keep" and p.get("clear_cache"):
            out.append(int(p["client_tokens"]))
    return out


def fit_losses(
    reference: Sequence[int], observed: Sequence[int], n: int, points: Sequence[int]
) -> dict[int, int] | None:
    """How many tokens were lost at each point, if ``observed`` is explained by losses at ``points`` only.

    ``points`` may repeat an index (a request preempted by two keep+clear
    pauses with no token delivered in between).  Each distinct index must have
    lost at least one and at most as many tokens as it appears: back-to-back
    preemptions lose one token, or two when no frame was in flight to absorb
    the second discard.  Returns {index: tokens lost} or None.
    """
    import itertools

    counts = Counter(points)
    idx = sorted(counts)
    for combo in itertools.product(*(range(1, counts[i] + 1) for i in idx)):
        drops = [i for i, k in zip(idx, combo, strict=True) for _ in range(k)]
        if list(observed) == predicted_stream(reference, drops, n):
            return dict(zip(idx, combo, strict=True))
    return None
