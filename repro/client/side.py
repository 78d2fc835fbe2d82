"""The side process of the client door: runs in the framework's side environment (its released package installed
with ``--no-deps``; no vLLM, no torch), imports the framework's own client with the stand-ins of
``repro.client.clients.STANDINS`` and calls its methods on request.

``python -m repro.client.side FRAMEWORK URL``: one JSON line first (``ready``: the framework's version, the module
and the file imported, or the import's error), then one JSON line of answer per JSON line of request
(``{"method": "pause"}``, with ``"kwargs"`` where the call takes any -> ``{"ok": true, "method": "pause", "t0":
..., "t1": ...}`` or ``{"ok": false, "error": ...}``).  Standard library only besides the framework.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
import time
import traceback
import types
from typing import Any

from repro.client.clients import CLIENTS, Client, StandIn, standins


def _package_init(s: StandIn) -> None:
    """The package at its real folder, its ``__init__`` not run: its modules import from the installed files."""
    parent, _, child = s.module.rpartition(".")
    parent_mod = importlib.import_module(parent)  # the parents' __init__ run as released
    folder = os.path.join(os.path.dirname(parent_mod.__file__ or ""), child)
    mod = types.ModuleType(s.module)
    mod.__path__ = [folder]
    mod.__package__ = s.module
    sys.modules[s.module] = mod
    setattr(parent_mod, child, mod)


def _not_called(name: str) -> Any:
    def called(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"the client door's stand-in {name} was called: the framework path it serves is not run")
    return called


def _remote(cls: Any) -> Any:
    """``ray.remote`` as a stand-in: the class unchanged (the door builds and calls it in-process)."""
    return cls


# What a "module" stand-in's ``provides`` names are bound to.
PROVIDED: dict[str, Any] = {
    "get_logger": logging.getLogger,
    "remote": _remote,
    "placement_group": _not_called("ray.util.placement_group.placement_group"),
    "PlacementGroupSchedulingStrategy": _not_called("ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy"),
}


def _module(s: StandIn) -> None:
    mod = types.ModuleType(s.module)
    for name in s.provides:
        setattr(mod, name, PROVIDED[name])
    # A stand-in with stand-ins below it (ray above ray.util.placement_group) is a package.
    if any(o.module.startswith(s.module + ".") for o in standins(s.framework)):
        mod.__path__ = []
    parts = s.module.split(".")
    for i in range(1, len(parts)):  # parents that are absent become empty packages
        name = ".".join(parts[:i])
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            pkg = types.ModuleType(name)
            pkg.__path__ = []
            sys.modules[name] = pkg
    sys.modules[s.module] = mod


def load(c: Client) -> tuple[Any, dict[str, Any]]:
    """The framework's client class, with the stand-ins in place, and what was imported."""
    for s in standins(c.framework):
        if s.kind == "package-init":
            _package_init(s)
        elif s.kind == "module":
            _module(s)
    module = importlib.import_module(c.module)
    return getattr(module, c.cls), {"framework": c.framework, "version": importlib.metadata.version(c.package),
                                    "module": c.module, "cls": c.cls, "file": module.__file__,
                                    "standins": [s.module for s in standins(c.framework)]}


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    framework, url = argv
    try:
        c = CLIENTS[framework]
        cls, facts = load(c)
        client = c.construct(cls, url)
    except Exception as exc:
        _say({"ready": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return 1
    _say({"ready": True, **facts})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        method, kwargs = request["method"], request.get("kwargs") or {}
        t0 = time.time()
        try:
            getattr(client, method)(**kwargs)
        except Exception as exc:
            _say({"ok": False, "method": method, "error": f"{type(exc).__name__}: {exc}", "t0": t0,
                  "t1": time.time()})
            continue
        _say({"ok": True, "method": method, "t0": t0, "t1": time.time()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
