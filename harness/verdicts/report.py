"""Reports rendered from results: workaround verdicts, Markdown, JUnit XML and a terminal table.

Everything here is a pure function of a ``Results`` (or a sequence of
``CellResult``) except ``write_reports``, which writes the three report files
atomically.  The workaround judged is the upstream advice for vLLM #42043:
run with ``async_scheduling=False``.  The cells that demonstrate the bug are
keep-mode pauses with ``clear_cache=True``; per vLLM version the async-on and
async-off cells of one executor are compared.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.core.axes import SORT_ORDER
from harness.core.oracle import Outcome
from harness.core.records import RequestRecord, RequestVerdictRecord
from harness.core.scenarios import pauses
from harness.core.versions import version_key
from harness.verdicts.results import CellResult, Results
from harness.verdicts.workarounds import STATUS_STYLES, workaround_verdicts

ISSUE = "vllm#42043"
WORKAROUND = "async_scheduling=False"
INFRA = tuple(o for o in Outcome if o.is_infra)
WINDOW = 3  # tokens shown on each side of the pause index

OUTCOME_STYLES = {
    Outcome.OK: "green",
    Outcome.AMBIGUOUS: "yellow",
    Outcome.LOSS: "bold red",
    Outcome.DUPLICATE: "bold red",
    Outcome.DIVERGED: "bold red",
    Outcome.TRUNCATED: "red",
    Outcome.CRASH: "bold red",
    Outcome.UNSUPPORTED: "dim yellow",
    Outcome.ERROR: "magenta",
    Outcome.TIMEOUT: "magenta",
    Outcome.BUILD_FAILED: "magenta",
    Outcome.FLAKY: "bold magenta",
}




@dataclass(frozen=True)
class ReportPaths:
    json: Path
    markdown: Path
    junit: Path


CellsLike = Results | Sequence[CellResult]

# --------------------------------------------------------------------------- helpers

def _cells(cells: CellsLike) -> tuple[CellResult, ...]:
    return tuple(cells.cells) if isinstance(cells, Results) else tuple(cells)


# Report order is Cell.sort_key without the scenario: the scenarios of one config keep the order they ran in
# (as every committed report shows them).
_UNSORTED = tuple(i for i, a in enumerate(SORT_ORDER) if a.name == "scenario")


def _cell_key(cr: CellResult) -> tuple[Any, ...]:
    return tuple(rank for i, rank in enumerate(cr.cell.sort_key) if i not in _UNSORTED)


def _sorted(cells: Iterable[CellResult]) -> list[CellResult]:
    return sorted(cells, key=_cell_key)


def _on_off(flag: bool | None) -> str:
    return "?" if flag is None else ("on" if flag else "off")


def _effective(cr: CellResult) -> tuple[str, str]:
    # (effective async, executor class) for display; '' when the engine never reported.
    if cr.engine is None or not isinstance(cr.engine.get("effective"), dict):
        return "", ""
    a = cr.engine.effective_async
    shown = _on_off(a)
    if a is not None and a != cr.cell.async_on:
        shown += f" (asked {_on_off(cr.cell.async_on)})"
    return shown, str(cr.engine.executor_class or "?")


def _detail(cr: CellResult) -> str:
    # The summary, plus the reason when the summary does not already say it, plus the attempts of a retried cell.
    text = f"{cr.summary}: {cr.reason}" if cr.reason and cr.reason not in cr.summary else cr.summary
    return f"{text} {_attempts_note(cr)}" if cr.attempts else text


def _attempts_note(cr: CellResult) -> str:
    # "[attempts: 1 ERROR, 2 OK]": a cell --retry-infra ran again.
    return "[attempts: " + ", ".join(f"{a.n} {a.label or a.outcome}" for a in cr.attempts) + "]"


def _attempt_rows(cells: Sequence[CellResult]) -> list[list[Any]]:
    return [[f"`{cr.id}`", a.n, a.label or a.outcome, a.reason or a.summary,
             "" if a.elapsed_s is None else f"{a.elapsed_s:.1f}", a.engine_dir or ""]
            for cr in cells for a in cr.attempts]


_NO_VERDICT = RequestVerdictRecord(None)


def _verdict(req: RequestRecord) -> RequestVerdictRecord:
    return req.verdict or _NO_VERDICT


def _faulty(req: RequestRecord) -> bool:
    return _verdict(req).outcome not in (None, Outcome.OK.value)


def _label(v: RequestVerdictRecord) -> str:
    return "?" if v.label is None else v.label


def _first_post_resume(req: RequestRecord) -> str:
    fpr = _verdict(req).first_post_resume
    if fpr is None:
        return "—"
    exp, obs = fpr.get("expected"), fpr.get("observed")
    mark = "" if exp == obs else " ✗"
    return f"#{fpr.get('index')}: expected {_tok(exp)}, observed {_tok(obs)}{mark}"


def _rid(req: RequestRecord) -> str:
    return "?" if req.rid is None else req.rid


def _tok(t: Any) -> str:
    return "none" if t is None else str(t)


def _center(req: RequestRecord) -> int | None:
    # Windows centre on the first post-resume token, else the pause, else the fault.
    v = _verdict(req)
    fpr = v.first_post_resume
    if fpr is not None and isinstance(fpr.get("index"), int):
        return int(fpr["index"])
    return next((i for i in (v.pause_index, v.at) if isinstance(i, int)), None)


def _window(tokens: Sequence[Any] | None, center: int | None, width: int = WINDOW) -> str:
    # "… 4 5 6 [7] 8 9 10 …": tokens around ``center``, the centre bracketed.
    if tokens is None or center is None:
        return "—"
    lo, hi = max(0, center - width), min(len(tokens), center + width + 1)
    parts = [f"[{tokens[i]}]" if i == center else str(tokens[i]) for i in range(lo, hi)]
    if center >= len(tokens):
        parts.append(f"[end at {len(tokens)}]")
    out = " ".join(parts)
    if lo > 0:
        out = "… " + out
    if hi < len(tokens):
        out += " …"
    return out


# --------------------------------------------------------------------------- workaround verdicts


def _paragraph_parts(cells: CellsLike) -> list[tuple[str, str | None]]:
    # The verdict paragraph as (text, rich style) segments.
    verdicts = workaround_verdicts(_cells(cells))
    parts: list[tuple[str, str | None]] = [(f"{WORKAROUND} workaround for {ISSUE}: ", None)]
    if not verdicts:
        parts.append(("no cells to judge.", None))
        return parts
    for i, v in enumerate(verdicts):
        if i:
            parts.append((", ", None))
        parts.append((v.status.value, STATUS_STYLES[v.status]))
        parts.append((f" on {v.version} ({v.evidence})", None))
    parts.append((".", None))
    return parts


def verdict_paragraph(cells: CellsLike) -> str:
    """One paragraph: the workaround's status on every vLLM version, with the evidence."""
    return "".join(text for text, _ in _paragraph_parts(cells))


