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

Any other model's reference may repeat itself (random weights fall into
loops), so every verdict is checked for what the streams can prove
(:func:`shift_ambiguity`): a stream that fits two readings at once (no fault
and a lost token, or a lost and a repeated token) is AMBIGUOUS with the
reason, never OK or LOSS.  Such a model's reference is the engine's own
no-pause run, recorded twice with different batching (``reference_repeat``);
when the two differ, the engine's numerics depend on batch composition and
a stream that matches neither is AMBIGUOUS too (:func:`reference_split`).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any


class Outcome(enum.Enum):
    OK = "OK"
    # The streams cannot tell: the reference repeats where a shift would show, or the engine's no-pause
    # reference changes with batch composition.  No verdict either way (SKIP in a bisect, UNKNOWN for a
    # workaround), but not an infrastructure failure: the cell ran.
    AMBIGUOUS = "AMBIGUOUS"
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


_RANK = {o: i for i, o in enumerate((
    Outcome.OK, Outcome.AMBIGUOUS, Outcome.TRUNCATED, Outcome.DUPLICATE, Outcome.LOSS, Outcome.DIVERGED,
    Outcome.CRASH, Outcome.FLAKY, Outcome.UNSUPPORTED, Outcome.BUILD_FAILED, Outcome.ERROR, Outcome.TIMEOUT))}


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


# --------------------------------------------------------------------------- what the streams can prove


def _shifted(reference: Sequence[int], kind: Outcome, j: int, d: int) -> list[int] | None:
    """The reference with ``d`` tokens lost (LOSS) or repeated (DUPLICATE) at index ``j``."""
    ref = list(reference)
    if kind is Outcome.LOSS:
        return ref[:j] + ref[j + d:]
    return ref[:j] + ref[j - d:] if j - d >= 0 else None


def explanations(reference: Sequence[int], observed: Sequence[int], points: Iterable[int],
                 max_shift: int = 8) -> set[str]:
    """Every reading of ``observed`` it fits exactly: "OK", "LOSS(d)", "DUPLICATE(d)" at one of ``points``."""
    obs, n = list(observed), len(observed)
    fits = {"OK"} if list(reference[:n]) == obs and len(reference) >= n else set()
    for j in points:
        for d in range(1, max_shift + 1):
            for kind in (Outcome.LOSS, Outcome.DUPLICATE):
                pred = _shifted(reference, kind, j, d)
                if pred is not None and len(pred) >= n and pred[:n] == obs:
                    fits.add(f"{kind.value}({d})")
    return fits


def shift_ambiguity(reference: Sequence[int], observed: Sequence[int], verdict: StreamVerdict,
                    critical: Sequence[int], max_shift: int = 8) -> str | None:
    """Why ``verdict`` (OK, LOSS or DUPLICATE) is not proven by the streams, or None when it is.

    ``critical``: where a fault would strike (the pause indices of a frozen request, 0 for one submitted
    during or after a pause).  An OK stream proves nothing when a lost or repeated token there would have
    left it unchanged (the reference repeats itself from there on); a LOSS or DUPLICATE proves nothing when
    another shift fits the stream as well (a period-2 loop: losing one token is repeating one).  A shift
    whose index alone is uncertain (inside a run of one token) still proves its kind and size.
    """
    if verdict.outcome not in (Outcome.OK, Outcome.LOSS, Outcome.DUPLICATE):
        return None
    points = {c for c in critical if 0 <= c < len(observed)}
    if verdict.at is not None and verdict.outcome is not Outcome.OK:
        points |= set(range(max(0, verdict.at - max_shift), verdict.at + 1))
    if not points:
        return None
    fits = explanations(reference, observed, sorted(points), max_shift)
    if len(fits) < 2:
        return None
    at = min(points)
    window = " ".join(str(t) for t in reference[max(0, at - 2): at + 6])
    return (f"the stream fits {_readings(fits)} alike: the reference repeats itself from index {at} on "
            f"({window} …), so a shift there cannot be seen")


