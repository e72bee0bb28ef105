"""Forced tool calls (OpenAI tool_choice "required" / a named function, Anthropic "any" /
"tool") at the API, in-process through the official SDKs: the choice reaches the runner
unchanged (the engine builds the grammar from it), and a forced tool whose schema no
grammar can enforce is the caller's 400 in their own wire shape, before anything is sent
to the cluster. That the engine then really writes a valid call is tested with llama.cpp
(tests/worker/engines/test_llama_cpp_grammar.py) and end to end (tests/e2e/test_sdk_features.py)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from skulk.shared.types.commands import GenerateText
from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import LLAMA_CALL, WEATHER_TOOL, anthropic_sdk, openai_sdk

PATTERN_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}}}
ODD_TOOL = {"type": "function", "function": {"name": "odd", "parameters": PATTERN_SCHEMA}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.mark.parametrize(("choice", "tools"), [
    ("required", [WEATHER_TOOL]),
    # Only the named tool is forced: another tool's unenforceable schema does not matter.
    ({"type": "function", "function": {"name": "get_weather"}}, [WEATHER_TOOL, ODD_TOOL]),
])
async def test_openai_forced_choice_reaches_the_runner_and_the_call_comes_back(choice, tools):
    app, cluster = scripted_app(LLAMA_CALL, finish="stop")
    reply = await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice=choice)
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert cluster.params().tool_choice == choice


@pytest.mark.parametrize(("choice", "param"), [
    ("required", "tools[1].function.parameters"),
    ({"type": "function", "function": {"name": "odd"}}, "tools[1].function.parameters"),
])
async def test_openai_forced_choice_of_an_unenforceable_schema_is_a_400(choice, param):
    app, cluster = scripted_app(LLAMA_CALL)
    with pytest.raises(openai.BadRequestError) as caught:
        await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER_TOOL, ODD_TOOL],
                                                      tool_choice=choice)
    error = caught.value.body
    assert error["param"] == param and error["code"] == "unsupported_tool_schema"
    assert "'pattern'" in error["message"] and "odd" in error["message"]
    assert not [c for c in cluster.commands if isinstance(c, GenerateText)]


async def test_openai_auto_choice_with_an_unenforceable_schema_is_served():
    app, _ = scripted_app(["Sunny."])
    reply = await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, tools=[ODD_TOOL],
                                                          tool_choice="auto")
    assert reply.choices[0].message.content == "Sunny."


ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Weather", "input_schema": WEATHER_TOOL["function"]["parameters"]},
    {"name": "odd", "input_schema": PATTERN_SCHEMA},
]


@pytest.mark.parametrize(("choice", "internal"), [
    ({"type": "any"}, "required"),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
])
async def test_anthropic_forced_choice_reaches_the_runner(choice, internal):
    app, cluster = scripted_app(LLAMA_CALL)
    reply = await anthropic_sdk(app).messages.create(model=MODEL, max_tokens=64, messages=ASK,
                                                     tools=ANTHROPIC_TOOLS[:1], tool_choice=choice)
    assert reply.stop_reason == "tool_use" and reply.content[0].input == {"city": "Paris"}
    assert cluster.params().tool_choice == internal


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "odd"}])
async def test_anthropic_forced_choice_of_an_unenforceable_schema_is_a_400(choice):
    app, cluster = scripted_app(LLAMA_CALL)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await anthropic_sdk(app).messages.create(model=MODEL, max_tokens=64, messages=ASK, tools=ANTHROPIC_TOOLS,
                                                 tool_choice=choice)
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "'pattern'" in caught.value.body["error"]["message"]
    assert not [c for c in cluster.commands if isinstance(c, GenerateText)]


async def test_the_400_is_raw_json_in_each_shape():
    app, _ = scripted_app(LLAMA_CALL)
    async with asgi_http(app) as http:
        openai_reply = await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": ASK, "tools": [ODD_TOOL], "tool_choice": "required"})
        anthropic_reply = await http.post("/v1/messages", json={
            "model": MODEL, "max_tokens": 8, "messages": ASK, "tools": ANTHROPIC_TOOLS[1:],
            "tool_choice": {"type": "any"}})
    assert openai_reply.status_code == 400 and openai_reply.json()["error"]["param"] == "tools[0].function.parameters"
    assert anthropic_reply.status_code == 400 and anthropic_reply.json()["error"]["type"] == "invalid_request_error"
