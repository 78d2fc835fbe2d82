"""A stand-in engine that fails at start the way vLLM 0.14-0.31 did in issue 21, for the root-cause tests.

Run as ``python failed_start_engine.py SPEC OUT`` (a fake env's ``python``).  Its stdout is the engine log: vLLM-like
INFO lines, then the engine core process's ``EngineCore failed to start.`` with the prefixed traceback of
``torch.distributed.DistNetworkError: ... EADDRINUSE`` (``logger.exception`` in ``run_engine_core``,
``vllm/v1/engine/core.py``), the same traceback again unprefixed from ``multiprocessing``'s bootstrap, then more
INFO lines: the cause ends up 40+ lines above the last line.  Its ``fatal`` event carries only what
``AsyncLLM`` raised: ``RuntimeError: Engine core initialization failed. See root cause above. Failed core
proc(s): {}`` (``vllm/v1/engine/utils.py`` ``wait_for_engine_startup``).  The traceback is a real one, printed by
Python from a real raise.
"""

from __future__ import annotations

import json
import sys
import traceback

POINTER = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
CAUSE = ("The server socket has failed to listen on any local network address. port: 29517, useIpv6: false, "
         "code: -98, name: EADDRINUSE, message: address already in use")
PREFIX = "(EngineCore_DP0 pid=4242) "


class DistNetworkError(RuntimeError):
    pass


DistNetworkError.__module__ = "torch.distributed"


def _init_process_group() -> None:
    raise DistNetworkError(CAUSE)


def _init_device() -> None:
    _init_process_group()


def info(n: int, what: str) -> None:
    for i in range(n):
        print(f"{PREFIX}INFO 12-01 03:08:{i:02d} [{what}.py:{100 + i}] {what} step {i}")


def main() -> int:
    out = sys.argv[2]
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "start", "pid": 1, "pgid": 1, "engine_id": "e", "python": "x"}) + "\n")
    info(30, "gpu_model_runner")
    try:
        _init_device()
    except DistNetworkError:
        tb = traceback.format_exc().rstrip("\n").splitlines()
    print(f"{PREFIX}ERROR 12-01 03:08:43 [core.py:1140] EngineCore failed to start.")
    for ln in tb:
        print(f"{PREFIX}ERROR 12-01 03:08:43 [core.py:1140] {ln}")
    print(f"{PREFIX}Process EngineCore_DP0:")
    for ln in tb:
        print(f"{PREFIX}{ln}")
    print("[rank0]:[W1201 03:08:44 ProcessGroupNCCL.cpp:1538] destroy_process_group() was not called")
    info(12, "core_client")
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "fatal", "reason": POINTER, "traceback": "..."}) + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
