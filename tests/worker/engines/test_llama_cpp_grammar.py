"""Forced tool calls and token-array embeddings on the llama.cpp engine, against the
generated tiny GGUF, which writes random text and never a tool call on its own: under the
tool-call grammar it must write a call that the API's parser accepts, naming a forced tool,
with arguments that validate against that tool's schema, for every schema shape the grammar
compiler supports and whatever the sampler draws."""

from __future__ import annotations

import json
import threading

import jsonschema_rs
import pytest

from skulk.api.tool_calls import parse_tool_calls
from skulk.shared.types.common import ChatMessage, ToolSpec
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import GeneratedToken
from skulk.worker.engines.llama_cpp.engine import GrammarRejected, InvalidTokens, check_token_ids
from tests.worker.engines.test_llama_cpp import load_engine
from tests.worker.tiny_gguf import TINY_GGUF_MODEL_ID, tiny_gguf  # noqa: F401

pytestmark = pytest.mark.timeout(180)

CALL_MAX_TOKENS = 400
"""Room for the longest call the schemas below allow (bounded strings and arrays)."""

SCHEMAS = {
    "flat": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    }, "required": ["city"]},
    "empty": {},
    "optional_only": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"enum": ["x", "y", 3]}, "c": {"const": "fixed"}}},
    "nested": {"type": "object", "properties": {
        "when": {"type": "object", "properties": {"day": {"type": "integer"}, "note": {"type": ["string", "null"],
                                                                                  "maxLength": 6}},
                 "required": ["day", "note"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 3},
    }, "required": ["when", "tags"]},
    "union": {"type": "object", "properties": {
        "v": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 4}, {"type": "null"}]},
        "w": {"type": "number", "nullable": True},
    }, "required": ["v", "w"]},
    "recursive": {"type": "object", "properties": {"tree": {"$ref": "#/$defs/node"}}, "required": ["tree"],
                  "$defs": {"node": {"type": "object", "properties": {
                      "label": {"type": "string", "maxLength": 4},
                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                      "required": ["label"], "additionalProperties": False}}},
}
TOOLS = [ToolSpec(name=f"tool_{name}", description=f"A {name} tool", parameters=schema)
         for name, schema in SCHEMAS.items()]
NAMES = frozenset(t.name for t in TOOLS)


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    engine = load_engine(tiny_gguf)
    engine.warm_up()
    yield engine
    engine.close()


def forced(tool_choice, **overrides) -> TextGenerationParams:
    fields = dict(model_id=ModelId(TINY_GGUF_MODEL_ID), messages=[ChatMessage(role="user", content="Use a tool.")],
                  tools=TOOLS, tool_choice=tool_choice, max_tokens=CALL_MAX_TOKENS, temperature=1.0)
    return TextGenerationParams(**{**fields, **overrides})


def run(engine, params) -> list[GeneratedToken]:
    return list(engine.generate(params, threading.Event()))


def call_of(tokens):
    text = "".join(t.text for t in tokens)
    assert tokens[-1].finish_reason == "stop", text  # the grammar completed and ended the turn
    (call,) = parse_tool_calls(text, NAMES).calls
    return call.name, json.loads(call.arguments)


@pytest.mark.parametrize("name", list(SCHEMAS))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_named_tool_choice_yields_a_valid_call_of_that_tool(engine, name, seed):
    tool = f"tool_{name}"
    called, arguments = call_of(run(engine, forced({"type": "function", "function": {"name": tool}}, seed=seed)))
    assert called == tool
    assert jsonschema_rs.validator_for(SCHEMAS[name]).is_valid(arguments), arguments


@pytest.mark.parametrize("choice", ["required", {"type": "tool", "name": "tool_flat"}])
def test_greedy_forced_calls_are_valid_and_deterministic(engine, choice):
    first = call_of(run(engine, forced(choice, temperature=0)))
    assert first == call_of(run(engine, forced(choice, temperature=0)))
    name, arguments = first
    assert jsonschema_rs.validator_for(SCHEMAS[name.removeprefix("tool_")]).is_valid(arguments)


@pytest.mark.parametrize("seed", range(6))
def test_required_picks_one_of_the_tools_with_valid_arguments(engine, seed):
    name, arguments = call_of(run(engine, forced("required", seed=seed)))
    assert jsonschema_rs.validator_for(SCHEMAS[name.removeprefix("tool_")]).is_valid(arguments)


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_unforced_requests_are_sampled_without_a_grammar(engine, choice):
    assert engine._grammar(engine.llama, forced(choice)) is None
    assert engine._grammar(engine.llama, forced("required", tools=[])) is None


def test_a_forced_tool_the_grammar_cannot_enforce_fails_typed(engine):
    odd = ToolSpec(name="odd", parameters={"type": "object", "properties": {"s": {"type": "string", "pattern": "a+"}}})
    with pytest.raises(GrammarRejected) as caught:
        run(engine, forced("required", tools=[odd]))
    assert caught.value.error_type == "InvalidRequest" and "pattern" in str(caught.value)
    assert engine.in_flight == 0
    # The engine is still usable afterwards.
    assert call_of(run(engine, forced({"type": "tool", "name": "tool_flat"}, temperature=0)))[0] == "tool_flat"


def test_forced_calls_leave_later_generations_unconstrained(engine):
    params = forced("auto", temperature=0, max_tokens=10)
    before = [t.token_id for t in run(engine, params)]
    run(engine, forced("required", temperature=0))
    assert [t.token_id for t in run(engine, params)] == before


# -- token-array embeddings -----------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "n_vocab", "bad"),
    [([0, 5, 9], 10, None), ([10], 10, 10), ([3, -1], 10, -1)],
)
def test_check_token_ids(tokens, n_vocab, bad):
    if bad is None:
        check_token_ids(tokens, n_vocab, 0)
        return
    with pytest.raises(InvalidTokens) as caught:
        check_token_ids(tokens, n_vocab, 2)
    assert f"input[2] holds token id {bad}" in str(caught.value) and caught.value.error_type == "InvalidRequest"


def test_token_inputs_embed_like_the_text_they_tokenize_to(engine):
    text = "hello world"
    tokens = engine.llama.tokenize(text.encode(), add_bos=engine._adds_bos(), special=False)
    (from_text,), used_text = engine.embed([text])
    (from_tokens,), used_tokens = engine.embed([tokens])
    assert from_tokens == pytest.approx(from_text, abs=1e-6) and used_tokens == used_text == len(tokens)
    vectors, used = engine.embed([tokens, tokens[1:]], dimensions=8)
    assert len(vectors) == 2 and all(len(v) == 8 for v in vectors) and used == 2 * len(tokens) - 1


def test_token_ids_outside_the_vocabulary_are_refused(engine):
    with pytest.raises(InvalidTokens):
        engine.embed([[1, 2], [engine.llama.n_vocab()]])
    assert engine.in_flight == 0
    assert engine.embed([[1, 2]])[1] == 2


def test_a_grammar_llama_cpp_cannot_parse_fails_the_request_not_the_process(engine, monkeypatch):
    import skulk.worker.engines.llama_cpp.engine as module

    monkeypatch.setattr(module, "request_grammar", lambda tools, choice, response_format: 'root ::= "{" undefined-rule')
    with pytest.raises(GrammarRejected):
        run(engine, forced("required"))
    assert engine.in_flight == 0
