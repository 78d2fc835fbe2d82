"""``vllm-repro plan``'s input: an engine-tier pause schedule or a scheduler-tier op script, checked at the edge.

Two formats, each the one its engine side accepts:

* engine tier (``repro/scenarios/plan.py``, the ``plan`` scenario)::

    {"requests": [{"rid": "r0", "prompt": [5, 7], "max_tokens": 16, "submit": "start" | ["during", k] | ["after", k]}],
     "pauses": [{"mode": "keep", "clear_cache": true, "after_tokens": 4, "reset": false}]}

  ``reset`` (optional, default false): while paused, the client calls
  ``reset_prefix_cache(reset_running_requests=True)`` itself, as RL frameworks do instead of ``clear_cache=True``
  (the ``manual-reset`` scenario).

* scheduler tier (``repro/sched/script.py``, the ``ops`` scenario; what ``vllm-repro fuzz`` writes)::

    {"tier": "scheduler", "script": {<Setup fields>, "requests": [{rid, prompt, max_tokens}], "ops": [{op, ...}]}}

Both may carry ``found`` (where a fuzzer found the plan) and ``note``: informative, never read.  Everything is
checked by :mod:`harness.core.schema` before any env is built (issue 21: ``{"requests": "nope"}`` started an
engine and ended in an AttributeError), so a bad plan is one line naming the file, the JSON path and the problem.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from harness.core.errors import BadInput
from harness.core.schema import (
    AnyOf,
    Anything,
    Bool,
    Choice,
    Int,
    Invalid,
    ListOf,
    Nullable,
    Obj,
    Str,
    Tuple,
    item_path,
    key_path,
    message,
    require,
    validate,
)
from repro.models.deterministic import BigramCycleSpec
from repro.scenarios.vocab import MAX_MODEL_LEN, PAUSE_MODES, REFERENCE_MARGIN
from repro.sched.script import OP_KINDS, PAUSE_STATES, POLICIES, SCHEDULERS, ScriptError, Setup, build_script

TIERS = ("engine", "scheduler")
_INFO = {"found": Anything(), "note": Str()}

SUBMIT = AnyOf((Choice(("start",)), Tuple((Choice(("during", "after")), Int(lo=0)))),
               what='"start", ["during", k] or ["after", k] (k: a pause index)')
ENGINE_REQUEST = Obj(
    {"rid": Str(nonempty=True), "prompt": ListOf(Int(lo=0), min_len=1), "max_tokens": Int(lo=1), "submit": SUBMIT},
    required=("rid", "prompt", "max_tokens"), what="a request object {rid, prompt, max_tokens, submit}")
PAUSE = Obj({"mode": Choice(PAUSE_MODES), "clear_cache": Bool(), "after_tokens": Int(lo=0), "reset": Bool()},
            required=("mode", "clear_cache", "after_tokens"),
            what="a pause object {mode, clear_cache, after_tokens, reset}")


def _engine_plan_consistent(plan: Mapping[str, Any], path: str) -> None:
    """Request ids are distinct, and a request submitted during/after pause k names a pause the plan has."""
    pauses = len(plan.get("pauses") or [])
    seen: set[str] = set()
    for i, r in enumerate(plan["requests"]):
        here = item_path(key_path(path, "requests"), i)
        require(r["rid"] not in seen, key_path(here, "rid"), "a request id not used before", r["rid"])
        seen.add(r["rid"])
        submit = r.get("submit", "start")
        if isinstance(submit, list):
            expected = f"a pause index from 0 to {pauses - 1}" if pauses else "no pause index (the plan has no pauses)"
            require(submit[1] < pauses, item_path(key_path(here, "submit"), 1), expected, submit[1])


ENGINE_PLAN = Obj(
    {"tier": Choice(("engine",)), "requests": ListOf(ENGINE_REQUEST, min_len=1, what="a non-empty list of requests"),
     "pauses": ListOf(PAUSE, what="a list of pauses"), **_INFO},
    required=("requests",), what='a plan object {"requests": [...], "pauses": [...]}',
    checks=(_engine_plan_consistent,))

_VOCAB = BigramCycleSpec().vocab_size  # the scheduler tier's scripted executor walks the default checkpoint's cycle


def _setup_fields() -> dict[str, Any]:
    # Every Setup field, by its type: a field the fuzzer learns (issue 23: policy, long_prefill_token_threshold,
    # log_stats, kv_consumer) must be readable back from the plans it writes.
    out: dict[str, Any] = {}
    for f in fields(Setup):
        if f.name == "scheduler":
            out[f.name] = Choice(SCHEDULERS)
        elif f.name == "policy":
            out[f.name] = Choice(POLICIES)
        elif f.name == "depth":
            out[f.name] = Int(1, 3)
        elif isinstance(f.default, bool):
            out[f.name] = Bool()
        else:
            out[f.name] = Int(lo=0 if f.name.startswith("spec_") or f.name == "long_prefill_token_threshold" else 1)
    return out


_PROMPT = ListOf(Int(0, _VOCAB - 1), min_len=1)
SCHED_REQUEST = Obj({"rid": Str(nonempty=True), "prompt": _PROMPT, "max_tokens": Int(lo=1), "priority": Int(),
                     "session": Bool(), "chunks": ListOf(Tuple((_PROMPT, Int(lo=1)), what="a chunk [prompt, "
                                                                                          "max_tokens]"))},
                    required=("rid", "prompt", "max_tokens"),
                    what="a request object {rid, prompt, max_tokens, priority, session, chunks}")
OP = Obj({"op": Choice(tuple(sorted(OP_KINDS))), "rid": Str(nonempty=True), "n": Int(lo=1), "tokens": Int(lo=0),
          "in_flight": Nullable(Int(lo=0)), "optional": Bool(), "mode": Nullable(Choice(PAUSE_STATES)),
          "rids": ListOf(Str(nonempty=True), min_len=1), "connector": Bool()},
         required=("op",), what="an op object {op, rid, n, tokens, in_flight, optional, mode, rids, connector}")
SCRIPT = Obj({**_setup_fields(), "n_requests": Int(lo=1), "prompt_len": Int(lo=1), "max_tokens": Int(lo=1),
              "requests": ListOf(SCHED_REQUEST, what="a list of requests"),
              "ops": ListOf(OP, what="a list of ops")},
             required=("requests", "ops"), what="an op script object {<setup>, requests, ops}")
SCHED_PLAN = Obj({"tier": Choice(("scheduler",)), "script": SCRIPT, **_INFO}, required=("tier", "script"),
                 what='a scheduler-tier plan {"tier": "scheduler", "script": {...}}')


def check_plan(doc: Any, where: str) -> dict[str, Any]:
    """``doc`` when it is an engine- or scheduler-tier plan; BadInput (one line, exit 2) naming what is wrong."""
    validate(Obj({}, open=True, what=ENGINE_PLAN.what + " or " + SCHED_PLAN.what), doc, where)
    validate(Obj({"tier": Choice(TIERS)}, open=True), doc, where)
    if doc.get("tier", "engine") == "engine":
        return dict(validate(ENGINE_PLAN, doc, where))
    validate(SCHED_PLAN, doc, where)
    try:
        # The cross-field rules (depth per scheduler, rids the ops name, ...) are the script's own.
        build_script("ops", doc["script"], _VOCAB)
    except ScriptError as exc:
        raise BadInput(f"{where}: script: {exc}") from exc
    return dict(doc)


def read_plan(path: Path) -> dict[str, Any]:
    """The plan in ``path``; BadInput when it cannot be read or is not a plan."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read plan {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    except ValueError as exc:
        raise BadInput(f"{path}: not JSON ({exc})") from exc
    return check_plan(doc, str(path))


