"""A toy async scheduler and adapter for the scheduler tier's executor, runner and fuzzer tests (no vLLM).

The toy keeps the bookkeeping an async scheduler keeps (computed tokens, output placeholders, a discard
counter after a forced preemption) and can be switched to 0.21's one-frame discard *flag* (vllm#42043).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class ToyRequest:
    def __init__(self, rid: str, prompt: list[int], max_tokens: int) -> None:
        self.request_id, self.max_tokens = rid, max_tokens
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0
        self.output: list[int] = []
        self.placeholders = 0
        self.discard = 0
        self.epoch = 0  # resets so far: a frame scheduled before the last one is stale
        self.finished = False
        self.is_prefill_chunk = False
        self.num_preemptions = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output)


class ToyScheduler:
    """An async scheduler in miniature; ``flag=True`` discards one frame after any reset (0.21)."""

    def __init__(self, flag: bool = False, async_: bool = True) -> None:
        self.flag, self.async_ = flag, async_
        self.requests: dict[str, ToyRequest] = {}
        self.running: list[ToyRequest] = []
        self.paused = False

    def add_request(self, req: ToyRequest) -> None:
        self.requests[req.request_id] = req
        self.running.append(req)

    def has_requests(self) -> bool:
        return bool(self.running)

    def schedule(self) -> Any:
        sched: dict[str, int] = {}
        fresh: list[str] = []
        for req in [] if self.paused else self.running:
            if len(req.output) >= req.max_tokens or (not self.async_ and req.placeholders):
                continue
            if req.num_computed_tokens == 0:
                fresh.append(req.request_id)
            n = req.num_prompt_tokens + len(req.output) if req.num_computed_tokens == 0 else 1
            req.num_computed_tokens += n
            req.placeholders += 1
            sched[req.request_id] = n
        # A request scheduled with its whole prefix (new, or resumed after a reset) starts afresh on the worker.
        return SimpleNamespace(num_scheduled_tokens=sched, total_num_scheduled_tokens=sum(sched.values()),
                               scheduled_spec_decode_tokens={}, epochs={r: self.requests[r].epoch for r in sched},
                               scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in fresh])

    def update_from_output(self, so: Any, out: dict[str, list[int]]) -> dict[int, Any]:
        outs = []
        for rid, toks in out.items():
            req = self.requests[rid]
            if req.finished:
                continue
            if req.discard:
                # A frame scheduled before the reset holds no placeholder any more (the reset zeroed them); the
                # flag may also drop the first frame scheduled after it (vllm#42043), whose placeholder goes.
                req.discard -= 1
                if so.epochs.get(rid) == req.epoch:
                    req.placeholders = max(0, req.placeholders - 1)
                continue
            assert req.placeholders >= 1, "placeholder count went negative"
            req.placeholders -= 1
            req.output += toks
            done = len(req.output) >= req.max_tokens
            if done:
                req.finished = True
                self.running.remove(req)
            outs.append(SimpleNamespace(request_id=rid, new_token_ids=toks, finish_reason="length" if done else None))
        return {0: SimpleNamespace(outputs=outs)} if outs else {}

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        for req in self.running:
            # The fix counts every frame still in flight, on top of those earlier resets left to discard.
            req.discard = 1 if self.flag else req.discard + req.placeholders
            req.epoch += 1
            req.num_computed_tokens = 0
            req.placeholders = 0
            req.num_preemptions += 1
        return True

    def finish_requests(self, rids: Any, status: Any) -> None:
        # As vLLM's: one id, several, or None for every request; finished or unknown ids are skipped.
        ids = [rids] if isinstance(rids, str) else list(self.requests) if rids is None else list(rids)
        for rid in ids:
            req = self.requests.get(rid)
            if req is None or req.finished:
                continue
            req.finished = True
            self.running.remove(req)

    def set_pause_state(self, state: Any) -> None:
        self.paused = state == "keep"


class ToyBuilder:
    def __init__(self, pause: bool = True) -> None:
        self.pause = pause

    def request(self, rid: str, prompt: Any, max_tokens: int, hasher: Any, priority: int = 0) -> ToyRequest:
        return ToyRequest(rid, list(prompt), max_tokens)

    def runner_output(self, req_ids: list[str], sampled: list[list[int]], kv_connector: bool = False
                      ) -> dict[str, list[int]]:
        return dict(zip(req_ids, sampled, strict=True))  # the toy has no KV connector: kv_connector is moot

    def pause_states(self) -> dict[str, Any] | None:
        # "new" (PAUSED_NEW) lets the toy's running requests go on, as vLLM's does
        return {"keep": "keep", "new": "new", "unpaused": "unpaused"} if self.pause else None

    def aborted_status(self) -> str:
        return "aborted"


class ToyAdapter(ToyBuilder):
    """What repro.sched.scenario and repro.sched.fuzz take from the adapter: ``sched`` itself, or (a callable) a fresh
    scheduler built from each setup."""

    def __init__(self, sched: ToyScheduler | Callable[[Any], ToyScheduler]) -> None:
        super().__init__()
        self.sched = sched

    def scheduler(self, model_dir: Path, setup: Any) -> ToyScheduler:
        return self.sched if isinstance(self.sched, ToyScheduler) else self.sched(setup)

    def block_hasher(self, block_size: int) -> None:
        return None


def run_fuzz_fresh(flag: bool, spec: Any) -> dict[str, Any]:
    """``run_fuzz`` over the toy in a fresh interpreter, as the fuzzer itself runs (``python -m repro.sched``).

    Measured: the same seeded toy run that falsifies alone drew no fault (or another one) when the whole
    ``tox -e tests`` session had run before it in the same process; a fresh process keeps the draws the seed says."""
    import json
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from toy_sched import ToyAdapter, ToyScheduler\n"
        "from repro.core.wire import FuzzSpec\n"
        "from repro.models.deterministic import cycle_permutation\n"
        "from repro.sched.fuzz import run_fuzz\n"
        "flag, doc = json.loads(sys.argv[1])\n"
        "toys = ToyAdapter(lambda setup: ToyScheduler(flag=flag, async_=setup.is_async))\n"
        "out = run_fuzz(toys, Path('.'), cycle_permutation(64, 0), FuzzSpec.from_json(doc))\n"
        "print(json.dumps(out))\n")
    env_path = [str(here), str(here.parents[1])]
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([flag, spec.to_json()])], capture_output=True,
                          text=True, timeout=600, env={**__import__("os").environ,
                                                       "PYTHONPATH": ":".join(env_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout.splitlines()[-1]))
