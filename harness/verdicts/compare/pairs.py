"""Two reports paired cell by cell: each side's verdict, agreement, expected differences across tiers, and the
requests judged differently (the ``Comparison`` that ``render`` shows)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from harness.core.errors import BadInput
from harness.core.records import RequestVerdictRecord, inject_ids
from harness.core.versions import version_key, version_order
from harness.verdicts.known_bugs import KnownBug, check, load_known_bugs
from harness.verdicts.results import CellResult, Results

MAX_TOKEN_ROWS = 10  # first post-resume token rows shown per cell


@dataclass(frozen=True)
class Side:
    """What one report ran on, from its meta and its engines."""

    name: str  # "A" / "B"
    source: str  # the report's path (or any label)
    platform: str
    devices: tuple[str, ...]
    versions: tuple[str, ...]  # vLLM version labels of its cells
    engines: tuple[str, ...]  # "vLLM 0.21.0, torch 2.11.0+cu130, AMD EPYC"
    created: str | None
    host: str | None
    inject: tuple[str, ...]
    cells: int
    tiers: tuple[str, ...] = ("engine",)  # the tiers of its cells
    show_tier: bool = False  # a comparison across tiers names each side's tier

    @property
    def title(self) -> str:
        tier = f", {'/'.join(self.tiers)} tier" if self.show_tier else ""
        return f"{self.name} ({self.platform}{tier})"


@dataclass(frozen=True)
class Verdict:
    """One side's result for one cell."""

    outcome: str
    label: str  # "LOSS(1)", "OK", …
    affected: int | None  # requests that are not OK (None: unknown, the cell has no requests)
    total: int | None
    summary: str
    reason: str | None
    expectation: str  # "as expected (vllm#42043)", "UNEXPECTED (expected LOSS(1))" or ""
    ran: bool  # produced a verdict (not UNSUPPORTED/ERROR/TIMEOUT/BUILD-FAILED)
    # Which requests it affected, as compared across tiers: "none", "every request running at the pause",
    # "some requests" (None: unknown).
    scope: str | None = None

    @property
    def text(self) -> str:
        return self.summary if self.ran or not self.reason else f"{self.outcome}: {self.reason}"


@dataclass(frozen=True)
class FirstToken:
    """A request judged differently by the two sides, with its first post-resume token on each side.

    ``a``/``b``: {"index", "expected", "observed"} (None: the request has none, or is not in that report);
    ``a_label``/``b_label``: the request's verdict there ("LOSS(1 at 12)", "OK", …).
    """

    rid: str
    a: Mapping[str, Any] | None
    b: Mapping[str, Any] | None
    a_label: str | None
    b_label: str | None


@dataclass(frozen=True)
class CellComparison:
    id: str
    a: Verdict
    b: Verdict
    agree: bool
    difference: str  # "" when they agree, else what differs: "outcome LOSS vs OK", …
    context: tuple[str, ...]  # engine facts that differ and may explain it: effective async, executor, …
    first_tokens: tuple[FirstToken, ...]  # requests the sides judged differently (see FirstToken)
    # Across tiers: why the tiers differ here as the known-bug table expects ("" when they agree, or differ
    # unexpectedly).
    expected_difference: str = ""


@dataclass(frozen=True)
class OneSided:
    """A cell that only one side ran (``ran`` is "A" or "B"), or that neither ran (``ran`` is "")."""

    id: str
    ran: str
    a: Verdict | None  # None: not in that report
    b: Verdict | None


