"""The JUnit XML report (junit.xml): one testcase per cell; token faults fail, infrastructure errors error,
UNSUPPORTED and AMBIGUOUS are skipped."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from harness.core.oracle import Outcome
from harness.verdicts.report.cell_text import (
    detail,
    first_post_resume,
    injection_banner,
    is_faulty,
    request_verdict,
    rid_text,
    sorted_cells,
    token_text,
    token_window,
    verdict_label,
    window_center,
)
from harness.verdicts.report.workaround_text import verdict_paragraph
from harness.verdicts.results import CellResult, Results
from harness.verdicts.workarounds import workaround_verdicts

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
        if only_faulty and not is_faulty(req):
            continue
        v = request_verdict(req)
        line = f"{rid_text(req)}: {verdict_label(v)}"
        if v.detail:
            line += f" ({v.detail})"
        line += f"; first post-resume token {first_post_resume(req)}"
        line += f"; pause index {token_text(v.pause_index)}"
        center = window_center(req)
        line += f"; observed {token_window(req.observed, center)}; reference {token_window(req.reference, center)}"
        lines.append(line)
    return lines


def junit_xml(results: Results) -> str:
    """JUnit XML, one testcase per cell: token faults fail, ERROR/TIMEOUT error, UNSUPPORTED is skipped."""
    cells = sorted_cells(results.cells)
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    total = 0.0
    suite = ET.Element("testsuite", name="vllm-repro")
    meta = results.meta or {}
    if meta.get("host"):
        suite.set("hostname", _x(meta["host"]))
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="workaround_verdict", value=_x(verdict_paragraph(cells)))
    for v in workaround_verdicts(cells):
        ET.SubElement(props, "property", name=f"workaround.{v.where.replace(' ', '.')}", value=v.status.value)
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
            el.text = _x(detail(cr))
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


