"""Compare two results reports cell by cell (the CPU tier against the GPU tier, or any two runs).

A cell *ran* on a side when it produced a verdict there (anything but UNSUPPORTED, ERROR, TIMEOUT or
BUILD-FAILED).  Two sides *agree* on a cell both ran when the outcome, the outcome label (``LOSS(1)`` is not
``LOSS(2)``) and the number of affected requests are the same.  Everything else (cells one side ran, cells
neither ran) is listed with the other side's outcome and reason, never counted as agreement.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.core.outcomes import style
from harness.core.records import RequestVerdictRecord, inject_ids
from harness.core.versions import version_key, version_order
from harness.errors import BadInput
from harness.results import CellResult, Results

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

    @property
    def title(self) -> str:
        return f"{self.name} ({self.platform})"


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

    @property
    def disagreements(self) -> tuple[CellComparison, ...]:
        return tuple(c for c in self.both if not c.agree)

    @property
    def agreement(self) -> float | None:
        """Percentage of the cells both ran on which the sides agree; None when no cell ran on both."""
        return 100.0 * sum(c.agree for c in self.both) / len(self.both) if self.both else None

    @property
    def exit_code(self) -> int:
        """0 when every cell both ran agrees (and there is at least one), else 1."""
        return 0 if self.both and not self.disagreements else 1

    @property
    def headline(self) -> str:
        if not self.both:
            return f"no cell ran on both sides ({len(self.one_sided)} ran on one side only): nothing to compare"
        n, ok = len(self.both), len(self.both) - len(self.disagreements)
        text = f"{self.a.title} and {self.b.title} agree on {ok}/{n} cells both ran ({self.agreement:.1f} %)"
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
    if outcomes and all(o is not None for o in outcomes):
        affected, total = sum(o != "OK" for o in outcomes), len(outcomes)
    else:
        # No per-request verdicts (a report trimmed by hand): the summary says "… in 8/10 requests" / "OK 10/10".
        m = _COUNT.search(cr.summary)
        affected, total = (None, None) if not m else (0 if cr.outcome.value == "OK" else int(m[1]), int(m[2]))
    return Verdict(cr.outcome.value, cr.label, affected, total, cr.summary, cr.reason, _expectation(cr),
                   not cr.outcome.is_infra)


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


def _difference(a: Verdict, b: Verdict) -> str:
    if a.outcome != b.outcome:
        return f"outcome {a.outcome} vs {b.outcome}"
    if a.label != b.label:
        return f"label {a.label} vs {b.label}"
    if a.affected != b.affected or a.total != b.total:
        def n(v: Verdict) -> str:
            return "?" if v.affected is None else f"{v.affected}/{v.total}"
        return f"affected requests {n(a)} vs {n(b)}"
    return ""


def _compare_cell(ca: CellResult, cb: CellResult) -> CellComparison:
    a, b = verdict_of(ca), verdict_of(cb)
    diff = _difference(a, b)
    fa, fb = _engine_facts(ca), _engine_facts(cb)
    context = tuple(f"{k}: {_fmt(fa[k])} vs {_fmt(fb[k])}" for k in fa if fa[k] != fb[k])
    return CellComparison(ca.id, a, b, not diff, diff, context, _differently_judged(ca, cb))


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _by_id(results: Results, name: str) -> dict[str, CellResult]:
    out: dict[str, CellResult] = {}
    for c in results.cells:
        if c.id in out:
            raise BadInput(f"report {name} has more than one result for cell {c.id!r} (a JSONL log of a --repeat "
                           "run?); compare the aggregated results.json")
        out[c.id] = c
    return out


def _side(name: str, source: str, results: Results) -> Side:
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
    )


def _setup(results: Results) -> str:
    """The model and engine arguments of a report (reports before --model ran the bigram-cycle model)."""
    meta = results.meta or {}
    model = meta.get("model") if isinstance(meta.get("model"), dict) else {}
    args = meta.get("engine_args") or {}
    shown = ", ".join(f"{k}={v}" for k, v in sorted(args.items())) or "no engine arguments"
    return f"model {model.get('label') or model.get('kind') or 'bigram-cycle'} with {shown}"


def compare(a: Results, b: Results, a_source: str = "A", b_source: str = "B") -> Comparison:
    """Match the cells of two reports by id and say, for every cell both ran, whether they agree."""
    ia, ib = _by_id(a, a_source), _by_id(b, b_source)
    sa, sb = _side("A", a_source, a), _side("B", b_source, b)
    both, one, neither = [], [], []
    order = {cid: n for n, cid in enumerate(dict.fromkeys([*ia, *ib]))}
    for cid in sorted(order, key=order.__getitem__):
        ca, cb = ia.get(cid), ib.get(cid)
        va, vb = (verdict_of(ca) if ca else None), (verdict_of(cb) if cb else None)
        ran_a, ran_b = bool(va and va.ran), bool(vb and vb.ran)
        if ran_a and ran_b:
            assert ca is not None and cb is not None
            both.append(_compare_cell(ca, cb))
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
    return Comparison(sa, sb, tuple(both), tuple(one), tuple(neither), tuple(warnings))


# --------------------------------------------------------------------------- rendering


def _md(value: Any) -> str:
    return " ".join(str(value).split("\n")).replace("|", "\\|")


def _row(values: Sequence[Any]) -> str:
    return "| " + " | ".join(_md(v) for v in values) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return [_row(header), "|" + "|".join("---" for _ in header) + "|", *(_row(r) for r in rows)]


def _tok(fpr: Mapping[str, Any] | None, label: str | None = None) -> str:
    verdict = f"{label}: " if label else ""
    if not fpr:
        return f"{verdict}—" if label else "not in report"
    mark = "" if fpr.get("expected") == fpr.get("observed") else " ✗"
    return f"{verdict}[{fpr.get('index')}] expected {fpr.get('expected')}, observed {fpr.get('observed')}{mark}"


def _verdict_text(v: Verdict | None) -> str:
    return "not in report" if v is None else v.text


def _token_lines(c: CellComparison, a: Side, b: Side) -> list[str]:
    if not c.first_tokens:
        return []
    rows = [[t.rid, _tok(t.a, t.a_label), _tok(t.b, t.b_label)] for t in c.first_tokens[:MAX_TOKEN_ROWS]]
    lines = ["", "Requests judged differently, with the first post-resume token ([index] expected, observed; "
             "✗ = not the no-pause reference token):", "", *_table(["request", a.title, b.title], rows)]
    if len(c.first_tokens) > MAX_TOKEN_ROWS:
        lines.append(f"\n… and {len(c.first_tokens) - MAX_TOKEN_ROWS} more requests")
    return lines


def markdown(cmp: Comparison) -> str:
    """A committable Markdown comparison: both sides' platforms, the agreement, and every cell."""
    a, b = cmp.a, cmp.b
    lines = [f"# vllm-repro: {a.platform} vs {b.platform} comparison", ""]
    lines += _table(["", a.title, b.title], [
        ["report", a.source, b.source],
        ["platform", a.platform, b.platform],
        ["device", ", ".join(a.devices) or "—", ", ".join(b.devices) or "—"],
        ["host", a.host or "—", b.host or "—"],
        ["created", a.created or "—", b.created or "—"],
        ["vLLM versions", ", ".join(a.versions), ", ".join(b.versions)],
        ["engines", "; ".join(a.engines) or "—", "; ".join(b.engines) or "—"],
        ["fault injection", ", ".join(a.inject) or "none", ", ".join(b.inject) or "none"],
        ["cells", a.cells, b.cells],
    ])
    lines += ["", f"**{cmp.headline}.**", ""]
    lines += [f"> warning: {w}" for w in cmp.warnings]
    if cmp.warnings:
        lines.append("")
    if cmp.both:
        lines += ["## Cells both ran", ""]
        lines += _table(["cell", a.title, b.title, "agree"], [
            [f"`{c.id}`", c.a.summary, c.b.summary, "yes" if c.agree else f"**NO**: {c.difference}"]
            for c in cmp.both])
        lines.append("")
    if cmp.disagreements:
        lines += ["## Disagreements", ""]
        for c in cmp.disagreements:
            lines += [f"### `{c.id}`", "", f"- {a.title}: {c.a.summary}" + (f" — {c.a.expectation}"
                                                                              if c.a.expectation else ""),
                      f"- {b.title}: {c.b.summary}" + (f" — {c.b.expectation}" if c.b.expectation else ""),
                      f"- differs in: {c.difference}"]
            lines += [f"- {x}" for x in c.context] or ["- no engine fact differs (effective async, executor "
                                                       "class, requests, injection, known-bug status)"]
            lines += _token_lines(c, a, b)
            lines.append("")
    quiet = [c for c in cmp.both if c.agree and c.first_tokens]
    if quiet:
        # Same label and count, but not the same requests affected: agreement as defined, worth a look.
        lines += ["## Agreeing cells with requests judged differently", ""]
        for c in quiet:
            lines += [f"### `{c.id}`", *_token_lines(c, a, b)[1:], ""]
    if cmp.one_sided:
        lines += ["## Cells only one side ran", ""]
        lines += _table(["cell", "ran on", a.title, b.title], [
            [f"`{o.id}`", o.ran, _verdict_text(o.a), _verdict_text(o.b)] for o in cmp.one_sided])
        lines.append("")
    if cmp.neither:
        lines += ["## Cells neither side ran", ""]
        groups: dict[tuple[str, str], list[str]] = {}
        for o in cmp.neither:
            groups.setdefault((_verdict_text(o.a), _verdict_text(o.b)), []).append(o.id)
        lines += _table(["cells", a.title, b.title], [
            [f"{len(ids)}: " + ", ".join(f"`{i}`" for i in ids[:4]) + (", …" if len(ids) > 4 else ""), ta, tb]
            for (ta, tb), ids in groups.items()])
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def terminal_table(cmp: Comparison) -> Table:
    """A rich table of every cell at least one side ran, with the agreement."""
    table = Table(title=f"vllm-repro compare: A = {cmp.a.source} ({cmp.a.platform}), "
                        f"B = {cmp.b.source} ({cmp.b.platform})")
    for name, kw in (("cell", {"no_wrap": True}), (cmp.a.title, {}), (cmp.b.title, {}), ("agree", {})):
        table.add_column(name, **kw)  # type: ignore[arg-type]

    def cell(v: Verdict | None) -> Text:
        if v is None:
            return Text("not in report", style="dim")
        return Text(v.label if v.ran else v.text, style=style(v.outcome))

    for c in cmp.both:
        table.add_row(Text(c.id), cell(c.a), cell(c.b),
                      Text("yes", style="green") if c.agree else Text(f"NO: {c.difference}", style="bold red"))
    for o in cmp.one_sided:
        table.add_row(Text(o.id), cell(o.a), cell(o.b), Text(f"only {o.ran} ran", style="yellow"))
    return table


def render_terminal(cmp: Comparison, console: Console) -> None:
    """Print the table, the headline, warnings, and the explanation of every disagreement."""
    console.print(terminal_table(cmp))
    if cmp.neither:
        console.print(Text(f"{len(cmp.neither)} cell(s) ran on neither side (UNSUPPORTED/ERROR/…); see the "
                           "Markdown for their reasons", style="dim"))
    for w in cmp.warnings:
        console.print(Text(f"warning: {w}", style="yellow"))
    for c in cmp.disagreements:
        console.print(Text(f"{c.id}: {c.difference}", style="bold red"))
        for x in c.context:
            console.print(Text(f"  {x}"))
        for t in c.first_tokens[:MAX_TOKEN_ROWS]:
            console.print(Text(f"  {t.rid}: A {_tok(t.a, t.a_label)} | B {_tok(t.b, t.b_label)}"))
    console.print(Text(cmp.headline, style="green" if cmp.exit_code == 0 else "bold red"))
