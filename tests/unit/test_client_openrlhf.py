"""Tests of the in-process client door (issue 36, OpenRLHF): the framework's own wrapper class builds and drives
AsyncLLM in the engine process.  Its precondition (the engine's pause/resume calls must come from the framework's
file with its own arguments, as many as the door asked of the actor), the adapter that hands the pause and resume
to the actor, the import of the framework's module with its stand-ins (gone from ``sys.modules`` afterwards) and
the actor built as Ray builds an async actor (never a real engine, never the network)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.envbuild import client_env as ce
from repro.client.actor import ActorLLM, actor_precondition, in_process
from repro.client.clients import CLIENTS, NO_CLIENT
from repro.scenarios.vocab import ScenarioUnsupported

pytestmark = pytest.mark.unit

ORL = CLIENTS["openrlhf"]
CORE_ASYNC = {"core": {"async_scheduling": True,
                       "scheduler_class": "vllm.v1.core.sched.async_scheduler.AsyncScheduler"}}
HELD = [{"rid": "r0", "pauses": [{"k": 0, "frozen": True, "engine_tokens": 6}]}]
CALLS = [{"ok": True, "method": "pause_generation"}, {"ok": True, "method": "resume_generation"}]
SITE = "/e/lib/python3.11/site-packages/"
FROM_ORL = [{"call": "pause_generation", "kwargs": {"mode": "'keep'"},
             "caller": SITE + "openrlhf/trainer/ray/vllm_engine.py:131"},
            {"call": "resume_generation", "kwargs": {}, "caller": SITE + "openrlhf/trainer/ray/vllm_engine.py:134"}]


def test_openrlhf_is_an_in_process_client_door_and_verl_says_why_not() -> None:
    assert in_process({"framework": "openrlhf"}) and not in_process({"framework": "trl"}) and not in_process(None)
    assert "openrlhf" not in NO_CLIENT and "RolloutRayActor" in ORL.cls
    assert "actor methods called over Ray" in NO_CLIENT["verl"]


def test_the_frameworks_own_calls_meet_the_precondition() -> None:
    pre = actor_precondition(ORL, HELD, CALLS, FROM_ORL, CORE_ASYNC, "openrlhf 0.11.2 RolloutRayActor")
    assert pre["met"] and pre["strict"]
    assert ("1x AsyncLLM.pause_generation(mode='keep'), 1x AsyncLLM.resume_generation(), from "
            "openrlhf/trainer/ray/vllm_engine.py:131, openrlhf/trainer/ray/vllm_engine.py:134") in pre["what"]


@pytest.mark.parametrize(("seen", "calls", "records", "probe", "says"), [
    # The harness's own pause reached the engine, not OpenRLHF's.
    ([{**FROM_ORL[0], "caller": "/w/repro/scenarios/driver.py:88"}, FROM_ORL[1]], CALLS, HELD, CORE_ASYNC,
     "the framework's code did not make: pause_generation"),
    # OpenRLHF's file, but not its arguments (it leaves clear_cache at the default).
    ([{**FROM_ORL[0], "kwargs": {"mode": "'keep'", "clear_cache": "False"}}, FROM_ORL[1]], CALLS, HELD, CORE_ASYNC,
     "the engine saw 0x AsyncLLM.pause_generation(mode='keep')"),
    # The door asked the actor twice; the engine saw one pause.
    (FROM_ORL, [CALLS[0], *CALLS], HELD, CORE_ASYNC, "the actor was asked 2 and 1"),
    (FROM_ORL, CALLS, [{"rid": "r0", "pauses": [{"k": 0, "frozen": False, "engine_tokens": None}]}], CORE_ASYNC,
     "no request was in flight"),
    (FROM_ORL, CALLS, HELD, {"core": {"async_scheduling": False, "scheduler_class": "x.Scheduler"}},
     "async scheduling not in effect inside EngineCore"),
])
def test_the_precondition_is_unmet(seen: list[dict[str, Any]], calls: list[dict[str, Any]],
                                   records: list[dict[str, Any]], probe: dict[str, Any], says: str) -> None:
    pre = actor_precondition(ORL, records, calls, seen, probe)
    assert not pre["met"] and pre["strict"] and says in pre["what"]


class _Engine:
    def __init__(self) -> None:
        self.paused: list[dict[str, Any]] = []

    async def pause_generation(self, **kwargs: Any) -> None:
        self.paused.append(kwargs)

    async def resume_generation(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class _Actor:  # as OpenRLHF's RolloutRayActor calls its engine (vllm_engine.py:130-134)
    def __init__(self) -> None:
        self.llm = _Engine()

    async def pause_generation(self) -> None:
        await self.llm.pause_generation(mode="keep")

    async def resume_generation(self) -> None:
        await self.llm.resume_generation()


def test_the_adapter_hands_the_pause_to_the_actor_and_records_who_called_the_engine() -> None:
    client = replace(ORL, caller=Path(__file__).name)  # this file plays the framework's
    llm = ActorLLM(_Actor(), client, {"version": "0.11.2"}, want_async=True)
    events: list[dict[str, Any]] = []
    emit = llm.scenario_emit(lambda kind, **f: events.append(f))

    async def play() -> None:
        await llm.pause_generation(mode="keep", clear_cache=True)
        await llm.resume_generation()
        with pytest.raises(ScenarioUnsupported, match="this cell asks mode=keep clear_cache=false"):
            await llm.pause_generation(mode="keep", clear_cache=False)
        await llm.actor.llm.pause_generation(mode="keep")  # not through the framework's code: seen from here
    asyncio.run(play())
    assert llm.actor.llm.paused == [{"mode": "keep"}, {"mode": "keep"}]
    assert [c["method"] for c in llm.calls] == ["pause_generation", "resume_generation"]
    assert [s["caller"].rsplit(":", 1)[0].endswith(Path(__file__).name) for s in llm.seen] == [True, True, True]
    llm.shutdown()  # the engine's own, through the adapter
    emit("scenario", status="ran", records=HELD, probe_after=CORE_ASYNC)
    pre = events[0]["precondition"]
    assert pre["met"] is False and "the actor was asked 1 and 1" in pre["what"]  # 2 pauses seen, 1 asked
    assert events[0]["client"]["engine_calls"] == llm.seen


_FAKE = {
    "openrlhf/__init__.py": "",
    "openrlhf/utils/__init__.py": "raise ImportError('the package __init__ must not run')\n",
    "openrlhf/utils/agent.py": "class SingleTurnAgentExecutor:\n    pass\n",
    "openrlhf/trainer/__init__.py": "",
    "openrlhf/trainer/ray/__init__.py": "from .vllm_engine import RolloutRayActor\n",
    "openrlhf/trainer/ray/vllm_engine.py": textwrap.dedent("""\
        import os
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        from openrlhf.utils.agent import SingleTurnAgentExecutor

        @ray.remote
        class RolloutRayActor:
            async def __init__(self, *args, bundle_indices=None, **kwargs):
                self.ray_address = os.environ.get("RAY_ADDRESS")
                kwargs.pop("num_gpus"), kwargs.pop("full_determinism")
                self.kwargs = kwargs
        """),
    "openrlhf-0.11.2.dist-info/METADATA": "Metadata-Version: 2.1\nName: openrlhf\nVersion: 0.11.2\n",
}

_PROBE = """
import asyncio, json, os, sys
from repro.client.actor import build, load_wrapper
client, cls, facts = load_wrapper({"framework": "openrlhf", "site": sys.argv[1]})
actor = asyncio.run(build(client, cls, {"model": "m", "enforce_eager": True}))
print(json.dumps({"facts": facts, "ray_left": sorted(m for m in sys.modules if m.split(".")[0] == "ray"),
                  "utils_init_ran": hasattr(sys.modules["openrlhf.utils"], "__file__"),
                  "cls": type(actor).__name__, "ray_address": actor.ray_address, "kwargs": actor.kwargs,
                  "ray_address_after": os.environ.get("RAY_ADDRESS")}))
