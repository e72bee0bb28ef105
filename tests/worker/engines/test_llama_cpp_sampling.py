"""Structured output, repetition penalties and logit bias on the llama.cpp engine, against
the generated tiny GGUF (which writes random text): under a response format's grammar the
output must parse and validate whatever is drawn; penalties and biases must move greedy
output the way their sign says."""

from __future__ import annotations

import collections
import json
import threading

import jsonschema_rs
import pytest

from skulk.shared.types.tasks import ResponseFormat
from skulk.worker.engines.llama_cpp.engine import GrammarRejected, InvalidTokens, logit_bias_processor
from tests.worker.engines.test_llama_cpp import PROMPT, load_engine
from tests.worker.tiny_gguf import LONG_PROMPT, prompt_params, tiny_gguf  # noqa: F401

pytestmark = pytest.mark.timeout(180)

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
}, "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    engine = load_engine(tiny_gguf)
    engine.warm_up()
    yield engine
    engine.close()


def token_ids(engine, params) -> list[int]:
    return [t.token_id for t in engine.generate(params, threading.Event())]


def answer(engine, params) -> tuple[str, str | None]:
    tokens = list(engine.generate(params, threading.Event()))
    return "".join(t.text for t in tokens), tokens[-1].finish_reason


@pytest.mark.parametrize("seed", range(4))
def test_a_json_schema_response_always_validates(engine, seed):
    text, finish = answer(engine, prompt_params(
        PROMPT, temperature=1.0, seed=seed, max_tokens=200,
        response_format=ResponseFormat(type="json_schema", json_schema=PERSON)))
    # Under the grammar the model can only end once the document is complete.
    assert finish == "stop"
    assert jsonschema_rs.validator_for(PERSON).is_valid(json.loads(text)), text


@pytest.mark.parametrize("seed", range(3))
def test_a_json_object_response_is_an_object(engine, seed):
    # Random text almost never closes a string, so the quote and brace are favoured: what
    # is checked is that the grammar makes every ending a JSON object.
    quote, brace = engine.llama.tokenize(b'"', add_bos=False)[0], engine.llama.tokenize(b"}", add_bos=False)[0]
    text, finish = answer(engine, prompt_params(
        PROMPT, temperature=1.0, seed=seed, max_tokens=300, logit_bias={quote: 10.0, brace: 10.0},
        response_format=ResponseFormat(type="json_object")))
    assert finish == "stop"
    assert isinstance(json.loads(text), dict), text


def test_an_unenforceable_schema_fails_the_request(engine):
    with pytest.raises(GrammarRejected, match="'pattern'"):
        answer(engine, prompt_params(PROMPT, response_format=ResponseFormat(
            type="json_schema", json_schema={"type": "string", "pattern": "^a"})))


def test_logit_bias_bans_and_forces_tokens(engine):
    greedy = token_ids(engine, prompt_params(PROMPT, temperature=0, max_tokens=8))
    banned = token_ids(engine, prompt_params(PROMPT, temperature=0, max_tokens=8, logit_bias={greedy[0]: -100}))
    assert banned[0] != greedy[0] and greedy[0] not in banned
    forced = token_ids(engine, prompt_params(PROMPT, temperature=0, max_tokens=5, logit_bias={7: 100}))
    assert forced == [7] * 5


def test_logit_bias_outside_the_vocabulary_is_refused(engine):
    with pytest.raises(InvalidTokens, match="logit_bias"):
        logit_bias_processor({10**6: 1.0}, engine.llama.n_vocab())


def distinct(engine, **penalty) -> int:
    return len(collections.Counter(token_ids(engine, prompt_params(LONG_PROMPT, temperature=0, max_tokens=64,
                                                                    **penalty))))


@pytest.mark.parametrize(("penalty", "more_varied"), [
    ({"frequency_penalty": 2.0}, True),
    ({"presence_penalty": 2.0}, True),
    ({"repeat_penalty": 1.8}, True),
    ({"frequency_penalty": -2.0}, False),
])
def test_penalties_move_greedy_output_the_way_their_sign_says(engine, penalty, more_varied):
    plain, penalised = distinct(engine), distinct(engine, **penalty)
    assert (penalised > plain) if more_varied else (penalised < plain), (plain, penalised)


def test_prompt_logprobs_score_each_prompt_token_as_generation_would(engine):
    """Echo with logprobs: every prompt token after the first is scored given the tokens
    before it. The distribution at the last prompt position must be the one generation
    draws its first token from when the prompt stops just before that token."""
    _, full = engine._prompt(prompt_params(PROMPT))
    _, head = engine._prompt(prompt_params(PROMPT.rsplit(" ", 1)[0]))
    assert full[: len(head)] == head and len(full) == len(head) + 1  # the last word is one token
    scored = list(engine.generate(prompt_params(PROMPT, max_tokens=2, temperature=0, logprobs=True, top_logprobs=3,
                                                prompt_logprobs=True), threading.Event()))
    entries = scored[0].prompt_logprobs
    assert [e.token_id for e in entries] == full[1:]  # the BOS the engine added is not the caller's text
    assert "".join(e.token for e in entries).strip() == PROMPT
    assert all(e.logprob is not None and e.logprob <= 0 and len(e.top_logprobs) == 3 for e in entries)
    assert all(t.prompt_logprobs is None for t in scored[1:])
    steps = list(engine.generate(prompt_params(PROMPT.rsplit(" ", 1)[0], max_tokens=1, temperature=0,
                                               logprobs=True, top_logprobs=3), threading.Event()))
    step = steps[0]
    assert [t.token_id for t in step.top_logprobs] == [t.token_id for t in entries[-1].top_logprobs]
    assert [t.logprob for t in step.top_logprobs] == pytest.approx([t.logprob for t in entries[-1].top_logprobs],
                                                                   abs=1e-3)
    # Scoring leaves the context as generation expects it: greedy output is unchanged.
    plain = token_ids(engine, prompt_params(PROMPT, max_tokens=2, temperature=0))
    assert [t.token_id for t in scored] == plain


def test_min_p_of_one_keeps_only_the_most_likely_token(engine):
    """min_p drops every token below min_p x the top probability: at 1.0 sampling at any
    temperature gives the greedy tokens (the default 0.05 does not)."""
    sampled = prompt_params(PROMPT, temperature=1.5, top_k=0, top_p=1.0, min_p=1.0, seed=3, max_tokens=16)
    assert token_ids(engine, sampled) == token_ids(engine, prompt_params(PROMPT, temperature=0.0, max_tokens=16))
