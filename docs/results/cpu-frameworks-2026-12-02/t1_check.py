"""Trap T1 against a real `vllm serve`: does vLLM's POST /reset_prefix_cache read SkyRL's JSON body?

SkyRL posts ``json={"reset_running_requests": true}`` (skyrl/backends/skyrl_train/inference_servers/
remote_inference_client.py:1086-1099 at a956457); vLLM's route declares ``reset_running_requests`` as a *query*
parameter (vllm/entrypoints/serve/cache/api_router.py:21-44 of 0.21.0).  This script measures what the route
does with the body, against a control that sends the query parameter, on one stock server (no harness shim:
the plain server SkyRL talks to; CPU, so async scheduling is off, which T1 does not need):

1. start 4 greedy streaming completions and wait until each has streamed ``WARM`` tokens;
2. ``POST /pause?mode=keep&clear_cache=false`` (the requests stay running, frozen, holding their KV blocks);
3. ``POST /reset_prefix_cache`` with the JSON body (SkyRL) or with ``?reset_running_requests=true`` (control);
4. ``POST /resume``, read every stream to its end, then ``vllm:num_preemptions_total`` from ``/metrics`` and
   the server log lines the reset wrote.

A route that read the body would preempt the 4 frozen requests (scheduler.py:1805-1825) and free their blocks;
one that ignores it calls ``reset_prefix_cache(False, False)``, preempts nothing, and the block pool refuses the
reset ("Failed to reset prefix cache because some blocks (N) are not freed yet", block_pool.py:453-458).

Run with a vLLM env's python (httpx is there):  ENV/bin/python t1_check.py ENV/bin/python MODEL_DIR LOG_PATH
It prints one JSON object; exit 0 whatever the answer (it measures, it does not assert).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HOST = "127.0.0.1"
N_REQUESTS, WARM, MAX_TOKENS = 4, 4, 200
PREEMPTIONS = re.compile(r"^vllm:num_preemptions_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start(python: str, model: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--host", HOST, "--port", str(port),
            "--model", model, "--skip-tokenizer-init", "--max-model-len", "256", "--max-num-seqs", "32",
            "--max-num-batched-tokens", "256", "--enforce-eager", "--seed", "0", "--dtype", "float32",
            "--enable-prefix-caching"]
    # VLLM_CPU_KVCACHE_SPACE: a 1 GiB KV cache, as the harness gives its CPU engines (harness/run/process.py).
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


async def healthy(client: httpx.AsyncClient, url: str, proc: subprocess.Popen[bytes]) -> None:
    while proc.poll() is None:
        try:
            if (await client.get(url + "/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.5)  # start-up poll: no event to wait on before the server listens
    raise RuntimeError(f"the server exited with {proc.returncode} before /health answered")


async def stream(client: httpx.AsyncClient, url: str, model: str, rid: str, got: list[int],
                 warm: asyncio.Event) -> None:
    body = {"model": model, "prompt": [3, 7, 11 + int(rid[-1])], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_token_ids": True, "request_id": rid}
    async with client.stream("POST", url + "/v1/completions", json=body, timeout=None) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    got.extend(choice.get("token_ids") or [])
                if len(got) >= WARM:
                    warm.set()


async def preemptions(client: httpx.AsyncClient, url: str) -> float:
    text = (await client.get(url + "/metrics")).text
    return sum(float(m) for m in PREEMPTIONS.findall(text))


async def variant(client: httpx.AsyncClient, url: str, model: str, name: str, log: Path,
                  **reset: Any) -> dict[str, Any]:
    before = await preemptions(client, url)
    warm = [asyncio.Event() for _ in range(N_REQUESTS)]
    got: list[list[int]] = [[] for _ in range(N_REQUESTS)]
    tasks = [asyncio.create_task(stream(client, url, model, f"t1-{name}-{i}", got[i], warm[i]))
             for i in range(N_REQUESTS)]
    await asyncio.wait_for(asyncio.gather(*(w.wait() for w in warm)), 300)
    pause = await client.post(url + "/pause", params={"mode": "keep", "clear_cache": "false"})
    at_pause = [len(g) for g in got]
    offset = log.stat().st_size
    resp = await client.post(url + "/reset_prefix_cache", **reset)
    resume = await client.post(url + "/resume")
    await asyncio.wait_for(asyncio.gather(*tasks), 300)
    after = await preemptions(client, url)
    with log.open("rb") as f:
        f.seek(offset)
        lines = [ln for ln in f.read().decode(errors="replace").splitlines() if "reset prefix cache" in ln.lower()
                 or "Resetting prefix cache" in ln]
    return {"variant": name, "reset_request": reset, "pause_status": pause.status_code,
            "reset_status": resp.status_code, "resume_status": resume.status_code,
            "tokens_at_pause": at_pause, "tokens_at_end": [len(g) for g in got],
            "preemptions": after - before, "server_log": lines}


async def main(python: str, model: str, log: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://{HOST}:{port}"
    t0 = time.monotonic()
    proc = start(python, model, port, log)
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=None) as client:
            await healthy(client, url, proc)
            startup = round(time.monotonic() - t0, 1)
            version = (await client.get(url + "/version")).json().get("version")
            body = await variant(client, url, model, "json-body", log, json={"reset_running_requests": True})
            query = await variant(client, url, model, "query-param", log, params={"reset_running_requests": "true"})
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {"vllm": version, "startup_s": startup, "results": [body, query],
            "body_read": body["preemptions"] > 0}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))), indent=2))