@dataclass(frozen=True)
class Comparison:
    a: Side
    b: Side
    both: tuple[CellComparison, ...]
    one_sided: tuple[OneSided, ...]
    neither: tuple[OneSided, ...]
    warnings: tuple[str, ...]
    across_tiers: bool = False  # cells paired by id without the tier segment
    across_doors: bool = False  # cells paired by id without the door segment (engine vs server door)

    @property
    def disagreements(self) -> tuple[CellComparison, ...]:
        """Cells both ran on which the sides differ, other than as the known-bug table expects per tier."""
        return tuple(c for c in self.both if not c.agree and not c.expected_difference)

    @property
    def expected_differences(self) -> tuple[CellComparison, ...]:
        return tuple(c for c in self.both if c.expected_difference)

    @property
    def agreement(self) -> float | None:
        """Percentage of the cells both ran on which the sides agree; None when no cell ran on both."""
        return 100.0 * sum(c.agree for c in self.both) / len(self.both) if self.both else None

    @property
    def exit_code(self) -> int:
        """0 when every cell both ran agrees, or (across tiers) differs as the known-bug table expects, and
        there is at least one; else 1."""
        return 0 if self.both and not self.disagreements else 1

    @property
    def headline(self) -> str:
        if not self.both:
            return f"no cell ran on both sides ({len(self.one_sided)} ran on one side only): nothing to compare"
        n, ok = len(self.both), sum(c.agree for c in self.both)
        text = f"{self.a.title} and {self.b.title} agree on {ok}/{n} cells both ran ({self.agreement:.1f} %)"
        if self.expected_differences:
            text += (f"; {len(self.expected_differences)} differ as the known-bug table expects per tier: "
                     + ", ".join(c.id for c in self.expected_differences))
        if self.disagreements:
            text += f"; {len(self.disagreements)} disagree: " + ", ".join(c.id for c in self.disagreements)
        return text


# --------------------------------------------------------------------------- building

_COUNT = re.compile(r"\b(\d+)/(\d+)\b")


def _expectation(cr: CellResult) -> str:
    return cr.expectation.describe() if cr.expectation else ""


def verdict_of(cr: CellResult) -> Verdict:
    """A cell's verdict as compared: outcome, label and how many requests it affected."""
    outcomes = [r.verdict.outcome if r.verdict else None for r in cr.requests]
    affected: int | None
    total: int | None
    if outcomes and all(o is not None for o in outcomes):
        affected, total = sum(o != "OK" for o in outcomes), len(outcomes)
    else:
        # No per-request verdicts (a report trimmed by hand): the summary says "… in 8/10 requests" / "OK 10/10".
        m = _COUNT.search(cr.summary)
        affected, total = (None, None) if not m else (0 if cr.outcome.value == "OK" else int(m[1]), int(m[2]))
    return Verdict(cr.outcome.value, cr.label, affected, total, cr.summary, cr.reason, _expectation(cr),
                   not cr.outcome.is_infra, _scope(cr, affected))


_RUNNING = re.compile(r"\((\d+)/(\d+) running at pause\)")
EVERY_RUNNING = "every request running at the pause"


def _scope(cr: CellResult, affected: int | None) -> str | None:
    """Which requests a cell's fault hit: none, every request running at the pause (and no other), or some."""
    if affected == 0:
        return "none"
    verdicts = [r.verdict for r in cr.requests if r.verdict is not None]
    if verdicts and len(verdicts) == len(cr.requests):
        hit = [v for v in verdicts if v.outcome != "OK"]
        running = [v for v in verdicts if v.running_at_pause]
        every = bool(running) and all(v.running_at_pause for v in hit) and len(hit) == len(running)
        return EVERY_RUNNING if every else "some requests"
    m = _RUNNING.search(cr.summary)  # a report trimmed by hand: "LOSS(1) in 8/10 requests (8/8 running at pause)"
    if m is None or affected is None:
        return None
    return EVERY_RUNNING if m[1] == m[2] == str(affected) else "some requests"


def _request_verdicts(cr: CellResult) -> dict[str, RequestVerdictRecord]:
    return {req.rid: req.verdict for req in cr.requests if req.verdict is not None and req.rid is not None}