# --------------------------------------------------------------------------- Markdown


def _md(value: Any) -> str:
    # A Markdown table cell: pipes escaped, newlines flattened.
    return " ".join(str(value).split("\n")).replace("|", "\\|")


def _md_row(values: Iterable[Any]) -> str:
    return "| " + " | ".join(_md(v) for v in values) + " |"


def _md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    return [_md_row(header), "|" + "|".join("---" for _ in header) + "|", *(_md_row(r) for r in rows)]


def injection_banner(results: Results) -> str | None:
    """The warning every report of a fault-injection run carries (None for a normal run)."""
    inject = list((results.meta or {}).get("inject") or [])
    # Also from the cells: a results.jsonl has no meta, and merged reports may mix runs.
    for cr in results.cells:
        probe = cr.engine.probe if cr.engine else {}
        requested = ((probe.get("core") or {}).get("inject") or {}).get("requested") or []
        bug = str((cr.expectation.bug if cr.expectation else None) or "")
        found = list(requested) + ([bug.removesuffix(" (injected)")] if bug.endswith(" (injected)") else [])
        inject += [f for f in found if f not in inject]
    if not inject:
        return None
    return (f"FAULT INJECTED on purpose: {', '.join(inject)}. This run re-introduced the fault into vLLM at run "
            "time (vllm-repro --inject); its token losses and workaround verdicts describe the self-test, "
            "not upstream vLLM.")


