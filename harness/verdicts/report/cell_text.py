"""What every report says of a cell and its requests: report order, effective engine facts, the request
verdicts and token windows, and the fault-injection banner."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from harness.core.cell import TABLE
from harness.core.oracle import Outcome
from harness.core.records import RequestRecord, RequestVerdictRecord
from harness.verdicts.results import CellResult, Results

INFRA = tuple(o for o in Outcome if o.is_infra)
WINDOW = 3  # tokens shown on each side of the pause index

CellsLike = Results | Sequence[CellResult]


def cells_of(cells: CellsLike) -> tuple[CellResult, ...]:
    return tuple(cells.cells) if isinstance(cells, Results) else tuple(cells)


# Report order is Cell.sort_key without the scenario: the scenarios of one config keep the order they ran in
# (as every committed report shows them).
_UNSORTED = tuple(i for i, a in enumerate(TABLE.sort_order) if a.name == "scenario")


def _cell_key(cr: CellResult) -> tuple[Any, ...]:
    return tuple(rank for i, rank in enumerate(cr.cell.sort_key) if i not in _UNSORTED)


def sorted_cells(cells: Iterable[CellResult]) -> list[CellResult]:
    return sorted(cells, key=_cell_key)


def on_off(flag: bool | None) -> str:
    return "?" if flag is None else ("on" if flag else "off")


def effective(cr: CellResult) -> tuple[str, str]:
    # (effective async, executor class) for display; '' when the engine never reported.
    if cr.engine is None or not isinstance(cr.engine.get("effective"), dict):
        return "", ""
    a = cr.engine.effective_async
    shown = on_off(a)
    if a is not None and a != cr.cell.async_on:
        shown += f" (asked {on_off(cr.cell.async_on)})"
    return shown, str(cr.engine.executor_class or "?")


def settings_rows(cells: Iterable[CellResult]) -> list[list[Any]]:
    """One row per setting the run's engines relied on: what was asked (by whom), what the engines ran, where it
    was read back, and how many engines had it effective, different, unverifiable or at vLLM's default."""
    seen: dict[str, dict[str, Any]] = {}
    engines: set[str] = set()
    for cr in cells:
        key = cr.cell.engine.id
        if cr.engine is None or key in engines:
            continue
        engines.add(key)
        for row in cr.engine.settings:
            agg = seen.setdefault(str(row.get("name")), {"requested": set(), "effective": set(), "read": set(),
                                                         "status": {}, "why": set()})
            agg["requested"].add(f"{_shown(row.get('requested'))} ({row.get('source')})")
            agg["effective"].add(_shown(row.get("effective")))
            agg["read"].add(str(row.get("read") or "-"))
            status = str(row.get("status"))
            agg["status"][status] = agg["status"].get(status, 0) + 1
            if row.get("why") and status in ("differs", "unverifiable"):
                agg["why"].add(str(row["why"]))
    return [[f"`{name}`", "; ".join(sorted(a["requested"])), "; ".join(sorted(a["effective"])),
             "; ".join(sorted(a["read"])), ", ".join(f"{s} {n}" for s, n in sorted(a["status"].items())),
             "; ".join(sorted(a["why"]))] for name, a in seen.items()]


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def detail(cr: CellResult) -> str:
    # The summary, plus the reason when the summary does not already say it, plus the attempts of a retried cell.
    text = f"{cr.summary}: {cr.reason}" if cr.reason and cr.reason not in cr.summary else cr.summary
    return f"{text} {attempts_note(cr)}" if cr.attempts else text


def attempts_note(cr: CellResult) -> str:
    # "[attempts: 1 ERROR, 2 OK]": a cell --retry-infra ran again.
    return "[attempts: " + ", ".join(f"{a.n} {a.label or a.outcome}" for a in cr.attempts) + "]"


def attempt_rows(cells: Sequence[CellResult]) -> list[list[Any]]:
    return [[f"`{cr.id}`", a.n, a.label or a.outcome, a.reason or a.summary,
             "" if a.elapsed_s is None else f"{a.elapsed_s:.1f}", a.engine_dir or ""]
            for cr in cells for a in cr.attempts]


_NO_VERDICT = RequestVerdictRecord(None)


def request_verdict(req: RequestRecord) -> RequestVerdictRecord:
    return req.verdict or _NO_VERDICT


def is_faulty(req: RequestRecord) -> bool:
    return request_verdict(req).outcome not in (None, Outcome.OK.value)


def verdict_label(v: RequestVerdictRecord) -> str:
    return "?" if v.label is None else v.label


def first_post_resume(req: RequestRecord) -> str:
    fpr = request_verdict(req).first_post_resume
    if fpr is None:
        return "—"
    exp, obs = fpr.get("expected"), fpr.get("observed")
    mark = "" if exp == obs else " ✗"
    return f"#{fpr.get('index')}: expected {token_text(exp)}, observed {token_text(obs)}{mark}"


def rid_text(req: RequestRecord) -> str:
    return "?" if req.rid is None else req.rid


def token_text(t: Any) -> str:
    return "none" if t is None else str(t)


def window_center(req: RequestRecord) -> int | None:
    # Windows centre on the first post-resume token, else the pause, else the fault.
    v = request_verdict(req)
    fpr = v.first_post_resume
    if fpr is not None and isinstance(fpr.get("index"), int):
        return int(fpr["index"])
    return next((i for i in (v.pause_index, v.at) if isinstance(i, int)), None)


def token_window(tokens: Sequence[Any] | None, center: int | None, width: int = WINDOW) -> str:
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


def expectation_text(cr: CellResult, markdown: bool = False) -> str:
    # "as expected" / "UNEXPECTED (expected LOSS(1) from vllm#42043)" from the known-bug table.
    text = cr.expectation.describe() if cr.expectation else ""
    return f"**{text}**" if markdown and text.startswith("UNEXPECTED") else text