def _judged(v: RequestVerdictRecord | None) -> tuple[Any, ...] | None:
    # What must match for two sides to have judged a request alike.  Token ids and the pause index are left
    # out: the pause triggers when every running request holds its trigger count, so the exact index (and
    # with it the token there) varies from run to run on the same platform.
    if v is None:
        return None
    fpr = v.first_post_resume or {}
    hit = fpr.get("expected") == fpr.get("observed") if fpr else None
    return (v.outcome, v.k, hit)


def _differently_judged(ca: CellResult, cb: CellResult) -> tuple[FirstToken, ...]:
    ra, rb = _request_verdicts(ca), _request_verdicts(cb)
    out = []
    for rid in dict.fromkeys([*ra, *rb]):
        va, vb = ra.get(rid), rb.get(rid)
        if _judged(va) != _judged(vb):
            out.append(FirstToken(rid, va.first_post_resume if va else None, vb.first_post_resume if vb else None,
                                  va.label if va else None, vb.label if vb else None))
    return tuple(out)


def _engine_facts(cr: CellResult) -> dict[str, Any]:
    e = cr.engine
    return {
        "effective async_scheduling": e.effective_async if e else None,
        "executor class": e.executor_class if e else None,
        "requests": len(cr.requests) or None,
        "fault injection": ",".join(e.inject if e else ()) or None,
        "known-bug table": _expectation(cr) or None,
    }


def _difference(a: Verdict, b: Verdict, across_tiers: bool = False) -> str:
    if a.outcome != b.outcome:
        return f"outcome {a.outcome} vs {b.outcome}"
    if a.label != b.label:
        return f"label {a.label} vs {b.label}"
    if across_tiers:
        # The tiers' workloads differ (4 vs 10 requests): which requests were hit is compared, not how many.
        return "" if a.scope == b.scope else f"affected {a.scope or '?'} ({a.summary}) vs {b.scope or '?'} " \
                                              f"({b.summary})"
    if a.affected != b.affected or a.total != b.total:
        def n(v: Verdict) -> str:
            return "?" if v.affected is None else f"{v.affected}/{v.total}"
        return f"affected requests {n(a)} vs {n(b)}"
    return ""


# Facts that differ between the tiers by construction (the scheduler class stands in for the executor class;
# the workloads differ): never listed as what may explain a difference across tiers.
_TIER_FACTS = ("executor class", "requests")


def _compare_cell(ca: CellResult, cb: CellResult, across: tuple[KnownBug, ...] | None = None,
                  doors: bool = False) -> CellComparison:
    """``across``: the known-bug table, when the cells are of two tiers (None: same tier); ``doors``: the cells
    are of two doors (same workload, so requests still pair, by their id within the cell)."""
    a, b = verdict_of(ca), verdict_of(cb)
    diff = _difference(a, b, across is not None)
    fa, fb = _engine_facts(ca), _engine_facts(cb)
    skip = _TIER_FACTS if across is not None else ()
    context = tuple(f"{k}: {_fmt(fa[k])} vs {_fmt(fb[k])}" for k in fa if fa[k] != fb[k] and k not in skip)
    if across is None:
        cid = pair_id(ca, across_tiers=False, across_doors=doors)
        return CellComparison(cid, a, b, not diff, diff, context, _differently_judged(ca, cb))
    # Across tiers the requests are different workloads (their ids name different prompts): none is paired.
    expected = _expected_difference(ca, cb, across) if diff else ""
    return CellComparison(pair_id(ca), a, b, not diff, diff, context, (), expected)


def pair_id(cr: CellResult, across_tiers: bool = True, across_doors: bool = False) -> str:
    """The id a cell is paired by across tiers (its engine-tier id: without ``-sched``) and/or across doors (its
    engine-door id: without ``-server``)."""
    cell = cr.cell.replace(tier="engine") if across_tiers else cr.cell
    return str((cell.replace(door="engine") if across_doors else cell).id)


