"""Measured reach of a fuzz run: line and branch coverage of vLLM's scheduler files, with coverage.py.

Runs inside the ``python -m repro.sched`` process (``runner.run`` starts it
before vLLM is imported, so module-level lines count as they do under
``coverage run``); coverage.py is staged beside ``repro`` by the harness like
Hypothesis (``harness.run.sched_fuzz.DISTRIBUTIONS``).  Only the files below are
traced (coverage.py's ``include``), so the rest of vLLM and torch run at
nearly full speed.

What a fuzz event's ``reach`` holds (:meth:`Reach.result`): per file
statements, branches, how many of each were run and the percentage of both
together (coverage.py's ``percent_covered``: (lines + branches run) /
(statements + branches)), the lines and branches never run (so the ones a CPU
run cannot reach can be named), and ``growth``: the same totals after
32, 64, 128, ... examples (shrinking included).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

# vLLM's scheduler and the KV-cache manager it drives (paths inside the vllm package).
TARGETS = ("vllm/v1/core/sched/", "vllm/v1/core/kv_cache_manager.py", "vllm/v1/core/block_pool.py")
# The four files the fuzz summary names (the others under sched/ are reported in fuzz.json).
HEADLINE = ("sched/scheduler.py", "sched/async_scheduler.py", "kv_cache_manager.py", "block_pool.py")
CHECKPOINTS = tuple(32 * 2**i for i in range(12))  # examples after which the totals are recorded


def short_name(path: str) -> str:
    """``.../vllm/v1/core/sched/scheduler.py`` -> ``sched/scheduler.py``."""
    marker = "vllm/v1/core/"
    norm = path.replace(os.sep, "/")
    return norm.split(marker, 1)[1] if marker in norm else norm


def file_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """One file's numbers from coverage.py's JSON report ``summary``."""
    return {"statements": summary["num_statements"], "covered_lines": summary["covered_lines"],
            "branches": summary.get("num_branches", 0), "covered_branches": summary.get("covered_branches", 0),
            "percent": round(float(summary["percent_covered"]), 1)}


def totals(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per file (short name) numbers of a coverage.py JSON report."""
    return {short_name(path): file_summary(doc["summary"]) for path, doc in sorted(report["files"].items())}