def _meta_lines(results: Results) -> list[str]:
    meta = results.meta or {}
    lines = []
    if (meta.get("repeat") or 1) > 1:
        lines.append(f"- repeat: every cell ran {meta['repeat']} times on its engine; FLAKY = runs disagree")
    if meta.get("retry_infra"):
        lines.append(f"- retry-infra: a cell that came out ERROR or TIMEOUT ran again on a fresh engine, up to "
                     f"{meta['retry_infra']} more times (every attempt under Retried cells)")
    for key in ("created", "platform", "host", "versions", "device", "driver", "note", "rejudged"):
        value = meta.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, list | tuple):
            value = ", ".join(str(v) for v in value)
        lines.append(f"- {key}: {value}")
    lines += setup_lines(meta)
    engines = sorted({(str(e.vllm_version), str(e.torch_version), str(e.device_name))
                      for e in (c.engine for c in results.cells) if e and e.vllm_version},
                     key=lambda t: version_key(t[0]))
    for vllm, torch, device in engines:
        lines.append(f"- engine: vLLM {vllm}, torch {torch}, device {device}")
    lines += _env_lines(meta.get("envs"))
    lines.append(f"- cells: {len(results.cells)}")
    return lines


def setup_lines(meta: dict[str, Any]) -> list[str]:
    """The model, engine arguments and preset of the run (absent from reports written before they existed)."""
    lines = []
    model = meta.get("model")
    if isinstance(model, dict):
        params = model.get("params") or {}
        shown = ", ".join(f"{k}={v}" for k, v in params.items() if k not in ("path", "name"))
        lines.append(f"- model: {model.get('label') or model.get('kind')}" + (f" ({shown})" if shown else ""))
    if meta.get("preset"):
        lines.append(f"- preset: {meta['preset']}")
    if "engine_args" in meta:
        args = meta.get("engine_args") or {}
        lines.append("- engine args: " + (", ".join(f"{k}={json.dumps(v)}" for k, v in args.items())
                                          or "none beyond the harness's defaults"))
    return lines


def _env_lines(envs: Any) -> list[str]:
    """One line per version whose env is not its platform's plain build: a CUDA build on a CPU torch
    (harness.envbuild.cputorch) says so, with the torch vLLM pins and what was left out."""
    lines = []
    for version, env in (envs or {}).items() if isinstance(envs, dict) else ():
        if isinstance(env, dict) and env.get("left_out"):
            lines.append(f"- env {version}: package {env.get('package')} (a CUDA build) on torch "
                         f"{env.get('torch_version')} (vLLM pins torch {env.get('torch_pinned')}), "
                         f"{len(env['left_out'])} CUDA packages left out")
    return lines


def _cell_row(cr: CellResult) -> list[Any]:
    c = cr.cell
    eff_async, eff_exec = _effective(cr)
    axes = "".join(f" {s}" for s in c.variant)
    # A scenario that never pauses carries the default mode and clear_cache without playing them.
    mode, clear = (c.mode, str(c.clear_cache).lower()) if pauses(c.scenario) else ("-", "-")
    return [f"`{cr.id}`", c.version, c.executor + axes, _on_off(c.async_on), mode, clear,
            f"**{cr.outcome.value}**" if cr.outcome is not Outcome.OK else cr.outcome.value, _detail(cr),
            _expectation(cr, markdown=True), eff_async, eff_exec]


def _expectation(cr: CellResult, markdown: bool = False) -> str:
    # "as expected" / "UNEXPECTED (expected LOSS(1) from vllm#42043)" from the known-bug table.
    text = cr.expectation.describe() if cr.expectation else ""
    return f"**{text}**" if markdown and text.startswith("UNEXPECTED") else text


def _details(cr: CellResult) -> list[str]:
    lines = [f"### `{cr.id}`", "", cr.summary]
    if cr.counts:
        lines[-1] += " — " + ", ".join(f"{k}: {n}" for k, n in cr.counts.items())
    lines.append("")
    if not cr.requests:  # a CRASH: the reason names vLLM's frame; the engine's log has the traceback
        return lines
    rows = []
    for req in cr.requests:
        v = _verdict(req)
        center = _center(req)
        submit = req.submit
        rows.append([
            _rid(req),
            "/".join(str(s) for s in submit) if isinstance(submit, list) else submit,
            _label(v),
            _tok(v.pause_index),
            _first_post_resume(req),
            _window(req.observed, center),
            _window(req.reference, center),
        ])
    header = ["request", "submit", "verdict", "pause index", "first post-resume token", "observed",
              "reference"]
    lines += _md_table(header, rows)
    lines.append("")
    return lines