def _expected_difference(ca: CellResult, cb: CellResult, bugs: tuple[KnownBug, ...]) -> str:
    """Why two tiers differ on a cell, when each shows what the current known-bug table expects for its tier."""
    checks = [check(c, bugs) for c in (ca, cb)]
    if any(ch.status != "as expected" for ch in checks):
        return ""
    said = "; ".join(f"{c.cell.tier} tier {ch.expected.label}" + (f" ({ch.expected.bug})" if ch.expected.bug else "")
                     for c, ch in zip((ca, cb), checks, strict=True))
    ids = {ch.expected.bug for ch in checks if ch.expected.bug}
    windows = [f"{bug.id} is listed for the {_tiers_word(rule.pattern.get('tier'))} on {_window(bug.affected)}"
               + (f": {bug.note}" if bug.note else "") for bug in bugs if bug.id in ids for rule in bug.cells[:1]]
    return f"the known-bug table expects {said}" + (f" ({'; '.join(windows)})" if windows else "")


def _window(spec: Any) -> str:
    """``>=0.17.0, <0.22.0``: a specifier set, lower bounds first."""
    return ", ".join(sorted((str(s) for s in spec), key=lambda s: (not s.startswith(">"), s)))


def _tiers_word(tiers: tuple[Any, ...] | None) -> str:
    return f"{'/'.join(map(str, tiers))} tier" if tiers else "every tier"


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _by_id(results: Results, name: str, across_tiers: bool = False, across_doors: bool = False
           ) -> dict[str, CellResult]:
    out: dict[str, CellResult] = {}
    for c in results.cells:
        key = pair_id(c, across_tiers, across_doors) if across_tiers or across_doors else c.id
        if key in out and (across_tiers or across_doors):
            what = "tier" if across_tiers else "door"
            raise BadInput(f"report {name} holds more than one {what} of cell {key!r}: a comparison across "
                           f"{what}s pairs a report of one {what} with a report of the other")
        if key in out:
            raise BadInput(f"report {name} has more than one result for cell {c.id!r} (a JSONL log of a --repeat "
                           "run?); compare the aggregated results.json")
        out[key] = c
    return out


def doors_of(results: Results) -> tuple[str, ...]:
    """The doors of a report's cells (engine, server), in axis order."""
    found = {c.cell.door for c in results.cells}
    return tuple(d for d in ("engine", "server") if d in found) + tuple(sorted(found - {"engine", "server"}))


def _one_door(results: Results, door: str) -> Results:
    """``results`` with only ``door``'s cells when it holds both doors, else as it is."""
    if len(doors_of(results)) < 2:
        return results
    return replace(results, cells=tuple(c for c in results.cells if c.cell.door == door))


def is_across_doors(a: Results, b: Results) -> bool:
    """Each report holds one door, and they differ (then cells pair by id without the door segment)."""
    da, db = doors_of(a), doors_of(b)
    return len(da) == 1 == len(db) and da != db


def tiers_of(results: Results) -> tuple[str, ...]:
    """The tiers of a report's cells, in axis order."""
    found = {c.cell.tier for c in results.cells}
    return tuple(t for t in ("engine", "scheduler") if t in found) + tuple(sorted(found - {"engine", "scheduler"}))


def is_across_tiers(a: Results, b: Results) -> bool:
    """Each report holds one tier, and they differ (then cells pair by id without the tier segment)."""
    ta, tb = tiers_of(a), tiers_of(b)
    return len(ta) == 1 == len(tb) and ta != tb