def check_plan_fits(plan: Mapping[str, Any], where: str, vocab: int | None, max_model_len: int | None) -> None:
    """The engine-tier plan fits the run's model: prompt ids inside its vocabulary (when known) and prompt +
    max_tokens + the reference's margin within ``max_model_len`` (when known)."""
    try:
        for i, r in enumerate(plan["requests"]):
            here = item_path("requests", i)
            for j, t in enumerate(r["prompt"]):
                if vocab is not None:
                    require(t < vocab, item_path(key_path(here, "prompt"), j),
                            f"a token id from 0 to {vocab - 1} (the model's vocabulary)", t)
            if max_model_len is not None:
                most = max_model_len - len(r["prompt"]) - REFERENCE_MARGIN
                require(r["max_tokens"] <= most, key_path(here, "max_tokens"),
                        f"at most {most} (max_model_len {max_model_len} - {len(r['prompt'])} prompt tokens - "
                        f"{REFERENCE_MARGIN} for the reference)", r["max_tokens"])
    except Invalid as exc:
        raise BadInput(message(where, exc)) from None


def model_limits(model_kind: str, model_params: Mapping[str, Any],
                 engine_args: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(vocabulary, max_model_len) the engine will have, where the harness knows them before it starts."""
    vocab = BigramCycleSpec(**model_params).vocab_size if model_kind == "bigram-cycle" else (
        int(model_params["vocab_size"]) if "vocab_size" in model_params else None)
    limit = engine_args.get("max_model_len", MAX_MODEL_LEN)
    return vocab, limit if isinstance(limit, int) and not isinstance(limit, bool) else None
