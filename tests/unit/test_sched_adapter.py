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
