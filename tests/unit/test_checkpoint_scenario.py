"""vLLM 0.34.0's engine checkpoint (repro/scenarios/checkpoint.py) against a fake AsyncLLM: the calls in order, the
refused resume while prepared, and the oracle seeing a token lost across the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeLLM
from test_profile_scenarios import _play, model  # noqa: F401 -- the module-scoped checkpoint fixture

from harness.core.cell import Cell, at_release
from harness.core.oracle import Outcome, cell_verdict
from harness.core.recorded_streams import stream_records
from harness.core.scenarios import BY_SCENARIO
from harness.plan.matrix import plan_cells
from repro.scenarios.vocab import ScenarioFailed, ScenarioUnsupported

pytestmark = pytest.mark.unit


class CheckpointLLM(FakeLLM):
    """0.34.0's state machine: prepare pauses and needs a few polls to reach PREPARED; resume refuses while
    prepared; restore wakes the KV cache and resumes by itself (v1/engine/core.py:2471-2513)."""

    def __init__(self, perm: list[int], *, resume_refuses: bool = True, **kw: Any) -> None:
        super().__init__(perm, **kw)
        self.state, self.polls_left, self.resume_refuses = "running", 0, resume_refuses

    async def checkpoint_prepare(self, mode: str = "wait") -> str | None:
        self.calls.append(f"checkpoint_prepare({mode})")
        await self.pause_generation(mode, True)
        self.state, self.polls_left = "preparing", 2
        return None

    async def checkpoint_state(self) -> tuple[str, str | None]:
        if self.state == "preparing":
            self.polls_left -= 1
            if self.polls_left <= 0:
                self.state = "prepared"
        return self.state, None

    async def resume_generation(self) -> None:
        if self.state == "prepared" and self.resume_refuses:
            self.calls.append("resume refused")
            raise Exception("Call to resume_scheduler method failed: Cannot resume scheduling while the checkpoint "
                            "state is prepared")
        await super().resume_generation()

    async def checkpoint_restore(self) -> None:
        self.calls.append("checkpoint_restore")
        self.state = "running"
        self.running.set()


def _run(llm: FakeLLM, model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
         mode: str = "keep") -> dict[str, Any]:
    return _play("checkpoint", llm, model, tmp_path, monkeypatch, mode=mode, clear_cache=True, max_tokens=24,
                 pause_after=6)


@pytest.mark.parametrize("mode", ["keep", "wait"])
def test_checkpoint_prepares_refuses_resume_reloads_and_restores(model: dict[str, Any], tmp_path: Path,  # noqa: F811
                                                                 monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    llm = CheckpointLLM(model["perm"])
    out = _run(llm, model, tmp_path, monkeypatch, mode)
    calls = [c for c in llm.calls if c.startswith(("checkpoint", "resume", "reload"))]
    assert calls == [f"checkpoint_prepare({mode})", "resume refused", "reload_weights", "checkpoint_restore"]
    (enter,) = [e for e in out["events"] if e["event"] == "pause_enter"]
    assert enter["state_polls"] >= 1 and "Cannot resume scheduling" in enter["resume_refused"]
    v = cell_verdict(stream_records(out["records"]))
    assert v.outcome is Outcome.OK, v.summary


def test_a_resume_that_runs_while_prepared_fails_the_scenario(model: dict[str, Any], tmp_path: Path,  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ScenarioFailed, match="did not refuse"):
        _run(CheckpointLLM(model["perm"], resume_refuses=False), model, tmp_path, monkeypatch)


def test_a_token_lost_across_the_checkpoint_is_a_finding(model: dict[str, Any], tmp_path: Path,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    lost: set[str] = set()

    def drop_after_restore(rid: str, i: int, tok: int) -> list[int]:
        if "checkpoint_restore" in llm.calls and "-r" in rid and "-solo-" not in rid and rid not in lost:
            lost.add(rid)
            return []
        return [tok]

    llm = CheckpointLLM(model["perm"], tamper=drop_after_restore)
    v = cell_verdict(stream_records(_run(llm, model, tmp_path, monkeypatch)["records"]))
    assert v.outcome is Outcome.LOSS and v.label == "LOSS(1)"


def test_releases_without_the_engine_checkpoint_are_unsupported(model: dict[str, Any], tmp_path: Path,  # noqa: F811
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    llm = CheckpointLLM(model["perm"])

    async def old_prepare() -> None:  # 0.33.0: AsyncLLM.checkpoint_prepare(self) -> None, workers only
        return None

    llm.checkpoint_prepare = old_prepare  # type: ignore[method-assign,assignment]
    with pytest.raises(ScenarioUnsupported, match="takes no mode"):
        _run(llm, model, tmp_path, monkeypatch)


def test_the_checkpoint_cells_need_sleep_mode_and_pause_in_keep_and_wait() -> None:
    shape = BY_SCENARIO["checkpoint"]
    assert (shape.profile, shape.modes, shape.clear_caches) == ("sleep", ("keep", "wait"), (True,))
    cells = [at_release(Cell("0.34.0", "mp", True, m, True, scenario="checkpoint")) for m in ("keep", "wait", "abort")]
    plan = plan_cells(cells, "cuda")
    assert [c.mode for c, _ in plan.unsupported] == ["abort"]