def _side(name: str, source: str, results: Results, show_tier: bool = False) -> Side:
    meta = results.meta or {}
    engines = [c.engine for c in results.cells if c.engine and c.engine.vllm_version]
    platform = meta.get("platform") or next((e.platform for e in engines if e.platform), None)
    host = meta.get("host")
    if isinstance(host, dict):
        host = ", ".join(str(host[k]) for k in ("node", "machine") if host.get(k))
    facts = sorted({(str(e.vllm_version), str(e.torch_version), str(e.device_name)) for e in engines},
                   key=lambda t: version_key(t[0]))
    inject = tuple(dict.fromkeys(inject_ids(meta.get("inject")) + tuple(
        i for c in results.cells if c.engine for i in c.engine.inject)))
    return Side(
        name=name, source=source, platform=str(platform or "?"),
        devices=tuple(sorted({str(e.device_name) for e in engines if e.device_name})),
        versions=tuple(version_order(c.cell.version for c in results.cells)),
        engines=tuple(f"vLLM {v}, torch {t}, {d}" for v, t, d in facts),
        created=meta.get("created"), host=str(host) if host else None, inject=inject, cells=len(results.cells),
        tiers=tiers_of(results), show_tier=show_tier,
    )


def _setup(results: Results) -> str:
    """The model and engine arguments of a report (reports before --model ran the bigram-cycle model)."""
    meta = results.meta or {}
    model = meta.get("model")
    model = model if isinstance(model, dict) else {}
    args = meta.get("engine_args") or {}
    shown = ", ".join(f"{k}={v}" for k, v in sorted(args.items())) or "no engine arguments"
    return f"model {model.get('label') or model.get('kind') or 'bigram-cycle'} with {shown}"


def compare(a: Results, b: Results, a_source: str = "A", b_source: str = "B",
            across_tiers: bool | None = None, across_doors: bool | None = None) -> Comparison:
    """Match the cells of two reports by id and say, for every cell both ran, whether they agree.

    ``across_tiers`` pairs cells by id without the tier segment (None: when ``is_across_tiers``);
    ``across_doors`` without the door segment (None: when ``is_across_doors``); a report holding both doors
    then takes part with its engine-door cells as A and its server-door cells as B (``compare R R``).
    """
    across = is_across_tiers(a, b) if across_tiers is None else across_tiers
    doors = is_across_doors(a, b) if across_doors is None else across_doors
    if doors:
        # A report of both doors (a --door all run) gives its engine-door cells as A, its server-door cells as B.
        a, b = _one_door(a, "engine"), _one_door(b, "server")
    ia, ib = _by_id(a, a_source, across, doors), _by_id(b, b_source, across, doors)
    sa, sb = _side("A", a_source, a, across), _side("B", b_source, b, across)
    bugs = load_known_bugs() if across else None
    both, one, neither = [], [], []
    order = {cid: n for n, cid in enumerate(dict.fromkeys([*ia, *ib]))}
    for cid in sorted(order, key=order.__getitem__):
        ca, cb = ia.get(cid), ib.get(cid)
        va, vb = (verdict_of(ca) if ca else None), (verdict_of(cb) if cb else None)
        ran_a, ran_b = bool(va and va.ran), bool(vb and vb.ran)
        if ran_a and ran_b:
            assert ca is not None and cb is not None
            both.append(_compare_cell(ca, cb, bugs, doors))
        elif ran_a or ran_b:
            one.append(OneSided(cid, "A" if ran_a else "B", va, vb))
        else:
            neither.append(OneSided(cid, "", va, vb))
    warnings = []
    if sa.inject != sb.inject:
        def inj(s: Side) -> str:
            return f"fault injection {', '.join(s.inject)}" if s.inject else "no fault injection"
        warnings.append(f"A ran with {inj(sa)}, B with {inj(sb)}: a token fault injected on one side only is a "
                        "difference of the runs, not of the platforms")
    setups = (_setup(a), _setup(b))
    if setups[0] != setups[1]:
        warnings.append(f"A ran {setups[0]}, B {setups[1]}: their differences may be the model's or the engine "
                        "arguments', not the platforms'")
    if not set(ia) & set(ib):
        warnings.append("the reports have no cell id in common (different vLLM versions or selections?)")
    return Comparison(sa, sb, tuple(both), tuple(one), tuple(neither), tuple(warnings), across, doors)