def missing(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per file the lines and branches (``[from, to]``; a negative ``to`` leaves the function) never run."""
    return {short_name(path): {"lines": doc.get("missing_lines", []), "branches": doc.get("missing_branches", [])}
            for path, doc in sorted(report["files"].items())}


Arc = tuple[int, int]

# Functions of scheduler.py no CPU scheduler-tier run can enter, and why: the tier builds vLLM's scheduler for the
# text-only bigram checkpoint (full attention), with at most a KV connector that moves nothing
# (repro/sched/null_connector.py, Setup.kv_consumer), no LoRA and no structured output.  Their statements and
# branches are left out of ``reachable`` (named in ``unreachable``); everything else counts as reachable, whole
# functions even where only part of one can run (so the figure is conservative).  Not here although they deal with
# KV connectors, because the null consumer connector runs them: _connector_finished, _build_kv_connector_meta,
# _drain_deferred_frees and _drain_deferred_loads (0.33; both run after every step once a consumer connector
# defers block frees with D >= 2, PR #45357), _handle_blocked_waiting_request and _set_kv_fetch_stage (every
# waiting request passes them), _update_from_kv_xfer_finished (a worker with a connector returns a
# KVConnectorOutput with every step, empty for this one), reset_connector_cache (reset_prefix_cache(
# reset_connector=True), EngineCore's pause with clear_cache); nor get_grammar_bitmask (EngineCore asks for it
# before sampling every step; it returns None without a grammar).
CPU_UNREACHABLE: dict[str, str] = {
    **dict.fromkeys((
        "_try_schedule_encoder_inputs", "_free_encoder_inputs", "_free_encoder_input", "_allocate_encoder_inputs",
        "_make_scheduled_encoder_input_stats", "_reject_on_encoder_cache_embed_mismatch", "reset_encoder_cache",
        "get_ec_connector", "_ec_transfer_pending", "_get_encoder_input_updates"),
        "multimodal encoder inputs: the checkpoint is text-only"),
    **dict.fromkeys((
        "_update_requests_with_invalid_blocks", "_handle_invalid_blocks", "_update_waiting_for_remote_kv",
        "_handle_failed_recving",
        "_load_restores_replay_window"),
        "KV transfers (remote KV loads, failed or invalid blocks): the tier's connector moves nothing"),
    "get_kv_connector": "EngineCore's getter (start-up and KV events); the scheduler itself never calls it",
    "_free_cow_retained_blocks": "copy-on-write of partial prefix hits, which need Mamba 'align' groups",
    "_mamba_block_aligned_split": "hybrid (Mamba) models: the checkpoint has full attention only",
    "update_draft_token_ids_in_output": "structured output: EngineCore calls it only for a step whose sampling "
                                        "waits on a grammar (pending_structured_output_tokens)",
}


def function_ranges(source: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of every function in ``source``."""
    import ast

    return [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def enclosing(ranges: list[tuple[int, int, str]], line: int) -> str | None:
    """The innermost function around ``line``."""
    best: tuple[int, str] | None = None
    for first, last, name in ranges:
        if first <= line <= last and (best is None or first > best[0]):
            best = (first, name)
    return None if best is None else best[1]


def reachable(doc: dict[str, Any], ranges: list[tuple[int, int, str]], table: dict[str, str]) -> dict[str, Any]:
    """A file's statements+branches without those inside the ``table``'s functions (coverage.py JSON ``doc``)."""
    def kept(line: int) -> bool:
        return enclosing(ranges, line) not in table

    ex_l = [x for x in doc.get("executed_lines", []) if kept(x)]
    mi_l = [x for x in doc.get("missing_lines", []) if kept(x)]
    ex_b = [b for b in doc.get("executed_branches", []) if kept(b[0])]
    mi_b = [b for b in doc.get("missing_branches", []) if kept(b[0])]
    total = len(ex_l) + len(mi_l) + len(ex_b) + len(mi_b)
    left_out = sorted({name for first, last, name in ranges if name in table})
    return {"statements": len(ex_l) + len(mi_l), "covered_lines": len(ex_l), "branches": len(ex_b) + len(mi_b),
            "covered_branches": len(ex_b), "percent": round(100.0 * (len(ex_l) + len(ex_b)) / total, 1) if total
            else 100.0, "unreachable": {name: table[name] for name in left_out},
            "missed_by_function": missed_by_function(mi_l, mi_b, ranges)}


def missed_by_function(lines: list[int], branches: list[list[int]], ranges: list[tuple[int, int, str]]
                       ) -> dict[str, int]:
    """Statements and branches never run, per enclosing function, most first."""
    counts: dict[str, int] = {}
    for line in [*lines, *(b[0] for b in branches)]:
        name = enclosing(ranges, line) or "<module>"
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class Snapshot:
    """What had run after ``examples`` examples: per file (short name) its lines and arcs."""

    examples: int
    lines: dict[str, frozenset[int]]  # as recorded: physical lines, before coverage.py maps them to statements
    arcs: dict[str, frozenset[Arc]]


def percent_at(snap: Snapshot, report: dict[str, Any], translate: Any = None) -> dict[str, float]:
    """The headline files' statements+branches percentages of a snapshot, against the final report's statements
    and branches (what coverage.py's own percent_covered counts: run lines and branches over all of them).
    ``translate(name, lines, arcs)``: the recorded lines and arcs as the statements they belong to (coverage.py's
    file reporter: a statement over several lines is recorded at the line its bytecode runs, reported at its
    first)."""
    out: dict[str, float] = {}
    for path, doc in report["files"].items():
        name = short_name(path)
        if name not in HEADLINE:
            continue
        lines, arcs = snap.lines.get(name, frozenset()), snap.arcs.get(name, frozenset())
        if translate is not None:
            lines, arcs = translate(name, lines, arcs)
        statements = set(doc.get("executed_lines", [])) | set(doc.get("missing_lines", []))
        branches = {(a, b) for a, b in doc.get("executed_branches", []) + doc.get("missing_branches", [])}
        run = len(set(lines) & statements) + len(set(arcs) & branches)
        total = len(statements) + len(branches)
        out[name] = round(100.0 * run / total, 1) if total else 100.0
    return out


class Reach:
    """coverage.py over :data:`TARGETS`, started at once; :meth:`checkpoint` after examples, :meth:`result` at the
    end."""

    def __init__(self) -> None:
        import coverage  # staged by the harness; ImportError: no reach

        self.version = coverage.__version__
        self.cov = coverage.Coverage(data_file=None, branch=True, config_file=False,
                                     include=[f"*/{t}*" for t in TARGETS])
        self.snapshots: list[Snapshot] = []
        self.paths: dict[str, str] = {}  # short name -> the file coverage.py measured
        self.reporters: dict[str, Any] = {}
        self.cost_cpu_s = 0.0  # CPU seconds spent on snapshots (the measurement's, not the examples')
        self.cost_wall_s = 0.0
        self.paused = False
        self.cov.start()

    # Tracing only while vLLM's code can run: the fuzzer pauses it between the examples' rules (Hypothesis' own
    # drawing, shrinking and bookkeeping never enter vLLM's files, yet a tracer slows every Python line), and
    # resumes it around every rule, set-up and teardown (repro.sched.fuzzrun.FuzzRun.traced).  coverage.py's
    # Collector has pause/resume for this (what Coverage.start/stop do without building new tracers); where a
    # release lacks them the tracer simply stays on.
    def _collector(self) -> Any:
        collector = getattr(self.cov, "_collector", None)
        return collector if hasattr(collector, "pause") and hasattr(collector, "resume") else None

    def pause(self) -> None:
        collector = self._collector()
        if collector is not None and not self.paused:
            collector.pause()
            self.paused = True

    def resume(self) -> None:
        collector = self._collector()
        if collector is not None and self.paused:
            collector.resume()
            self.paused = False

    def core(self) -> str:
        """The tracer coverage.py runs with (CTracer; PyTracer where the staged C extension does not fit this
        Python; sysmon)."""
        for key, value in self.cov.sys_info():
            if key == "core":
                return str(value)
        return "unknown"

    def checkpoint(self, examples: int) -> None:
        """Record what had run after ``examples`` examples (cheap: a copy of the arcs), then go on measuring."""
        t0, c0 = time.monotonic(), time.process_time()
        self.cov.stop()
        try:
            data = self.cov.get_data()
            files = {short_name(f): f for f in data.measured_files()}
            self.paths.update(files)
            self.snapshots.append(Snapshot(
                examples, {n: frozenset(data.lines(f) or ()) for n, f in files.items()},
                {n: frozenset(data.arcs(f) or ()) for n, f in files.items()}))
        finally:
            self.cov.start()
            if self.paused:  # start() traces afresh: paused as it was
                collector = self._collector()
                if collector is not None:
                    collector.pause()
            self.cost_wall_s += time.monotonic() - t0
            self.cost_cpu_s += time.process_time() - c0

    def _translate(self, name: str, lines: frozenset[int], arcs: frozenset[Arc]) -> tuple[set[int], set[Arc]]:
        from coverage.python import PythonFileReporter

        if name not in self.reporters:
            self.reporters[name] = PythonFileReporter(self.paths[name], self.cov)
        fr = self.reporters[name]
        return set(fr.translate_lines(lines)), set(fr.translate_arcs(arcs))

    def _report(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "reach.json")
            self.cov.json_report(outfile=out, show_contexts=False)
            with open(out, encoding="utf-8") as f:
                return dict(json.load(f))

    def result(self, examples: int) -> dict[str, Any]:
        """The run's reach (stops measuring)."""
        self.cov.stop()
        report = self._report()
        files = totals(report)
        growth = [{"examples": s.examples, **percent_at(s, report, self._translate)} for s in self.snapshots
                  if s.examples < examples]
        growth.append({"examples": examples, **{n: d["percent"] for n, d in files.items() if n in HEADLINE}})
        out = {"tool": f"coverage.py {self.version}", "core": self.core(), "files": files,
               "missing": missing(report), "growth": growth}
        for path, doc in report["files"].items():
            if short_name(path) == "sched/scheduler.py":
                with open(self.paths.get("sched/scheduler.py", path), encoding="utf-8") as f:
                    out["reachable"] = {"sched/scheduler.py": reachable(doc, function_ranges(f.read()),
                                                                        CPU_UNREACHABLE)}
        return out


def start(fuzz: dict[str, Any] | None) -> Reach | str | None:
    """Measuring started when the spec's ``fuzz`` asks for reach; the reason when it cannot be, else None."""
    if not fuzz or not fuzz.get("reach"):
        return None
    try:
        return Reach()
    except Exception as exc:  # coverage.py not staged, or refusing this Python
        return f"coverage.py unavailable: {type(exc).__name__}: {exc}"
