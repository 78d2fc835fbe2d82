"""Tests of the client door (issue 36): the precondition that decides whether a cell is judged, the adapter that
hands the pause and resume to the framework's client, the side process's stand-ins, the side environment's
release choice and install failure, and ``frameworks check --door client``'s bad input (never the network)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.core.errors import BadInput
from harness.core.events import Precondition
from harness.core.oracle import Outcome
from harness.envbuild import client_env as ce
from harness.envbuild.client_python import FoundPython
from harness.envbuild.index_releases import Release
from harness.frontends.cli import main
from harness.run.scenario_results import with_precondition
from harness.verdicts.results import CellResult
from repro.client.clients import CLIENTS, STANDINS, Client, StandIn
from repro.client.door import ClientLLM, precondition
from repro.scenarios.vocab import ScenarioUnsupported

pytestmark = pytest.mark.unit

TRL = CLIENTS["trl"]
CORE_ASYNC = {"core": {"async_scheduling": True,
                       "scheduler_class": "vllm.v1.core.sched.async_scheduler.AsyncScheduler"}}
HELD = [{"rid": "r0", "pauses": [{"k": 0, "frozen": True, "engine_tokens": 6}]},
        {"rid": "r1", "pauses": [{"k": 0, "frozen": False, "engine_tokens": None}]}]
CALLS = [{"ok": True, "method": "pause"}, {"ok": True, "method": "resume"}]
LOG = ('INFO:     127.0.0.1:4001 - "POST /v1/completions HTTP/1.1" 200 OK\n'
       'INFO:     127.0.0.1:4002 - "POST /pause?mode=keep HTTP/1.1" 200 OK\n'
       'INFO:     127.0.0.1:4003 - "POST /resume HTTP/1.1" 200 OK\n')


def test_an_async_off_cell_needs_async_off_inside_enginecore() -> None:
    off = {"core": {"async_scheduling": False, "scheduler_class": "vllm.v1.core.sched.scheduler.Scheduler"}}
    assert precondition(TRL, HELD, CALLS, LOG, off, want_async=False)["met"]
    pre = precondition(TRL, HELD, CALLS, LOG, CORE_ASYNC, want_async=False)
    assert not pre["met"] and "async scheduling in effect inside EngineCore, the cell asks async off" in pre["what"]


def test_precondition_met_names_the_evidence() -> None:
    pre = precondition(TRL, HELD, CALLS, LOG, CORE_ASYNC, "trl 1.16.0 VLLMClient")
    assert pre["met"] and pre["strict"]
    assert "1 request(s) in flight" in pre["what"] and "AsyncScheduler" in pre["what"]
    assert pre["what"].startswith("trl 1.16.0 VLLMClient")


@pytest.mark.parametrize(("records", "calls", "log", "probe", "says"), [
    (HELD, CALLS, LOG, {"core": {"async_scheduling": False, "scheduler_class": "Scheduler"}},
     "async scheduling not in effect inside EngineCore"),
    # The API server's config said async, EngineCore's own scheduler did not: no proof.
    (HELD, CALLS, LOG, {"frontend_async_scheduling": True, "core": {"async_scheduling": True,
                                                                    "scheduler_class": "Scheduler"}},
     "not in effect inside EngineCore"),
    ([{"rid": "r0", "pauses": [{"k": 0, "frozen": False, "engine_tokens": None}]}], CALLS, LOG, CORE_ASYNC,
     "no request was in flight"),
    (HELD, CALLS, LOG.replace("/pause?mode=keep", "/pause?mode=keep&clear_cache=true"), CORE_ASYNC,
     "the access log shows 0x"),
    (HELD, CALLS, LOG + 'INFO:     127.0.0.1:4009 - "POST /resume HTTP/1.1" 200 OK\n', CORE_ASYNC,
     "the client made 1 and 1"),
    (HELD, [{"ok": False, "method": "pause"}], LOG, CORE_ASYNC, "made 0 pause and 0 resume"),
])
def test_precondition_unmet(records: list[dict[str, Any]], calls: list[dict[str, Any]], log: str,
                            probe: dict[str, Any], says: str) -> None:
    pre = precondition(TRL, records, calls, log, probe)
    assert not pre["met"] and says in pre["what"]


def _result(outcome: Outcome) -> CellResult:
    from harness.core.cell import Cell

    return CellResult(Cell(version="0.21.0", door="client"), outcome, outcome.value, label=outcome.value)


def test_strict_precondition_leaves_a_loss_unjudged() -> None:
    loss = _result(Outcome.LOSS)
    # The engine-profile scenarios' rule: a wrong stream stays the finding.
    assert with_precondition(loss, Precondition(False, "no event")).outcome is Outcome.LOSS
    # The client door's: the framework's calls did not provably meet the streams, so no verdict.
    res = with_precondition(loss, Precondition(False, "precondition not met: x", strict=True))
    assert res.outcome is Outcome.UNSUPPORTED and res.reason == "precondition not met: x"
    assert with_precondition(loss, Precondition(True, "calls proved", strict=True)).outcome is Outcome.LOSS
    assert Precondition.from_json({"met": False, "what": "w", "strict": True}) == Precondition(False, "w", True)


class _Side:
    def __init__(self) -> None:
        self.methods: list[str] = []

    def call(self, method: str, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        self.methods.append(method)
        return {"ok": method != "resume", "method": method, "error": "HTTP 500"}


class _Http:
    def require(self, *_: Any) -> None:
        pass


def test_client_llm_hands_the_pause_to_the_framework_client(tmp_path: Path) -> None:
    side = _Side()
    llm = ClientLLM(_Http(), TRL, side, {"version": "1.16.0"}, tmp_path / "server.log")  # type: ignore[arg-type]
    asyncio.run(llm.pause_generation(mode="keep", clear_cache=True))
    assert side.methods == ["pause"] and llm.calls[0]["ok"]
    with pytest.raises(ScenarioUnsupported, match="mode=keep clear_cache=false"):
        asyncio.run(llm.pause_generation(mode="keep", clear_cache=False))
    with pytest.raises(RuntimeError, match=r"VLLMClient.resume\(\) raised: HTTP 500"):
        asyncio.run(llm.resume_generation())


def test_scenario_emit_adds_the_precondition_from_the_new_log_only(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(LOG)  # an earlier scenario's lines: not this one's
    side = _Side()
    llm = ClientLLM(_Http(), TRL, side, {"version": "1.16.0"}, log)  # type: ignore[arg-type]
    got: list[dict[str, Any]] = []
    emit = llm.scenario_emit(lambda kind, **f: got.append({"kind": kind, **f}))
    emit("scenario", id="s", status="ran", records=HELD, probe_after=CORE_ASYNC)
    assert not got[0]["precondition"]["met"]  # no call made in this scenario, nothing new in the log
    emit = llm.scenario_emit(lambda kind, **f: got.append({"kind": kind, **f}))
    llm.calls += CALLS
    with open(log, "a") as f:
        f.write(LOG)
    emit("scenario", id="s", status="ran", records=HELD, probe_after=CORE_ASYNC)
    assert got[1]["precondition"]["met"] and got[1]["client"]["version"] == "1.16.0"


def test_side_process_imports_the_client_file_without_its_package_init(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-ins: the package __init__ (which would import a trainer) is not run, the module file is."""
    pkg = tmp_path / "fwpkg" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "fwpkg" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("raise ImportError('the trainer needs torch')\n")
    (pkg / "client.py").write_text("from fakeaccel.logging import get_logger\nlogger = get_logger(__name__)\n"
                                   "class C:\n    def __init__(self, url):\n        self.url = url\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = Client("fw", "fwpkg", "fwpkg.sub.client", "C", (), (("pause_generation", "pause"),), "keep", True,
                  "", "")
    monkeypatch.setattr("repro.client.side.CLIENTS", {"fw": fake})
    monkeypatch.setattr("repro.client.side.standins", lambda _: (
        StandIn("fw", "fwpkg.sub", "package-init", (), "r", "u"),
        StandIn("fw", "fakeaccel.logging", "module", ("get_logger",), "r", "u")))
    monkeypatch.setattr("importlib.metadata.version", lambda _: "1.0")
    for name in ("fwpkg", "fwpkg.sub", "fwpkg.sub.client", "fakeaccel", "fakeaccel.logging"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    from repro.client.side import load

    cls, facts = load(fake)
    assert cls("http://x").url == "http://x"
    assert facts["file"] == str(pkg / "client.py") and facts["version"] == "1.0"


def test_every_standin_says_why_and_what_still_runs() -> None:
    assert {s.framework for s in STANDINS} <= set(CLIENTS)
    assert all(s.reason and s.unchanged for s in STANDINS)


def test_every_recipe_has_a_client_door_or_says_why_not() -> None:
    from harness.verdicts.frameworks import load_recipes
    from repro.client.clients import NO_CLIENT

    names = {r.name for r in load_recipes()}
    assert names == set(CLIENTS) | set(NO_CLIENT) and not set(CLIENTS) & set(NO_CLIENT)


def _fetch(package: str, _index: str | None) -> list[Release]:
    return [Release("1.0.0", ("any",), ">=3.9", False), Release("1.1.0", ("any",), ">=3.12", False),
            Release("1.2.0rc1", ("any",), None, False), Release("0.9.0", ("any",), None, True),
            Release("1.0.1", ("any",), None, False)]


def test_releases_fit_this_python_and_the_newest_come_first() -> None:
    available = ce.releases(TRL, ce.IndexConfig(), "3.11.7", _fetch)
    assert available == ["1.0.0", "1.0.1"]  # 1.1.0 needs 3.12, rc and yanked left out
    assert ce.chosen_versions(TRL, None, available) == ("1.0.1", "1.0.0")
    assert ce.chosen_versions(TRL, "1.0.0", available) == ("1.0.0",)
    says = "unknown --framework-version '2.0' for trl; the index has: 1.0.0, 1.0.1"
    with pytest.raises(BadInput, match=re.escape(says)):
        ce.chosen_versions(TRL, "2.0", available)


def test_a_package_that_fails_to_install_names_the_installers_last_line(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        failed = "install" in cmd
        return subprocess.CompletedProcess(cmd, 1 if failed else 0, "", "Resolved\n  x No solution: trl==1.16.0"
                                           if failed else "")
    monkeypatch.setattr(ce.subprocess, "run", run)
    monkeypatch.setattr(ce, "uv_bin", lambda: "uv")
    with pytest.raises(ce.ClientEnvError, match=r"installing trl==1.16.0 failed: x No solution: trl==1.16.0"):
        ce.ensure_client_env(TRL, "1.16.0", tmp_path, "3.11", ce.IndexConfig(), "3.11.7")
    built = ce.ClientEnv("trl", "1.15.0", "py", tmp_path)

    def build(v: str) -> ce.ClientEnv:
        if v == "1.16.0":
            raise ce.ClientEnvError("installing trl==1.16.0 failed: boom")
        return built
    assert ce.newest_that_installs(TRL, ("1.16.0", "1.15.0"), build) == (built, ("installing trl==1.16.0 failed: "
                                                                                  "boom",))


def test_error_results_only_for_client_cells() -> None:
    from harness.core.cell import Cell
    from harness.frontends.commands.fwclient import ClientSetup, error_results

    setup = ClientSetup(TRL, None, ("installing trl==1.16.0 failed: boom",))
    cells = [Cell(version="0.21.0", door="client"), Cell(version="0.21.0")]
    (res,) = error_results(setup, cells)
    assert res.outcome is Outcome.ERROR and res.reason == "door=client: installing trl==1.16.0 failed: boom"
    assert setup.lines()[0] == "client door: trl: ERROR: installing trl==1.16.0 failed: boom"
    ok = ClientSetup(TRL, ce.ClientEnv("trl", "1.16.0", "py", Path("/e")), ())
    lines = ok.lines()
    assert lines[0].startswith("client door: trl 1.16.0, trl.experimental.async_grpo.vllm_client.VLLMClient")
    assert "weight swap in weight-sync cells: the harness's reload" in lines[1]


@pytest.mark.parametrize(("argv", "says"), [
    (["--door", "client", "--framework", "verl"], "verl has no client door yet (verl 0.9.1's vLLMHttpServer"),
    (["--door", "client"], "one framework at a time"),
    (["--framework", "trl", "--framework-version", "1.16.0"], "--framework-version and --no-recipe-door need"),
    (["--door", "client", "--framework", "trl", "--framework-version", "2.0"], "the index has: 1.0.0, 1.0.1"),
])
def test_bad_client_door_input_exits_2(argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setattr(ce, "fetch_releases", _fetch)
    monkeypatch.setattr("harness.envbuild.client_python.find_python", lambda *_: FoundPython("py", "3.11.7"))
    assert main(["frameworks", "check", *argv, "--versions", "0.21.0", "--reports", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_the_docs_list_every_standin_in_one_table() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "frameworks.md").read_text()
    rows = [ln for ln in docs.splitlines()
            if ln.startswith(("| TRL | `", "| SkyRL | `", "| AReaL | `", "| OpenRLHF | `"))]
    assert sorted(ln.split("`")[1] for ln in rows) == sorted(s.module for s in STANDINS)


@pytest.mark.parametrize(("given", "unsupported", "says"), [
    (None, True, "needs a framework's client"),
    ({"framework": "trl", "error": "installing trl==1.16.0 failed: boom"}, False, "boom"),
    ({"framework": "nope", "python": "py"}, False, "no client door for 'nope'"),
])
def test_a_client_that_cannot_run(given: dict[str, Any] | None, unsupported: bool, says: str, tmp_path: Path) -> None:
    from repro.client.door import ClientUnavailable, open_client

    with pytest.raises(ClientUnavailable, match=says) as exc:
        open_client(_Http(), given, "http://x", tmp_path)  # type: ignore[arg-type]
    assert exc.value.unsupported is unsupported


def test_matrix_door_client_without_a_framework_starts_no_server(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    import types

    from repro.server import door

    def started(*_: Any, **__: Any) -> Any:
        raise AssertionError("a server was started for cells that cannot run")

    monkeypatch.setitem(sys.modules, "httpx", types.ModuleType("httpx"))  # in vLLM's envs, not the dev venv's
    monkeypatch.setattr(door.Server, "start", started)
    refused: list[str] = []
    spec = types.SimpleNamespace(engine=types.SimpleNamespace(axes={"door": "client"}), client=None)
    asyncio.run(door.run_server_door(spec, None, {}, {}, {}, lambda *a, **k: None, refused.append,  # type: ignore[arg-type]
                                     tmp_path))
    assert len(refused) == 1 and "door=client needs a framework's client" in refused[0]


@pytest.mark.parametrize(("argv", "says"), [
    (["--client", "trl"], "--client needs the client door: add --door client (or all)"),
    (["--door", "client", "--client", "nope"], "unknown --client framework 'nope'; valid choices: trl"),
    (["--door", "client", "--client", "trl==2.0"], "unknown --framework-version '2.0' for trl"),
])
def test_matrix_client_bad_input_exits_2(argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setattr(ce, "fetch_releases", _fetch)
    monkeypatch.setattr("harness.envbuild.client_python.find_python", lambda *_: FoundPython("py", "3.11.7"))
    assert main(["matrix", *argv, "--versions", "0.21.0", "--platform", "cpu",
                 "--reports", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_matrix_client_carries_the_env_or_its_install_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from harness.frontends.commands.fwclient import matrix_client

    ctx = SimpleNamespace(python="3.11", index=ce.IndexConfig(), cache=Path("/nonexistent"))
    monkeypatch.setattr(ce, "fetch_releases", _fetch)
    monkeypatch.setattr("harness.envbuild.client_python.find_python", lambda *_: FoundPython("py", "3.11.7"))

    def fails(*_: Any, **__: Any) -> ce.ClientEnv:
        raise ce.ClientEnvError("installing trl==1.0.0 failed: boom")
    monkeypatch.setattr(ce, "ensure_client_env", fails)
    assert matrix_client(ctx, "trl==1.0.0") == {"framework": "trl", "error": "installing trl==1.0.0 failed: boom"}  # type: ignore[arg-type]
    monkeypatch.setattr(ce, "ensure_client_env", lambda c, v, *_: ce.ClientEnv("trl", v, "/py", Path("/e")))
    assert matrix_client(ctx, "trl") == {"framework": "trl", "version": "1.0.1", "python": "/py"}  # type: ignore[arg-type]
