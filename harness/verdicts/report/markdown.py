"""The Markdown report (results.md): meta, workaround verdict, one table row per cell, token-fault details."""

from __future__ import annotations

import json
from typing import Any

from harness.core.oracle import Outcome
from harness.core.scenarios import pauses
from harness.core.versions import version_key
from harness.verdicts.mdtable import md_table
from harness.verdicts.report.cell_text import (
    attempt_rows,
    detail,
    effective,
    expectation_text,
    first_post_resume,
    injection_banner,
    is_faulty,
    on_off,
    request_verdict,
    rid_text,
    settings_rows,
    sorted_cells,
    token_text,
    token_window,
    verdict_label,
    window_center,
)
from harness.verdicts.report.workaround_text import ISSUE, verdict_paragraph
from harness.verdicts.results import CellResult, Results


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
        for lo in env.get("unresolvable_left_out") or () if isinstance(env, dict) else ():
            lines.append(f"- env {version}: {lo.get('name')}=={lo.get('version')} left out: {lo.get('reason')}")
    return lines


def _cell_row(cr: CellResult) -> list[Any]:
    c = cr.cell
    eff_async, eff_exec = effective(cr)
    axes = "".join(f" {s}" for s in c.variant)
    # A scenario that never pauses carries the default mode and clear_cache without playing them.
    mode, clear = (c.mode, str(c.clear_cache).lower()) if pauses(c.scenario) else ("-", "-")
    return [f"`{cr.id}`", c.version, c.executor + axes, on_off(c.async_on), mode, clear,
            f"**{cr.outcome.value}**" if cr.outcome is not Outcome.OK else cr.outcome.value, detail(cr),
            expectation_text(cr, markdown=True), eff_async, eff_exec]


def _details(cr: CellResult) -> list[str]:
    lines = [f"### `{cr.id}`", "", cr.summary]
    if cr.counts:
        lines[-1] += " — " + ", ".join(f"{k}: {n}" for k, n in cr.counts.items())
    lines.append("")
    if not cr.requests:  # a CRASH: the reason names vLLM's frame; the engine's log has the traceback
        return lines
    rows = []
    for req in cr.requests:
        v = request_verdict(req)
        center = window_center(req)
        submit = req.submit
        rows.append([
            rid_text(req),
            "/".join(str(s) for s in submit) if isinstance(submit, list) else submit,
            verdict_label(v),
            token_text(v.pause_index),
            first_post_resume(req),
            token_window(req.observed, center),
            token_window(req.reference, center),
        ])
    header = ["request", "submit", "verdict", "pause index", "first post-resume token", "observed",
              "reference"]
    lines += md_table(header, rows)
    lines.append("")
    return lines + _sampled_details(cr) + _stale_kv_details(cr)


def _stale_kv_details(cr: CellResult) -> list[str]:
    """Stale-kv requests (issue 37): each request's kind across the weight update (new, kept, before), its prefix-cache
    hit and what its stream follows (the oracle's detail, harness.core.oracle.stale_kv)."""
    notes = [f"- `{rid_text(req)}`: {verdict_label(v)}: {v.detail}" for req in cr.requests
             if "stale_kv" in req.raw and (v := request_verdict(req)).detail]
    return [*notes, ""] if notes else []


def _sampled_details(cr: CellResult) -> list[str]:
    """Sampled requests (issue 34): each faulty child's first wrong position, its token and logprob beside the
    model's table and the reference (the oracle's detail, harness.core.oracle.sampled)."""
    notes = [f"- `{rid_text(req)}`: {v.detail}" for req in cr.requests
             if "model_logprobs" in req.raw and is_faulty(req) and (v := request_verdict(req)).detail]
    return [*notes, ""] if notes else []


def markdown(results: Results) -> str:
    """The Markdown report: meta, workaround verdict, one table row per cell, token-fault details."""
    cells = sorted_cells(results.cells)
    lines = [f"# vllm-repro: {ISSUE} (first token after a keep-mode pause)", ""]
    banner = injection_banner(results)
    if banner:
        lines += [f"> **{banner}**", ""]
    lines += _meta_lines(results)
    lines += ["", "## Workaround verdict", "", verdict_paragraph(cells), "", "## Cells", ""]
    header = ["cell", "vLLM", "executor", "async", "mode", "clear_cache", "outcome", "summary / reason",
              "known bugs", "effective async", "executor class"]
    lines += md_table(header, (_cell_row(c) for c in cells))
    settings = settings_rows(cells)
    if settings:
        lines += ["", "## Engine settings", "",
                  "Every setting the engines relied on, read back after start (repro.settings.declared); an engine "
                  "whose setting differs from what it was asked ran its cells UNSUPPORTED.", ""]
        lines += md_table(["setting", "requested (by)", "effective", "read back at", "engines", "why"], settings)
    retried = [c for c in cells if c.attempts]
    if retried:
        lines += ["", "## Retried cells", "",
                  "Infrastructure failures (ERROR, TIMEOUT) ran again on a fresh engine (--retry-infra); the "
                  "cell's outcome is its last attempt's.", ""]
        lines += md_table(["cell", "attempt", "outcome", "summary / reason", "seconds to result", "engine files"],
                           attempt_rows(retried))
    faulty = [c for c in cells if c.outcome.is_finding or c.outcome is Outcome.FLAKY]
    if faulty:
        lines += ["", "## Token faults", "",
                  "Token windows are centred on the first post-resume token (bracketed), else the pause.", ""]
        for cr in faulty:
            lines += _details(cr)
    return "\n".join(lines).rstrip("\n") + "\n"


