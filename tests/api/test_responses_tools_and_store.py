"""The Responses API's function tools (stream and not) and stored responses, through the
official OpenAI SDK in-process: a tool round trip (call out, result back in), a
`previous_response_id` conversation, GET/DELETE of stored responses, scoping by API key,
and the store's bounds (LRU capacity, TTL)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from skulk.api.response_store import ResponseStore, StoredResponse, key_scope
from skulk.shared.types.common import ChatMessage
from tests.api.scripted_cluster import scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import LLAMA_CALL

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def sdk(app, key: str = "unused") -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk")
    return openai.AsyncOpenAI(base_url="http://skulk/v1", api_key=key, http_client=http, max_retries=0)


def sent(cluster) -> list:
    return cluster.all_params()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_function_tool_round_trip(stream):
    app, cluster = scripted_app(LLAMA_CALL, finish="stop")
    client = sdk(app)
    if stream:
        async with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=[WEATHER]) as events:
            kinds = [event.type async for event in events]
            first = await events.get_final_response()
        assert "response.function_call_arguments.done" in kinds
    else:
        first = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                              tool_choice={"type": "function", "name": "get_weather"})
        assert sent(cluster)[0].tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert sent(cluster)[0].tools[0].name == "get_weather"

    cluster.texts = ["Sunny."]
    second = await client.responses.create(model=MODEL, tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ])
    assert second.output_text == "Sunny."
    history = sent(cluster)[-1].messages
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    assert history[1].tool_calls[0].id == call.call_id and history[2].content == "sunny, 21 C"


async def test_previous_response_id_continues_a_stored_conversation():
    app, cluster = scripted_app(["Hi, Ada."])
    client = sdk(app)
    first = await client.responses.create(model=MODEL, instructions="Be brief.", input="I am Ada.")
    assert first.store is True
    cluster.texts = ["Ada."]
    second = await client.responses.create(model=MODEL, input="Who am I?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    messages = sent(cluster)[-1].messages
    # The stored turns, not the first request's instructions (a continuation does not inherit them).
    assert [(m.role, m.content) for m in messages] == [
        ("user", "I am Ada."), ("assistant", "Hi, Ada."), ("user", "Who am I?")]

    fetched = await client.responses.retrieve(second.id)
    assert fetched.id == second.id and fetched.output_text == "Ada."
    await client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.create(model=MODEL, input="Again?", previous_response_id=second.id)
    assert missing.value.body["param"] == "previous_response_id"


async def test_streamed_responses_are_stored_and_store_false_is_not():
    app, _ = scripted_app(["Hello"])
    client = sdk(app)
    async with client.responses.stream(model=MODEL, input="hi") as events:
        streamed = await events.get_final_response()
    assert (await client.responses.retrieve(streamed.id)).output_text == "Hello"
    unkept = await client.responses.create(model=MODEL, input="hi", store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unkept.id)


async def test_stored_responses_are_scoped_to_the_api_key():
    app, _ = scripted_app(["Hello"], context_fields={"api_key": "k1"})
    mine = await sdk(app, "k1").responses.create(model=MODEL, input="hi")
    assert (await sdk(app, "k1").responses.retrieve(mine.id)).id == mine.id
    # Same node, same key required: with an open API and another caller's key, nothing.
    open_app, _ = scripted_app(["Hello"])
    theirs = await sdk(open_app, "alice").responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.NotFoundError):
        await sdk(open_app, "bob").responses.retrieve(theirs.id)


def item(scope: str, at: float) -> StoredResponse:
    return StoredResponse(scope, at, {"id": "x"}, (ChatMessage(role="user", content="hi"),))


@pytest.mark.parametrize(("scope", "now", "found"), [
    (key_scope("k"), 10.0, True), (key_scope("other"), 10.0, False), (key_scope("k"), 10.0 + 3601, False)])
def test_the_store_checks_scope_and_ttl(scope, now, found):
    store = ResponseStore(capacity=4, ttl_s=3600)
    store.put("r", item(key_scope("k"), 10.0))
    assert (store.get("r", scope, now) is not None) is found


def test_the_store_drops_the_least_recently_used_beyond_capacity():
    store = ResponseStore(capacity=2)
    for name in ("a", "b"):
        store.put(name, item("", 0.0))
    assert store.get("a", "", 1.0) is not None  # a is now more recent than b
    store.put("c", item("", 0.0))
    assert store.get("b", "", 1.0) is None and store.get("a", "", 1.0) and store.get("c", "", 1.0)
    assert len(store) == 2
