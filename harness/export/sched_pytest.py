"""A scheduler-tier plan as one self-contained pytest file vLLM can paste (``vllm-repro plan PLAN.json
--export-pytest FILE``; issue 23 item 5).

The file imports only vLLM, pytest and the standard library.  Its body is ``repro/sched/reproducer.py`` copied
verbatim (how the harness builds the scheduler and drives it: repro/sched/adapter.py and executor.py, inlined);
the plan's setup, requests and ops follow as Python literals, then one test in the style of vLLM's
``tests/v1/core/test_async_scheduler.py``: build the scheduler, replay the ops, assert every request's tokens.
It fails where the scheduler loses, repeats or shifts a token, never finishes a request (a stall) or raises,
and passes where it does not.  The harness itself never imports vLLM: the template is read as text.
"""

from __future__ import annotations

import importlib.resources
import pprint
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.core.errors import BadInput
from harness.run.sched_fuzz import op_text
from repro.sched.script import Script, ScriptError, build_script

TEMPLATE = "reproducer.py"  # in the repro.sched package
VOCAB = 512  # the template's model config (repro/sched/reproducer.py MODEL_CONFIG), the harness model's


def plan_script(plan: Mapping[str, Any], where: str) -> Script:
    """The op script of a scheduler-tier plan, validated; BadInput for any other plan."""
    if plan.get("tier") != "scheduler" or not isinstance(plan.get("script"), Mapping):
        raise BadInput(f"{where}: --export-pytest takes a scheduler-tier plan ({{\"tier\": \"scheduler\", "
                       "\"script\": {...}}, as `vllm-repro fuzz` writes); engine-tier plans have no exporter yet")
    try:
        script = build_script("ops", plan["script"], VOCAB)
    except ScriptError as exc:
        raise BadInput(f"{where}: {exc}") from exc  # prompt tokens outside VOCAB too
    missing = not_inlined(script)
    if missing:
        # The file would build a different scheduler (or skip an op) than the plan ran: refuse, never export a
        # reproducer that reproduces something else.
        raise BadInput(f"{where}: the exporter's template (repro/sched/reproducer.py) does not carry "
                       f"{', '.join(missing)} yet; this plan cannot be exported")
    return script


def not_inlined(script: Script) -> list[str]:
    """What the plan uses that the template does not build: the fuzzer's richer rules and the null connector."""
    setup = script.setup
    out = [what for what, used in (
        ("kv_consumer (the null KV connector of vllm#49674)", setup.kv_consumer),
        (f"policy={setup.policy!r}", setup.policy != "fcfs"),
        (f"long_prefill_token_threshold={setup.long_prefill_token_threshold}", setup.long_prefill_token_threshold),
        ("log_stats", setup.log_stats),
        ("request priorities", any(r.priority for r in script.requests)),
        ("PAUSED_NEW pauses (pause mode \"new\")", any(o.op == "pause" and o.mode not in (None, "keep")
                                                        for o in script.ops)),
        ("the sync Scheduler's drafts", setup.spec_tokens > 0 and not setup.is_async),
        ("streaming-input sessions", any(r.session for r in script.requests)),
        ("batched aborts (abort_many, abort_all)", any(o.op in ("abort_many", "abort_all") for o in script.ops)),
        ("resets of the KV connector (reset connector)", any(o.connector for o in script.ops)),
    ) if used]
    return out


def _docstring(plan: Mapping[str, Any], script: Script, source: str) -> str:
    found = plan.get("found") or {}
    ops = "; ".join(op_text(o) for o in script.to_dict()["ops"])
    lines = [f"Reproducer exported by vllm-repro from {source}: vLLM's {script.setup.scheduler} scheduler, "
             f"{script.setup.depth} frame(s) in flight" + (
                 f", {script.setup.spec_tokens} draft token(s) a step, {script.setup.spec_accepted} accepted"
                 if script.setup.spec_tokens else "") + ".", "", f"Ops: {ops}."]
    if found.get("version"):
        lines += ["", f"Found on vLLM {found['version']} (seed {found.get('seed')}): {found.get('summary')}"]
    elif found.get("summary"):
        lines += ["", str(found["summary"])]
    lines += ["", "Run: pytest -q THIS_FILE   (needs only vllm and pytest; CPU is enough)."]
    return "\n".join(lines).replace('"""', "'''").replace("\\", "\\\\")


def _literal(name: str, value: Any) -> str:
    return f"{name} = {pprint.pformat(value, width=110, sort_dicts=False)}\n"


def reproducer_name(source: str) -> str:
    """``test_<stem>``: a Python identifier from the plan's file name."""
    stem = re.sub(r"\W+", "_", Path(source).stem).strip("_").lower() or "plan"
    return f"test_{stem}" if not stem[0].isdigit() else f"test_plan_{stem}"


def export_pytest(plan: Mapping[str, Any], source: str) -> str:
    """The pytest file's text for ``plan`` (read from ``source``, named in its docstring and test)."""
    script = plan_script(plan, source)
    doc = script.to_dict()
    setup = {k: v for k, v in doc.items() if k not in ("requests", "ops")}
    requests = {r["rid"]: {"prompt": r["prompt"], "max_tokens": r["max_tokens"]} for r in doc["requests"]}
    template = importlib.resources.files("repro.sched").joinpath(TEMPLATE).read_text(encoding="utf-8")
    body = template.replace("__DOCSTRING__", _docstring(plan, script, Path(source).name), 1)
    test = (f"\n\n{_literal('SETUP', setup)}{_literal('REQUESTS', requests)}{_literal('OPS', doc['ops'])}\n\n"
            f"def {reproducer_name(source)}(tmp_path):\n"
            "    replay = Replay(make_scheduler(tmp_path, SETUP), SETUP, REQUESTS)\n"
            "    for op in OPS:\n"
            "        replay.apply(op)\n"
            "    check_streams(replay)\n")
    return body.rstrip("\n") + "\n" + test


def write_pytest(plan: Mapping[str, Any], source: str, out: Path) -> Path:
    """Write :func:`export_pytest`'s file to ``out``."""
    text = export_pytest(plan, source)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from exc
    return out
