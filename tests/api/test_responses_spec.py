"""The Responses API as the Open Responses specification defines it: the response object
(final, and embedded in every streamed event) validated against a JSON Schema of the
specification's required fields and their types; every request field honoured or refused by
name; compaction; and the WebSocket mode."""

from __future__ import annotations

import json

import jsonschema
import pytest
from starlette.testclient import TestClient

from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import HERMES_CALL, openai_sdk

NULLABLE_STRING = {"type": ["string", "null"]}
NULLABLE_INT = {"type": ["integer", "null"]}
USAGE = {
    "type": "object",
    "required": ["input_tokens", "output_tokens", "total_tokens", "input_tokens_details", "output_tokens_details"],
    "properties": {
        "input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"},
        "input_tokens_details": {"type": "object", "required": ["cached_tokens"]},
        "output_tokens_details": {"type": "object", "required": ["reasoning_tokens"]},
    },
}
OUTPUT_TEXT = {
    "type": "object", "required": ["type", "text", "annotations", "logprobs"],
    "properties": {"type": {"const": "output_text"}, "text": {"type": "string"},
                   "annotations": {"type": "array"}, "logprobs": {"type": "array"}},
}
REASONING_TEXT = {
    "type": "object", "required": ["type", "text"],
    "properties": {"type": {"const": "reasoning_text"}, "text": {"type": "string"}},
}
FUNCTION_TOOL = {
    "type": "object", "required": ["type", "name", "parameters", "strict"],
    "properties": {"type": {"const": "function"}, "name": {"type": "string"}, "strict": {"type": "boolean"}},
}
RESPONSE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "The Open Responses response object: every required field, with its type",
    "type": "object",
    "required": [
        "id", "object", "created_at", "completed_at", "status", "incomplete_details", "model",
        "previous_response_id", "instructions", "output", "error", "tools", "tool_choice", "truncation",
        "parallel_tool_calls", "text", "top_p", "presence_penalty", "frequency_penalty", "top_logprobs",
        "temperature", "reasoning", "user", "usage", "max_output_tokens", "max_tool_calls", "store",
        "background", "service_tier", "metadata", "safety_identifier", "prompt_cache_key",
    ],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "response"}, "created_at": {"type": "integer"},
        "completed_at": NULLABLE_INT, "status": {"type": "string"},
        "incomplete_details": {"type": ["object", "null"]}, "model": {"type": "string"},
        "previous_response_id": NULLABLE_STRING, "instructions": {"type": ["string", "array", "null"]},
        "output": {"type": "array", "items": {"type": "object", "required": ["type"], "allOf": [
            {"if": {"properties": {"type": {"const": "message"}}}, "then": {
                "required": ["id", "role", "status", "content"],
                "properties": {"content": {"type": "array", "items": OUTPUT_TEXT}}}},
            {"if": {"properties": {"type": {"const": "reasoning"}}}, "then": {
                "required": ["id", "summary"],
                "properties": {"summary": {"type": "array"}, "content": {"type": "array", "items": REASONING_TEXT}}}},
        ]}},
        "error": {"type": ["object", "null"]},
        "tools": {"type": "array", "items": FUNCTION_TOOL},
        "tool_choice": {"type": ["string", "object"]}, "truncation": {"enum": ["auto", "disabled"]},
        "parallel_tool_calls": {"type": "boolean"}, "text": {"type": "object", "required": ["format"]},
        "top_p": {"type": "number"}, "presence_penalty": {"type": "number"}, "frequency_penalty": {"type": "number"},
        "top_logprobs": {"type": "integer"}, "temperature": {"type": "number"},
        "reasoning": {"type": ["object", "null"]}, "user": NULLABLE_STRING,
        "usage": {"anyOf": [USAGE, {"type": "null"}]}, "max_output_tokens": NULLABLE_INT,
        "max_tool_calls": NULLABLE_INT, "store": {"type": "boolean"}, "background": {"type": "boolean"},
        "service_tier": {"type": "string"}, "metadata": {"type": "object"},
        "safety_identifier": NULLABLE_STRING, "prompt_cache_key": NULLABLE_STRING,
    },
}
VALIDATOR = jsonschema.Draft202012Validator(RESPONSE_SCHEMA)
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def valid(response: dict) -> dict:
    errors = sorted(VALIDATOR.iter_errors(response), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    return response


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("extra", [
    {}, {"tools": [WEATHER]}, {"temperature": 0.2, "top_p": 0.5, "top_logprobs": 2, "presence_penalty": 0.5},
    {"safety_identifier": "u-1", "prompt_cache_key": "k", "max_tool_calls": 2, "service_tier": "auto"},
])
async def test_the_response_object_has_every_required_field_streamed_or_not(extra):
    app, _ = scripted_app(["Hel", "lo"], logprobs=True)
    async with asgi_http(app) as http:
        whole = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", **extra})
        streamed = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "stream": True, **extra})
    body = valid(whole.json())
    assert body["completed_at"] >= body["created_at"] and body["status"] == "completed"
    embedded = [e["response"] for e in sse_events(streamed.text) if "response" in e]
    assert [r["status"] for r in embedded] == ["in_progress", "in_progress", "completed"]
    for response in embedded:
        valid(response)
    assert embedded[0]["completed_at"] is None and embedded[-1]["completed_at"] is not None
    if "temperature" in extra:
        assert (body["temperature"], body["top_p"], body["presence_penalty"]) == (0.2, 0.5, 0.5)
    else:
        assert isinstance(body["temperature"], float) and isinstance(body["top_p"], float)  # the defaults used
    if "tools" in extra:
        assert body["tools"][0]["strict"] is False