"""


def test_the_module_imports_with_its_standins_which_leave_and_the_actor_is_built_as_ray_builds_it(
        tmp_path: Path) -> None:
    site = tmp_path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for rel, text in _FAKE.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    repo = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", _PROBE, str(site)], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["facts"]["version"] == "0.11.2" and got["facts"]["file"].endswith("trainer/ray/vllm_engine.py")
    assert got["ray_left"] == [] and got["utils_init_ran"] is False and got["cls"] == "RolloutRayActor"
    assert got["ray_address"] == "none:repro-client-door" and got["ray_address_after"] is None
    assert got["kwargs"] == {"agent_func_path": None, "remote_rm_url": None, "mm_pad_token_ids": [],
                             "model": "m", "enforce_eager": True}


def test_another_pythons_side_environment_is_unsupported(tmp_path: Path) -> None:
    from repro.client.actor import load_wrapper
    from repro.client.door import ClientUnavailable

    site = tmp_path / "lib" / "python2.7" / "site-packages"
    site.mkdir(parents=True)
    with pytest.raises(ClientUnavailable, match=r"side environment is python2\.7") as exc:
        load_wrapper({"framework": "openrlhf", "site": str(site)})
    assert exc.value.unsupported


def test_the_side_environment_hands_its_site_packages_to_the_engine(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ce, "env_status", lambda _p: {"ok": True})
    monkeypatch.setattr(ce, "touch", lambda _p: None)
    path = ce.env_dir(tmp_path, ce.env_name(ORL, "0.11.2", "3.11.7", ce.IndexConfig()))
    (path / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    env = ce.ensure_client_env(ORL, "0.11.2", tmp_path, "3.11", ce.IndexConfig(), "3.11.7")
    assert env.to_spec()["site"] == str(path / "lib" / "python3.11" / "site-packages")
    trl = ce.ensure_client_env(CLIENTS["trl"], "1.16.0", tmp_path, "3.11", ce.IndexConfig(), "3.11.7")
    assert "site" not in trl.to_spec()
