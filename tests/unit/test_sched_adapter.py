"""The adapter's version-independent helpers (no vLLM): fitting calls to signatures, crash sites."""

from __future__ import annotations

from typing import Any

import pytest

from repro.sched.adapter import Unsupported, fit_kwargs, init_of, one_line, vllm_crash_site

pytestmark = pytest.mark.unit


class Base:
    def __init__(self, vllm_config: Any, kv_cache_config: Any, block_size: int, log_stats: bool = False) -> None:
        self.args = (vllm_config, kv_cache_config, block_size, log_stats)


class Forwarding(Base):
    def __init__(self, *args: Any, **kwargs: Any) -> None:  # as AsyncScheduler.__init__ does
        super().__init__(*args, **kwargs)


def test_fit_kwargs_drops_what_a_release_does_not_take_and_refuses_what_it_lacks() -> None:
    offered = {"vllm_config": 1, "kv_cache_config": 2, "block_size": 16, "hash_block_size": 16}
    assert fit_kwargs(init_of(Forwarding), offered, "Forwarding") == {
        "vllm_config": 1, "kv_cache_config": 2, "block_size": 16}
    with pytest.raises(Unsupported, match=r"requires \['block_size'\]"):
        fit_kwargs(Base.__init__, {"vllm_config": 1, "kv_cache_config": 2}, "Base")
    # A bare (*args, **kwargs) signature takes everything it is offered.
    assert fit_kwargs(Forwarding.__init__, offered, "F") == offered


def test_init_of_follows_forwarding_constructors() -> None:
    assert init_of(Forwarding) is Base.__init__
    assert init_of(Base) is Base.__init__


def test_one_line_keeps_pydantics_reason() -> None:
    exc = ValueError("1 validation error for VllmConfig\n  Value error, async needs EAGLE [type=value_error]\n"
                     "    For further information visit https://errors.pydantic.dev")
    assert one_line(exc) == "1 validation error for VllmConfig | Value error, async needs EAGLE [type=value_error]"


def test_crash_site_is_the_innermost_vllm_frame_with_its_source() -> None:
    ns: dict[str, Any] = {}
    path = "/venv/lib/python3.11/site-packages/vllm/v1/core/sched/scheduler.py"
    exec(compile("def inner():\n    raise KeyError('r1')\ndef outer():\n    inner()\n", path, "exec"), ns)
    try:
        ns["outer"]()
    except KeyError as exc:
        assert vllm_crash_site(exc) == ("vllm/v1/core/sched/scheduler.py:2:inner", "")


def test_one_model_config_serves_setups_only_where_create_model_config_reads_no_scheduler_argument() -> None:
    from repro.sched.adapter import model_config_reusable

    class Reads:
        max_model_len = 64

        def create_model_config(self) -> Any:
            return self.max_model_len  # a ModelConfig input (MODEL_FIELDS)

    class AlsoReadsTheScheduler(Reads):
        max_num_seqs = 2

        def create_model_config(self) -> Any:
            return (self.max_model_len, self.max_num_seqs)  # would differ between setups of one key

    assert model_config_reusable(Reads) and not model_config_reusable(AlsoReadsTheScheduler)
    assert not model_config_reusable(object), "no create_model_config: no reuse"


def test_each_config_gets_its_own_deep_copy_of_the_reused_model_config() -> None:
    from repro.sched.adapter import Adapter

    adapter = Adapter.__new__(Adapter)  # no vLLM here: only the memo is exercised
    adapter._model_configs = {}
    made: list[dict[str, list[int]]] = []

    def make() -> dict[str, list[int]]:
        made.append({"hf": [1]})
        return made[-1]

    kwargs = {"model": "m", "max_model_len": 64, "max_num_seqs": 2}
    first = adapter._model_config_of(make, kwargs)()
    first["hf"].append(2)  # what create_engine_config may do to its ModelConfig stays its own
    again = adapter._model_config_of(make, {**kwargs, "max_num_seqs": 4})()
    assert len(made) == 1 and again == {"hf": [1]} and again is not first
    adapter._model_config_of(make, {**kwargs, "max_model_len": 32})()
    assert len(made) == 2, "another max_model_len is another ModelConfig"


def test_sampled_ids_are_handed_in_the_type_the_release_declares() -> None:
    """vLLM 0.11.1-0.11.2 declare ``sampled_token_ids: list[np.ndarray]`` and call ``.tolist()`` on each row; handing
    them lists made vLLM's scheduler raise, a CRASH that was the harness's (docs/results/older-releases-2026-12-05)."""
    from dataclasses import dataclass, field

    import numpy as np

    from repro.sched.adapter import Adapter

    @dataclass
    class Arrays:  # the 0.11.1 declaration (vllm/v1/outputs.py)
        req_ids: list[str]
        req_id_to_index: dict[str, int]
        sampled_token_ids: list[np.ndarray]
        extra: list[int] = field(default_factory=list)

    @dataclass
    class Lists:
        req_ids: list[str]
        req_id_to_index: dict[str, int]
        sampled_token_ids: list[list[int]]

    adapter = Adapter.__new__(Adapter)  # no vLLM here
    adapter.ModelRunnerOutput = Arrays
    out = adapter.runner_output(["a", "b"], [[5], [7, 8]])
    assert [row.tolist() for row in out.sampled_token_ids] == [[5], [7, 8]]
    assert all(isinstance(row, np.ndarray) for row in out.sampled_token_ids)
    adapter.ModelRunnerOutput = Lists
    assert adapter.runner_output(["a"], [[5]]).sampled_token_ids == [[5]]