def markdown(results: Results) -> str:
    """The Markdown report: meta, workaround verdict, one table row per cell, token-fault details."""
    cells = _sorted(results.cells)
    lines = [f"# vllm-repro: {ISSUE} (first token after a keep-mode pause)", ""]
    banner = injection_banner(results)
    if banner:
        lines += [f"> **{banner}**", ""]
    lines += _meta_lines(results)
    lines += ["", "## Workaround verdict", "", verdict_paragraph(cells), "", "## Cells", ""]
    header = ["cell", "vLLM", "executor", "async", "mode", "clear_cache", "outcome", "summary / reason",
              "known bugs", "effective async", "executor class"]
    lines += _md_table(header, (_cell_row(c) for c in cells))
    retried = [c for c in cells if c.attempts]
    if retried:
        lines += ["", "## Retried cells", "",
                  "Infrastructure failures (ERROR, TIMEOUT) ran again on a fresh engine (--retry-infra); the "
                  "cell's outcome is its last attempt's.", ""]
        lines += _md_table(["cell", "attempt", "outcome", "summary / reason", "seconds to result", "engine files"],
                           _attempt_rows(retried))
    faulty = [c for c in cells if c.outcome.is_finding or c.outcome is Outcome.FLAKY]
    if faulty:
        lines += ["", "## Token faults", "",
                  "Token windows are centred on the first post-resume token (bracketed), else the pause.", ""]
        for cr in faulty:
            lines += _details(cr)
    return "\n".join(lines).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- JUnit XML

_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _x(value: Any) -> str:
    # Text safe for XML 1.0: control characters dropped.
    return _XML_BAD.sub("", str(value))


def _fault_lines(cr: CellResult) -> list[str]:
    return request_lines(cr, only_faulty=True)


def request_lines(cr: CellResult, only_faulty: bool = False) -> list[str]:
    """One line per request: verdict, first post-resume token expected/observed, streams around the pause."""
    lines = []
    for req in cr.requests:
        if only_faulty and not _faulty(req):
            continue
        v = _verdict(req)
        line = f"{_rid(req)}: {_label(v)}"
        if v.detail:
            line += f" ({v.detail})"
        line += f"; first post-resume token {_first_post_resume(req)}"
        line += f"; pause index {_tok(v.pause_index)}"
        center = _center(req)
        line += f"; observed {_window(req.observed, center)}; reference {_window(req.reference, center)}"
        lines.append(line)
    return lines


def junit_xml(results: Results) -> str:
    """JUnit XML, one testcase per cell: token faults fail, ERROR/TIMEOUT error, UNSUPPORTED is skipped."""
    cells = _sorted(results.cells)
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    total = 0.0
    suite = ET.Element("testsuite", name="vllm-repro")
    meta = results.meta or {}
    if meta.get("host"):
        suite.set("hostname", _x(meta["host"]))
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="workaround_verdict", value=_x(verdict_paragraph(cells)))
    for v in workaround_verdicts(cells):
        ET.SubElement(props, "property", name=f"workaround.{v.version}", value=v.status.value)
    for key in ("created", "platform"):
        if meta.get(key) is not None:
            ET.SubElement(props, "property", name=key, value=_x(meta[key]))
    banner = injection_banner(results)
    if banner:
        ET.SubElement(props, "property", name="inject", value=_x(banner))
    for cr in cells:
        duration = cr.duration_s or 0.0
        total += duration
        case = ET.SubElement(suite, "testcase", classname=f"vllm-repro.{cr.cell.version}", name=cr.id,
                             time=f"{duration:.3f}")
        if cr.outcome in (Outcome.UNSUPPORTED, Outcome.AMBIGUOUS):
            # AMBIGUOUS ran but proves nothing either way: neither a pass nor a failure.
            counts["skipped"] += 1
            prefix = "AMBIGUOUS: " if cr.outcome is Outcome.AMBIGUOUS else ""
            ET.SubElement(case, "skipped", message=_x(prefix + (cr.reason or cr.summary)))
        elif cr.outcome in (Outcome.ERROR, Outcome.TIMEOUT, Outcome.BUILD_FAILED):
            counts["errors"] += 1
            el = ET.SubElement(case, "error", message=_x(cr.reason or cr.summary), type=cr.outcome.value)
            el.text = _x(_detail(cr))
        elif cr.outcome.is_finding or cr.outcome is Outcome.FLAKY:
            counts["failures"] += 1
            el = ET.SubElement(case, "failure", message=_x(cr.summary), type=cr.outcome.value)
            el.text = _x("\n".join([cr.summary, *_fault_lines(cr)]))
        if cr.attempts:
            ET.SubElement(case, "system-out").text = _x("\n".join(
                f"attempt {a.n}: {a.label or a.outcome}: {a.reason or a.summary}" for a in cr.attempts))
    suite.set("tests", str(len(cells)))
    for key, n in counts.items():
        suite.set(key, str(n))
    suite.set("time", f"{total:.3f}")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