async def test_top_logprobs_are_reported_on_the_text_and_each_delta():
    app, cluster = scripted_app(["Hel", "lo"], logprobs=True)
    async with asgi_http(app) as http:
        whole = (await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "top_logprobs": 1})).json()
        streamed = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "top_logprobs": 1,
                                                          "stream": True})
    part = whole["output"][0]["content"][0]
    assert [(e["token"], e["logprob"]) for e in part["logprobs"]] == [("Hel", -0.25), ("lo", -0.25)]
    assert part["logprobs"][0]["top_logprobs"][0]["token"] == "Hel"
    assert cluster.params().logprobs and cluster.params().top_logprobs == 1
    deltas = [e for e in sse_events(streamed.text) if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"][0]["token"] for d in deltas] == ["Hel", "lo"]


async def test_penalties_reach_the_engine():
    app, cluster = scripted_app(["Hi"])
    await openai_sdk(app).responses.create(model=MODEL, input="hi",
                                           extra_body={"presence_penalty": 0.5, "frequency_penalty": -0.5})
    assert (cluster.params().presence_penalty, cluster.params().frequency_penalty) == (0.5, -0.5)


@pytest.mark.parametrize(("limits", "calls"), [({}, 2), ({"parallel_tool_calls": False}, 1),
                                               ({"max_tool_calls": 0}, 0), ({"max_tool_calls": 1}, 1)])
async def test_tool_call_limits_are_honoured(limits, calls):
    app, _ = scripted_app([*HERMES_CALL, *HERMES_CALL])
    async with asgi_http(app) as http:
        body = (await http.post("/v1/responses", json={"model": MODEL, "input": "Weather?", "tools": [WEATHER],
                                                       **limits})).json()
    assert len([o for o in body["output"] if o["type"] == "function_call"]) == calls
    assert body["parallel_tool_calls"] is (limits.get("parallel_tool_calls") is not False)


@pytest.mark.parametrize(("field", "value"), [
    ("background", True), ("service_tier", "flex"), ("truncation", "auto"), ("reasoning", {"summary": "auto"}),
    ("conversation", "conv_1"), ("prompt", {"id": "pmpt_1"}), ("include", ["reasoning.encrypted_content"]),
    ("stream_options", {"include_obfuscation": True}), ("prompt_cache_retention", "24h"), ("max_tool_calls", -1),
    ("top_logprobs", 21), ("presence_penalty", 3), ("not_a_field", 1),
])
async def test_a_field_skulk_cannot_honour_is_refused_by_name(field, value):
    app, cluster = scripted_app(["Hi"])
    async with asgi_http(app) as http:
        reply = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", field: value})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"].split("[")[0] == field
    assert not cluster.commands  # nothing reached the cluster


