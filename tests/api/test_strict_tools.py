"""`strict: true` on a function tool: the pure checks (table-driven), then the whole path
through the official SDKs on a scripted cluster: a chosen call that breaks its schema is
generated again with the tool forced, so the client only ever receives a valid call."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from skulk.api.errors import InvalidRequest
from skulk.api.strict_tools import (
    StrictViolation,
    check_strict_schemas,
    combined_usage,
    strict_retry_params,
    strict_violation,
)
from skulk.shared.types.common import ToolCall, ToolSpec, Usage
from skulk.shared.types.tasks import TextGenerationParams
from tests.api.scripted_cluster import scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import anthropic_sdk, openai_sdk

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
        "required": ["city"], "additionalProperties": False}
ENFORCEABLE = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
               "additionalProperties": False}
"""A schema the grammar enforces (`maximum` is beyond it)."""
STRICT = ToolSpec(name="get_weather", parameters=CITY, strict=True)
LOOSE = ToolSpec(name="get_weather", parameters=CITY)


def _call(arguments: dict, name: str = "get_weather") -> ToolCall:
    return ToolCall(id="c1", name=name, arguments=json.dumps(arguments))


@pytest.mark.parametrize(("calls", "tools", "expected"), [
    ([_call({"city": "Paris"})], [STRICT], None),
    ([_call({"city": 5})], [STRICT], StrictViolation("get_weather", "/city", "5 is not of type 'string'")),
    ([_call({})], [STRICT], StrictViolation("get_weather", "/", "'city' is a required property")),
    ([_call({"city": "Paris", "days": 9})], [STRICT],
     StrictViolation("get_weather", "/days", "9 is greater than the maximum of 7")),
    ([_call({"city": "Paris", "x": 1})], [STRICT], StrictViolation(
        "get_weather", "/", "Additional properties are not allowed ('x' was unexpected)")),
    ([_call({"city": 5})], [LOOSE], None),                       # not strict: delivered as the model wrote it
    ([_call({"q": 1}, name="search")], [STRICT, ToolSpec(name="search")], None),
])
def test_the_first_call_that_breaks_a_strict_schema(calls, tools, expected):
    assert strict_violation(calls, tools) == expected


def test_a_strict_tool_whose_schema_is_not_json_schema_is_refused():
    bad = ToolSpec(name="f", parameters={"type": "object", "properties": {"a": {"type": "strin"}}}, strict=True)
    with pytest.raises(InvalidRequest, match="is strict, but its schema is not valid JSON Schema") as caught:
        check_strict_schemas([LOOSE, bad], lambda i: f"tools[{i}].parameters")
    assert caught.value.param == "tools[1].parameters"
    check_strict_schemas([bad.model_copy(update={"strict": False})], lambda i: "")  # not strict: not checked


def test_the_retry_forces_the_tool_or_says_it_cannot():
    enforceable = STRICT.model_copy(update={"parameters": ENFORCEABLE})
    params = TextGenerationParams(model_id=MODEL, messages=[{"role": "user", "content": "?"}], tools=[enforceable],
                                  tool_choice="auto")
    violation = StrictViolation("get_weather", "/city", "bad")
    retry = strict_retry_params(params, violation)
    assert retry is not None and retry.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert strict_retry_params(params.model_copy(update={"tools": [STRICT]}), violation) is None


@pytest.mark.parametrize(("first", "retry", "expected"), [
    (Usage(prompt_tokens=7, completion_tokens=3, total_tokens=10, cached_tokens=2),
     Usage(prompt_tokens=7, completion_tokens=4, total_tokens=11, cached_tokens=7),
     Usage(prompt_tokens=7, completion_tokens=7, total_tokens=14, cached_tokens=2)),
    (None, Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2), Usage(prompt_tokens=1, completion_tokens=1,
                                                                              total_tokens=2)),
])
def test_usage_of_a_call_generated_twice(first, retry, expected):
    assert combined_usage(first, retry) == expected


# -- through the SDKs -------------------------------------------------------------------

OPENAI_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": ENFORCEABLE, "strict": True}}
BROKEN = ['<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": 5}}', "\n</tool_call>"]
FORCED = ['{"name": "get_weather", "parameters": ', '{"city": "Paris"}}']


def _script(params):
    """The model breaks the schema when it chooses; forced, its grammar makes it valid."""
    return FORCED if isinstance(params.tool_choice, dict) else BROKEN


async def test_a_chosen_call_that_breaks_its_strict_schema_is_generated_again_forced():
    app, cluster = scripted_app(_script)
    reply = await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=[OPENAI_TOOL])
    (call,) = reply.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris"} and reply.choices[0].finish_reason == "tool_calls"
    assert reply.usage.completion_tokens == 3 + 3  # both runs' tokens
    first, retry = cluster.all_params()
    assert first.tool_choice is None and first.tools[0].strict
    assert retry.tool_choice == {"type": "function", "function": {"name": "get_weather"}}

    # Streamed: the broken call never reaches the client, only the valid one.
    app, _ = scripted_app(_script)
    stream = await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=[OPENAI_TOOL], stream=True)
    deltas = [c.choices[0].delta async for c in stream if c.choices]
    arguments = "".join(call.function.arguments or "" for d in deltas for call in d.tool_calls or [])
    assert json.loads(arguments) == {"city": "Paris"} and not any(d.content for d in deltas)


async def test_a_valid_chosen_call_and_a_loose_tool_run_once():
    app, cluster = scripted_app(['<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'])
    await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "?"}], tools=[OPENAI_TOOL])
    assert len(cluster.all_params()) == 1

    loose = {"type": "function", "function": {"name": "get_weather", "parameters": ENFORCEABLE}}
    app, cluster = scripted_app(BROKEN)
    reply = await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "?"}], tools=[loose])
    assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments) == {"city": 5}
    assert len(cluster.all_params()) == 1


async def test_anthropic_and_responses_strict_tools_are_honoured():
    app, cluster = scripted_app(_script)
    message = await anthropic_sdk(app).messages.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Weather?"}],
        tools=[{"name": "get_weather", "input_schema": ENFORCEABLE, "strict": True}])
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert block.input == {"city": "Paris"} and len(cluster.all_params()) == 2

    app, cluster = scripted_app(_script)
    response = await openai_sdk(app).responses.create(
        model=MODEL, input="Weather?", tools=[{"type": "function", "name": "get_weather",
                                               "parameters": ENFORCEABLE, "strict": True}])
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Paris"} and len(cluster.all_params()) == 2


async def test_a_schema_the_grammar_cannot_enforce_ends_in_a_typed_error():
    patterned = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}}, "required": ["city"]}}}
    app, cluster = scripted_app(BROKEN)
    with pytest.raises(openai.APIStatusError) as caught:
        await openai_sdk(app).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "?"}], tools=[patterned])
    assert caught.value.status_code == 502
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "tool_call_invalid", error
    assert "strict tool 'get_weather'" in error["message"] and "'/city'" in error["message"]
    assert len(cluster.all_params()) == 1


async def test_an_invalid_strict_schema_is_a_400_in_each_shape():
    bad = {"type": "object", "properties": {"a": {"type": "strin"}}}
    app, _ = scripted_app(["x"])
    with pytest.raises(openai.BadRequestError, match="not valid JSON Schema"):
        await openai_sdk(app).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "?"}], tools=[
            {"type": "function", "function": {"name": "f", "parameters": bad, "strict": True}}])
    with pytest.raises(anthropic.BadRequestError, match="not valid JSON Schema"):
        await anthropic_sdk(app).messages.create(model=MODEL, max_tokens=8, messages=[
            {"role": "user", "content": "?"}], tools=[{"name": "f", "input_schema": bad, "strict": True}])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk") as http:
        reply = await http.post("/v1/responses", json={"model": MODEL, "input": "?", "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": "yes"}]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools[0].strict"