def _readings(fits: set[str]) -> str:
    """``{"OK", "LOSS(1)", "LOSS(2)", "DUPLICATE(2)"}`` -> ``OK, LOSS(1,2), DUPLICATE(2)``."""
    parts = ["OK"] if "OK" in fits else []
    for kind in (Outcome.LOSS.value, Outcome.DUPLICATE.value):
        sizes = sorted(int(f[len(kind) + 1:-1]) for f in fits if f.startswith(kind + "("))
        if sizes:
            parts.append(f"{kind}({','.join(map(str, sizes))})")
    return ", ".join(parts)


def reference_split(record: dict[str, Any]) -> int | None:
    """The first index where the engine's two no-pause references of this request differ, or None.

    ``reference_repeat`` is recorded (models whose stream is not known in advance) with the requests batched
    as in the paused run; a difference means the engine's tokens depend on batch composition.
    """
    repeat = record.get("reference_repeat")
    if repeat is None:
        return None
    ref = record["reference"]
    return next((i for i, (a, b) in enumerate(zip(ref, repeat, strict=False)) if a != b),
                None if len(ref) == len(repeat) else min(len(ref), len(repeat)))


NONDETERMINISM_HINT = ("the engine's no-pause tokens depend on batch composition (numerical nondeterminism), so a "
                       "stream that matches neither reference proves nothing; on GPUs run with --batch-invariant on "
                       "(VLLM_BATCH_INVARIANT=1), or use a model with wider logit margins")


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RequestVerdict:
    rid: str
    verdict: StreamVerdict
    running_at_pause: bool  # frozen or in flight when the first pause happened
    pause_index: int | None  # tokens received before resume (keep) / before the pause ended
    first_post_resume: dict[str, int | None] | None  # {"index", "expected", "observed"}
    reference_split: int | None = None  # where the two no-pause references differ (nondeterminism)

    @property
    def outcome(self) -> Outcome:
        return self.verdict.outcome

    def to_dict(self) -> dict[str, Any]:
        out = {
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
        if self.reference_split is not None:
            out["reference_split"] = self.reference_split
        return out


def critical_points(record: dict[str, Any]) -> list[int]:
    """Where a pause fault would strike this request: its index at each keep pause that froze it, or 0 when
    it was submitted during or after a pause (its first token is post-resume)."""
    frozen = [int(p["client_tokens"]) for p in record.get("pauses") or [] if p.get("frozen")]
    if frozen:
        return frozen
    return [0] if record.get("submit") not in ("start", None) else []


def _stream_verdict(record: dict[str, Any], reference: Sequence[int], points: Sequence[int]) -> StreamVerdict:
    obs = record["observed"]
    aborted = any(p.get("mode") == "abort" for p in record.get("pauses") or [])
    v = classify_stream(reference, obs, expected_len=record["max_tokens"], prefix_ok=aborted)
    short = len(obs) < record["max_tokens"]
    if v.outcome is Outcome.OK and aborted and short and record.get("finish_reason") != "abort":
        return StreamVerdict(Outcome.TRUNCATED, len(obs),
                             detail=f"ended with finish_reason {record.get('finish_reason')!r}, not 'abort'")
    why = shift_ambiguity(reference, obs, v, points)
    return StreamVerdict(Outcome.AMBIGUOUS, v.at, detail=why) if why else v


def _judge(record: dict[str, Any], points: Sequence[int], split: int | None) -> StreamVerdict:
    """The stream's verdict against its reference, or against both when the engine's two references differ."""
    first = _stream_verdict(record, record["reference"], points)
    if split is None:
        return first
    second = _stream_verdict(record, record["reference_repeat"], points)
    ok = next((v for v in (first, second) if v.outcome is Outcome.OK), None)
    if ok is not None:
        return ok  # the stream is one of the engine's own no-pause runs
    if first.label == second.label and first.outcome is not Outcome.DIVERGED:
        return first
    return StreamVerdict(Outcome.AMBIGUOUS, first.at, detail=(
        f"{first.label} against the reference, {second.label} against the one batched as the paused run "
        f"(they differ from index {split}): {NONDETERMINISM_HINT}"))


def classify_request(record: dict[str, Any]) -> RequestVerdict:
    """Judge one request record written by ``repro.cell``."""
    ref, obs = record["reference"], record["observed"]
    pauses = record.get("pauses") or []
    pause_index = pauses[0]["client_tokens"] if pauses else None
    points = critical_points(record)
    fpr: dict[str, int | None] | None = None
    if points:
        fpr = {"index": points[0], "expected": _at(ref, points[0]), "observed": _at(obs, points[0])}
    split = reference_split(record)
    if record.get("error"):
        v = StreamVerdict(Outcome.ERROR, detail=str(record["error"]))
    else:
        v = _judge(record, points, split)
    return RequestVerdict(record["rid"], v, bool(pauses), pause_index, fpr, split)


def _at(seq: Sequence[int], i: int) -> int | None:
    return seq[i] if 0 <= i < len(seq) else None


# --------------------------------------------------------------------------- cells


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


def _doubt(r: RequestVerdict) -> RequestVerdict:
    """A DIVERGED request of an engine found nondeterministic: AMBIGUOUS (numerics, not the scheduler, may
    explain it); an exact shift stays what it is."""
    if r.outcome is not Outcome.DIVERGED:
        return r
    v = StreamVerdict(Outcome.AMBIGUOUS, r.verdict.at, detail=f"{r.verdict.label}: {NONDETERMINISM_HINT}")
    return replace(r, verdict=v)


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
    splits = [r for r in reqs if r.reference_split is not None]
    if splits:
        reqs = tuple(_doubt(r) for r in reqs)
    worst = max(reqs, key=lambda r: r.outcome.rank)
    counts = Counter(_short(r.verdict) for r in reqs)
    if worst.outcome is Outcome.OK:
        return CellVerdict(Outcome.OK, f"OK {len(reqs)}/{len(reqs)}", dict(sorted(counts.items())), reqs)
    label, summary = _fault_summary(reqs, worst.outcome)
    reason = None
    if worst.outcome is Outcome.ERROR:
        bad = [r for r in reqs if r.outcome is Outcome.ERROR]
        reason = f"{len(bad)} request(s) failed; first: {worst.rid}: {worst.verdict.detail}"
    elif worst.outcome is Outcome.AMBIGUOUS:
        reason = f"{worst.rid}: {worst.verdict.detail}"
    if splits:
        reason = (f"{reason}; " if reason else "") + (
            f"the no-pause references of {len(splits)}/{len(reqs)} requests differ between batch compositions "
            f"(first at index {min(r.reference_split or 0 for r in splits)}): {NONDETERMINISM_HINT}")
    return CellVerdict(worst.outcome, summary, dict(sorted(counts.items())), reqs, reason, label)


def _fault_summary(reqs: tuple[RequestVerdict, ...], outcome: Outcome) -> tuple[str, str]:
    """(label, summary) of a cell whose worst request outcome is ``outcome``: "LOSS(1)", "LOSS(1) in 8/10 requests
    (8/8 running at pause)"; one label per distinct size, so the count always matches the label."""
    bad = [r for r in reqs if r.outcome is outcome]
    running = [r for r in reqs if r.running_at_pause]
    ks = sorted({r.verdict.k for r in bad if r.verdict.k is not None})
    label = outcome.value + (f"({','.join(map(str, ks))})" if ks else "")
    summary = f"{label} in {len(bad)}/{len(reqs)} requests"
    if running:
        summary += f" ({len([r for r in bad if r.running_at_pause])}/{len(running)} running at pause)"
    ambiguous = sum(r.outcome is Outcome.AMBIGUOUS for r in reqs)
    if ambiguous and outcome is not Outcome.AMBIGUOUS:
        summary += f"; {ambiguous} AMBIGUOUS"
    return label, summary


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