async def test_compaction_folds_a_conversation_into_its_user_messages_and_a_summary():
    app, cluster = scripted_app(["France's capital ", "is Paris."])
    sdk = openai_sdk(app)
    compacted = await sdk.responses.compact(model=MODEL, input=[
        {"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}])
    assert compacted.object == "response.compaction"
    kinds = [item.type for item in compacted.output]
    assert kinds == ["message", "compaction"]
    summary = compacted.output[-1]
    assert summary.encrypted_content == "France's capital is Paris."
    asked = cluster.params().messages
    assert [m.role for m in asked] == ["user", "assistant", "user"] and "summary" in asked[-1].content
    # the summary is bounded, so the compacted conversation fits the context again
    from tests.api.test_openai_routes import INSTANCE
    assert cluster.params().max_tokens == min(1024, INSTANCE.context_token_limit // 4)
    # the compacted items continue the conversation: the summary becomes an assistant turn
    app2, cluster2 = scripted_app(["Lyon."])
    items = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    reply = await openai_sdk(app2).responses.create(model=MODEL, input=[*items, {"role": "user",
                                                                                  "content": "And the second city?"}])
    assert reply.output_text == "Lyon."
    sent = cluster2.params().messages
    assert [m.role for m in sent] == ["user", "assistant", "user"]
    assert sent[1].content.endswith("France's capital is Paris.")


async def test_compaction_without_a_conversation_is_refused():
    app, _ = scripted_app(["x"])
    async with asgi_http(app) as http:
        reply = await http.post("/v1/responses/compact", json={"model": MODEL})
        bogus = await http.post("/v1/responses/compact", json={"model": MODEL, "input": "hi", "nonsense": 1})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input"
    assert bogus.status_code == 400 and bogus.json()["error"]["param"] == "nonsense"


def turn(ws, **fields) -> list[dict]:
    ws.send_text(json.dumps({"type": "response.create", "model": MODEL, **fields}))
    events = []
    while not events or events[-1]["type"] not in ("response.completed", "response.incomplete",
                                                    "response.failed", "error"):
        events.append(json.loads(ws.receive_text()))
    return events


def test_the_websocket_mode_chains_turns_even_without_storing_them():
    app, cluster = scripted_app(["Hel", "lo"])
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as ws:
        first = turn(ws, input="hi", store=False)
        assert [e["type"] for e in first][:2] == ["response.created", "response.in_progress"]
        assert [e["sequence_number"] for e in first] == list(range(len(first)))
        final = valid(first[-1]["response"])
        assert final["store"] is False and final["output"][0]["content"][0]["text"] == "Hello"
        second = turn(ws, input="more", previous_response_id=final["id"], store=False)
        assert second[-1]["type"] == "response.completed"
        assert [(m.role, m.content) for m in cluster.all_params()[-1].messages] == [
            ("user", "hi"), ("assistant", "Hello"), ("user", "more")]
        # a bad frame or a refused field is an error event; the socket stays open
        ws.send_text("not json")
        assert json.loads(ws.receive_text())["code"] == "invalid_json"
        refused = turn(ws, input="hi", background=True)
        assert refused[-1]["type"] == "error" and refused[-1]["param"] == "background"
        assert turn(ws, input="again")[-1]["type"] == "response.completed"
    # not stored: over HTTP the chain is unknown
    with TestClient(app) as client:
        assert client.get(f"/v1/responses/{final['id']}").status_code == 404


def test_a_page_from_a_foreign_origin_cannot_open_the_websocket():
    from starlette.websockets import WebSocketDisconnect

    app, _ = scripted_app(["Hi"])
    with TestClient(app) as client:
        with pytest.raises(WebSocketDisconnect) as refused, \
                client.websocket_connect("/v1/responses", headers={"origin": "https://evil.example"}):
            pass
        assert refused.value.code == 1008
        with client.websocket_connect("/v1/responses", headers={"origin": "http://localhost:3000"}) as ws:
            assert turn(ws, input="hi")[-1]["type"] == "response.completed"
