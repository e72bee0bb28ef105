"""Tool calls, reasoning and logprobs through each official SDK, in-process: the scripted
runner writes what a tool-calling (or reasoning) model would, and the SDKs must parse the
answers into their own typed objects, streamed and not."""

from __future__ import annotations

import json

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.api.scripted_cluster import scripted_app
from tests.api.test_anthropic_routes import sdk
from tests.api.test_openai_routes import MODEL

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}
HERMES_CALL = ['<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "\n</tool_call>"]
LLAMA_CALL = ['{"name": "get_weather", "parameters": ', '{"city": "Paris"}}']


def openai_sdk(app) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk")
    return openai.AsyncOpenAI(base_url="http://skulk/v1", api_key="unused", http_client=http, max_retries=0)


def anthropic_sdk(app) -> anthropic.AsyncAnthropic:
    return sdk(app)[1]  # the one place that knows which httpx the installed SDK takes


def ollama_sdk(app) -> ollama.AsyncClient:
    return ollama.AsyncClient(host="http://skulk/ollama", transport=httpx.ASGITransport(app=app))


# -- OpenAI ---------------------------------------------------------------------------


@pytest.mark.parametrize("texts", [HERMES_CALL, LLAMA_CALL])
async def test_openai_tool_call_round_trip(texts):
    app, cluster = scripted_app(texts, finish="stop")
    sdk = openai_sdk(app)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = await sdk.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.content is None
    assert reply.usage.completion_tokens == 3
    params = cluster.params()
    assert [t.name for t in params.tools] == ["get_weather"]

    # The round trip: the assistant's call and the tool's answer go back to the model.
    app2, cluster2 = scripted_app(["It is sunny."])
    follow_up = await openai_sdk(app2).chat.completions.create(model=MODEL, tools=[WEATHER_TOOL], messages=[
        *messages,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ])
    assert follow_up.choices[0].message.content == "It is sunny."
    assert follow_up.choices[0].finish_reason == "stop"
    sent = cluster2.params().messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]
    assert sent[1].tool_calls[0].name == "get_weather" and sent[2].tool_call_id == call.id


async def test_openai_streamed_tool_call_is_assembled():
    app, _ = scripted_app(HERMES_CALL)
    stream = await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL], stream=True)
    calls, finish = [], None
    async for chunk in stream:
        for choice in chunk.choices:
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    (call,) = calls
    assert call.index == 0 and call.id and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


async def test_openai_prose_answer_to_a_tool_request():
    app, _ = scripted_app(["I cannot ", "check the weather."], finish="length")
    reply = await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL], max_tokens=2)
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content == "I cannot check the weather."
    assert reply.choices[0].message.tool_calls is None


async def test_openai_reasoning_content():
    app, _ = scripted_app(["<think>", "Paris is in France.", "</think>", "\n\nParis."])
    reply = await openai_sdk(app).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "?"}])
    message = reply.choices[0].message
    assert message.content == "Paris."
    assert message.model_extra["reasoning_content"] == "Paris is in France."


async def test_openai_logprobs_streamed_and_not():
    app, _ = scripted_app(["Hel", "lo"], logprobs=True)
    sdk = openai_sdk(app)
    reply = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                              logprobs=True, top_logprobs=1)
    content = reply.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in content] == [("Hel", -0.25), ("lo", -0.25)]
    assert content[0].top_logprobs[0].token == "Hel" and content[0].bytes == list(b"Hel")

    app, _ = scripted_app(["Hel", "lo"], logprobs=True)
    stream = await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=1, stream=True)
    entries = [e async for chunk in stream for choice in chunk.choices if choice.logprobs
               for e in choice.logprobs.content or []]
    assert [e.token for e in entries] == ["Hel", "lo"]


async def test_openai_completions_logprobs():
    app, _ = scripted_app(["Hel", "lo"], logprobs=True)
    reply = await openai_sdk(app).completions.create(model=MODEL, prompt="hi", logprobs=1)
    logprobs = reply.choices[0].logprobs
    assert logprobs.tokens == ["Hel", "lo"] and logprobs.token_logprobs == [-0.25, -0.25]


# -- Anthropic ------------------------------------------------------------------------

ANTHROPIC_TOOL = {"name": "get_weather", "description": "Current weather in a city",
                  "input_schema": WEATHER_TOOL["function"]["parameters"]}


async def test_anthropic_tool_use_round_trip():
    app, cluster = scripted_app(HERMES_CALL)
    sdk = anthropic_sdk(app)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = await sdk.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=[ANTHROPIC_TOOL],
                                      tool_choice={"type": "auto"})
    assert reply.stop_reason == "tool_use"
    (block,) = reply.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.input == {"city": "Paris"}
    assert cluster.params().tool_choice == "auto"

    app2, cluster2 = scripted_app(["Sunny."])
    follow_up = await anthropic_sdk(app2).messages.create(model=MODEL, max_tokens=64, tools=[ANTHROPIC_TOOL], messages=[
        *messages,
        {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny, 21C"}]},
    ])
    assert follow_up.content[0].text == "Sunny." and follow_up.stop_reason == "end_turn"
    sent = cluster2.params().messages
    assert [(m.role, m.tool_call_id) for m in sent] == [("user", None), ("assistant", None), ("tool", block.id)]
    assert json.loads(sent[1].tool_calls[0].arguments) == {"city": "Paris"}


async def test_anthropic_streamed_thinking_and_tool_use():
    app, _ = scripted_app(["<think>need weather</think>", *LLAMA_CALL])
    sdk = anthropic_sdk(app)
    async with sdk.messages.stream(model=MODEL, max_tokens=64, tools=[ANTHROPIC_TOOL],
                                   messages=[{"role": "user", "content": "Weather?"}]) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[0].thinking == "need weather"
    assert final.content[1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


# -- Ollama ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_ollama_chat_with_tools(stream):
    app, cluster = scripted_app(HERMES_CALL)
    client = ollama_sdk(app)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    if stream:
        parts = [part async for part in await client.chat(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                          stream=True)]
        calls = [c for part in parts for c in part.message.tool_calls or []]
        assert parts[-1].done
    else:
        reply = await client.chat(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
        calls = reply.message.tool_calls
    (call,) = calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert cluster.params().tools[0].name == "get_weather"

    app2, cluster2 = scripted_app(["Sunny."])
    reply = await ollama_sdk(app2).chat(model=MODEL, tools=[WEATHER_TOOL], messages=[
        *messages,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny, 21C", "tool_name": "get_weather"},
    ])
    assert reply.message.content == "Sunny."
    sent = cluster2.params().messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]
    assert sent[1].tool_calls[0].name == "get_weather"


async def test_ollama_thinking():
    app, _ = scripted_app(["<think>hmm</think>", "Paris."])
    reply = await ollama_sdk(app).chat(model=MODEL, messages=[{"role": "user", "content": "?"}])
    assert (reply.message.thinking, reply.message.content) == ("hmm", "Paris.")


