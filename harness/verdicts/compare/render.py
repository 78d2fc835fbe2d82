"""A comparison as committable Markdown and as a terminal table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.core.outcome_groups import style
from harness.verdicts.compare.pairs import MAX_TOKEN_ROWS, CellComparison, Comparison, Side, Verdict
from harness.verdicts.mdtable import md_table


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
             "✗ = not the no-pause reference token):", "", *md_table(["request", a.title, b.title], rows)]
    if len(c.first_tokens) > MAX_TOKEN_ROWS:
        lines.append(f"\n… and {len(c.first_tokens) - MAX_TOKEN_ROWS} more requests")
    return lines


ACROSS_TIERS_NOTE = (
    "Cells are paired across tiers: a scheduler-tier id is the engine-tier id plus `-sched`. The tiers run "
    "different workloads (scheduler tier: 4 requests, all running at the reset; engine tier: 10 requests, 8 "
    "running at the pause), so two cells agree when outcome, label and the requests hit (none, every request "
    "running at the pause, or some) are the same; counts are not compared. A pair that differs while each tier "
    "shows what the known-bug table expects for it is an expected difference (the table's windows per tier say "
    "why) and does not fail the comparison.")


def _md_head(cmp: Comparison) -> list[str]:
    a, b = cmp.a, cmp.b
    if cmp.across_tiers:
        title = f"# vllm-repro: {'/'.join(a.tiers)} tier vs {'/'.join(b.tiers)} tier comparison"
        return [title, "", ACROSS_TIERS_NOTE, ""]
    if cmp.across_doors:
        return [f"# vllm-repro: engine door vs server door comparison ({a.platform})", "",
                "Cells are paired by id without the door segment (`-server`): the same scenario, played on "
                "`AsyncLLM` in-process (engine door) and over `vllm serve`'s HTTP API (server door).", ""]
    return [f"# vllm-repro: {a.platform} vs {b.platform} comparison", ""]


def _agree_word(c: CellComparison) -> str:
    if c.agree:
        return "yes"
    return f"expected difference: {c.expected_difference}" if c.expected_difference else f"**NO**: {c.difference}"


def markdown(cmp: Comparison) -> str:
    """A committable Markdown comparison: both sides' platforms, the agreement, and every cell."""
    a, b = cmp.a, cmp.b
    lines = _md_head(cmp)
    lines += md_table(["", a.title, b.title], [
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
        lines += md_table(["cell", a.title, b.title, "agree"], [
            [f"`{c.id}`", c.a.summary, c.b.summary, _agree_word(c)] for c in cmp.both])
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
        lines += md_table(["cell", "ran on", a.title, b.title], [
            [f"`{o.id}`", o.ran, _verdict_text(o.a), _verdict_text(o.b)] for o in cmp.one_sided])
        lines.append("")
    if cmp.neither:
        lines += ["## Cells neither side ran", ""]
        groups: dict[tuple[str, str], list[str]] = {}
        for o in cmp.neither:
            groups.setdefault((_verdict_text(o.a), _verdict_text(o.b)), []).append(o.id)
        lines += md_table(["cells", a.title, b.title], [
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
        word = (Text("yes", style="green") if c.agree else Text("expected difference", style="yellow")
                if c.expected_difference else Text(f"NO: {c.difference}", style="bold red"))
        table.add_row(Text(c.id), cell(c.a), cell(c.b), word)
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
    for c in cmp.expected_differences:
        console.print(Text(f"{c.id}: {c.difference}; {c.expected_difference}", style="yellow"))
    for c in cmp.disagreements:
        console.print(Text(f"{c.id}: {c.difference}", style="bold red"))
        for x in c.context:
            console.print(Text(f"  {x}"))
        for t in c.first_tokens[:MAX_TOKEN_ROWS]:
            console.print(Text(f"  {t.rid}: A {_tok(t.a, t.a_label)} | B {_tok(t.b, t.b_label)}"))
    console.print(Text(cmp.headline, style="green" if cmp.exit_code == 0 else "bold red"))
