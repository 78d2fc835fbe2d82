"""Where the server door finds vLLM's server pieces per release (repro.core.server_layout,
repro.patches.server_probe.install,
the shim's probe install): fake module trees shaped like each release's, no vLLM import."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from repro.core import server_layout as layout
from repro.patches.server_probe import install
from repro.server.args import ArgMappingError, _server_parser

pytestmark = pytest.mark.unit

# The modules (with the attributes the door reads) of each layout, as read in the wheels (layout.py's table).
OLD = {"vllm.entrypoints.openai.cli_args": ["make_arg_parser"],
       "vllm.entrypoints.openai.api_server": ["build_app", "run_server_worker"]}
LAUNCHERS = {"vllm.entrypoints.launchers.cli_args": ["make_arg_parser"],
             "vllm.entrypoints.launchers.api_server.entry": ["build_app", "run_server_worker"],
             # the deprecated shim re-exports build_app; nothing calls it there
             "vllm.entrypoints.openai.api_server": ["build_app", "run_server_worker"]}
COMMON = {**{k: v for k, v in LAUNCHERS.items() if "launchers.cli_args" not in k},
          "vllm.entrypoints.common.cli_args": ["make_arg_parser"]}


class Tree:
    """A fake vLLM: an importer and a finder over ``modules`` (name -> attributes), recording imports."""

    def __init__(self, modules: dict[str, list[str]]) -> None:
        self.modules = {name: types.SimpleNamespace(**{a: f"{name}.{a}" for a in attrs})
                        for name, attrs in modules.items()}
        self.imported: list[str] = []

    def importer(self, name: str) -> Any:
        if name not in self.modules:
            raise ModuleNotFoundError(f"No module named {name!r}")
        self.imported.append(name)
        return self.modules[name]

    def finder(self, name: str) -> Any:
        parent = name.rpartition(".")[0]
        if name not in self.modules and not any(m.startswith(parent + ".") for m in self.modules):
            raise ModuleNotFoundError(f"No module named {parent!r}")  # as find_spec when a parent is missing
        return importlib.machinery.ModuleSpec(name, None) if name in self.modules else None


@pytest.mark.parametrize(("tree", "cli", "main"), [
    (OLD, "vllm.entrypoints.openai.cli_args", "vllm.entrypoints.openai.api_server"),
    (LAUNCHERS, "vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.launchers.api_server.entry"),
    (COMMON, "vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.api_server.entry"),
], ids=["0.12-0.28", "0.29-0.32", "0.33"])
def test_each_release_layout_finds_its_parser_and_server_main(tree: dict[str, list[str]], cli: str,
                                                               main: str) -> None:
    fake = Tree(tree)
    assert layout.make_arg_parser(fake.importer) == f"{cli}.make_arg_parser"
    assert layout.server_main(fake.finder) == main


def test_the_deprecated_shim_is_never_the_server_main_when_the_launcher_exists() -> None:
    # 0.29+ keep openai/api_server.py (with its own __main__ and a build_app nothing calls): running it would
    # leave the probe wrapping an unused build_app, so the launcher entry must win.
    fake = Tree(LAUNCHERS)
    assert layout.server_main(fake.finder) == "vllm.entrypoints.launchers.api_server.entry"
    assert layout.SERVER_MAIN[0].module == "vllm.entrypoints.launchers.api_server.entry"


def test_a_module_without_the_attribute_is_passed_over() -> None:
    fake = Tree({"vllm.entrypoints.common.cli_args": [], "vllm.entrypoints.launchers.cli_args": ["make_arg_parser"]})
    assert layout.make_arg_parser(fake.importer) == "vllm.entrypoints.launchers.cli_args.make_arg_parser"


def test_an_unknown_layout_is_refused_with_every_module_tried() -> None:
    fake = Tree({"vllm.entrypoints.elsewhere.cli_args": ["make_arg_parser"]})
    with pytest.raises(layout.LayoutError) as exc:
        layout.make_arg_parser(fake.importer)
    for home in layout.CLI_ARGS:
        assert home.module in str(exc.value) and home.releases in str(exc.value)
    with pytest.raises(layout.LayoutError, match="server modules"):
        layout.server_main(fake.finder)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No module of vLLM's server importable (as in a release with an unknown layout)."""
    for home in layout.CLI_ARGS:
        monkeypatch.setitem(sys.modules, home.module, None)  # None in sys.modules: import raises ImportError
    yield


def test_the_server_parser_of_an_unknown_layout_refuses_the_cell(fake_vllm: None) -> None:
    with pytest.raises(ArgMappingError, match="does not know this vLLM's server command line"):
        _server_parser()


def test_the_probe_wraps_build_app_once_and_adds_routes_when_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    added: list[object] = []
    monkeypatch.setattr("repro.patches.server_probe._add_routes", added.append)
    module = types.SimpleNamespace(build_app=lambda *a, **k: "app")
    state: dict[str, Any] = {"problems": []}
    install(module, state)
    wrapped = module.build_app
    install(module, state)  # the same module object reached again (as __main__ and by name)
    assert module.build_app is wrapped
    assert "server_probe_routes" not in state  # routes are claimed only when the server really builds its app
    assert module.build_app("args") == "app" and added == ["app"] and state["server_probe_routes"] is True


def test_the_probe_records_a_server_module_without_build_app() -> None:
    state: dict[str, Any] = {"problems": []}
    install(types.ModuleType("vllm.entrypoints.launchers.api_server.entry"), state)
    assert state["problems"] == ["vllm.entrypoints.launchers.api_server.entry has no build_app: no server probe "
                                 "routes"]


def test_the_shim_wraps_the_server_main_it_runs_under(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.patches import shim

    calls: list[tuple[str, str]] = []
    main = types.ModuleType("__main__")
    main.__spec__ = importlib.machinery.ModuleSpec("vllm.entrypoints.launchers.api_server.entry", None)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(shim.server_probe, "install", lambda m, state: calls.append(("install", m.__name__)))
    monkeypatch.setattr(shim, "_after_import", lambda name, patch: calls.append(("after", name)))
    shim._install_server_probe()
    assert calls == [("install", "__main__"), *(("after", h.module) for h in layout.SERVER_MAIN)]


def test_repro_server_layout_imports_nothing_of_the_harness() -> None:
    import ast
    from pathlib import Path

    tree = ast.parse(Path(layout.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.startswith(("harness", "vllm", "torch"))]


def test_the_door_refuses_every_cell_of_an_unknown_layout_and_starts_no_server(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import asyncio

    from repro.server import door

    def no_server(*_: Any) -> str:
        raise layout.LayoutError("this vLLM has none of the server modules the server door knows (...)")

    def started(*_: Any, **__: Any) -> Any:
        raise AssertionError("a server was started for a release the door cannot configure")

    monkeypatch.setitem(sys.modules, "httpx", types.ModuleType("httpx"))  # in vLLM's envs, not the dev venv's
    monkeypatch.setattr(door, "server_main", no_server)
    monkeypatch.setattr(door.Server, "start", started)
    refused: list[str] = []
    spec = types.SimpleNamespace(engine=types.SimpleNamespace(axes={"door": "server"}), client=None)
    asyncio.run(door.run_server_door(spec, Any, {}, {}, {}, lambda *a, **k: None, refused.append,  # type: ignore[arg-type]
                                     tmp_path))
    assert refused == ["door=server: this vLLM has none of the server modules the server door knows (...)"]