# --------------------------------------------------------------------------- terminal


def terminal_table(results_or_cells: CellsLike) -> Table:
    """A rich table of the cells with the outcome coloured (OK green, token faults red, infra magenta)."""
    table = Table(title=f"vllm-repro: {ISSUE}", show_lines=False)
    for name, kw in (("cell", {"no_wrap": True}), ("outcome", {"no_wrap": True}), ("summary / reason", {}),
                     ("known bugs", {}), ("effective", {"no_wrap": True}), ("time", {"justify": "right"})):
        table.add_column(name, **kw)
    cells = _sorted(_cells(results_or_cells))
    # Cells the platform cannot run (no engine was asked) fold into one row per
    # reason; the Markdown and JUnit reports still list each of them.
    folded: dict[str, list[CellResult]] = {}
    for cr in cells:
        if cr.outcome is Outcome.UNSUPPORTED and cr.engine is None:
            folded.setdefault(cr.reason or cr.summary, []).append(cr)
    for cr in cells:
        if cr.outcome is Outcome.UNSUPPORTED and cr.engine is None:
            continue
        style = OUTCOME_STYLES.get(cr.outcome, "")
        eff_async, eff_exec = _effective(cr)
        eff = f"async {eff_async}, {eff_exec}" if eff_async or eff_exec else ""
        duration = f"{cr.duration_s:.1f}s" if cr.duration_s is not None else ""
        # Text objects keep "[...]" in reasons from being read as rich markup.
        exp = _expectation(cr)
        table.add_row(Text(cr.id), Text(cr.outcome.value, style=style), Text(_detail(cr)),
                      Text(exp, style="bold red" if exp.startswith("UNEXPECTED") else "dim"), Text(eff),
                      Text(duration))
    for reason, group in folded.items():
        executors = ",".join(dict.fromkeys(c.cell.executor for c in group))
        label = f"{len(group)} cells ({executors})"
        table.add_row(Text(label), Text("UNSUPPORTED", style=OUTCOME_STYLES[Outcome.UNSUPPORTED]), Text(reason),
                      Text(""), Text(""), Text(""))
    return table


def render_terminal(results: CellsLike, console: Console) -> None:
    """Print the cell table and the workaround verdict paragraph."""
    banner = injection_banner(results) if isinstance(results, Results) else None
    if banner:
        console.print(Text(banner, style="bold red"))
    console.print(terminal_table(results))
    paragraph = Text()
    for text, style in _paragraph_parts(results):
        paragraph.append(text, style=style or "")
    console.print(paragraph)


# --------------------------------------------------------------------------- files


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_reports(results: Results, out_dir: Path) -> ReportPaths:
    """Write results.json, results.md and junit.xml into ``out_dir`` (each atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = ReportPaths(out_dir / "results.json", out_dir / "results.md", out_dir / "junit.xml")
    _write_atomic(paths.json, json.dumps(results.to_dict(), indent=2) + "\n")
    _write_atomic(paths.markdown, markdown(results))
    _write_atomic(paths.junit, junit_xml(results))
    return paths
