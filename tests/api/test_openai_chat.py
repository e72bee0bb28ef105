"""The OpenAI chat adapter: request normalisation, SSE serialisation, response collection,
and the error shapes it relies on."""

from __future__ import annotations

import json

import pytest

from skulk.api.adapters.openai_chat import (
    MIN_TOP_P,
    SSE_DONE,
    ChatStreamEncoder,
    collect_response,
    command_id_from,
    model_list,
    parse_request,
    sse_error,
    to_params,
)
from skulk.api.errors import (
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    StreamFailed,
    openai_error_body,
    openai_error_status,
    param_from_loc,
    wire_shape_for,
)
from skulk.shared.types.chunks import TokenChunk, TopLogprob
from skulk.shared.types.common import ToolCall, Usage
from skulk.shared.types.instances import Instance, InstanceCapacity, ShardAssignment

MODEL = "local/tiny-llama"
USER = {"role": "user", "content": "hi"}


def body(**fields):
    return {"model": MODEL, "messages": [USER], **fields}


def params(**fields):
    return to_params(parse_request(body(**fields)))


# ---------------------------------------------------------------------------------------
# to_params: valid requests
# ---------------------------------------------------------------------------------------


def test_minimal_request():
    p = params()
    assert p.model_id == MODEL
    assert [(m.role, m.content) for m in p.messages] == [("user", "hi")]
    assert (p.max_tokens, p.temperature, p.top_p, p.stop, p.stream, p.logprobs) == (None, None, None, [], False, False)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 7}, {"max_tokens": 7}),
        ({"max_completion_tokens": 9, "max_tokens": 7}, {"max_tokens": 9}),
        ({"temperature": 0}, {"temperature": 0.0}),
        ({"temperature": 2}, {"temperature": 2.0}),
        ({"top_p": 1}, {"top_p": 1.0}),
        ({"top_p": 0}, {"top_p": MIN_TOP_P}),
        ({"top_k": 40}, {"top_k": 40}),
        ({"seed": 42}, {"seed": 42}),
        ({"stop": "END"}, {"stop": ["END"]}),
        ({"stop": ["a", "b", "c", "d"]}, {"stop": ["a", "b", "c", "d"]}),
        ({"stop": None}, {"stop": []}),
        ({"n": 1}, {}),
        ({"stream": True, "stream_options": {"include_usage": True}}, {"stream": True}),
        ({"logprobs": True, "top_logprobs": 3}, {"logprobs": True, "top_logprobs": 3}),
        ({"user": "u-1", "frequency_penalty": 0.5, "response_format": {"type": "text"}, "store": False}, {}),
    ],
)
def test_parameters_map_to_params(fields, expected):
    p = params(**fields)
    for name, value in expected.items():
        assert getattr(p, name) == value


def test_content_parts_roles_and_tool_history():
    p = to_params(parse_request({
        "model": MODEL,
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "2"},
        ],
        "tools": [{"type": "function", "function": {"name": "add", "description": "adds",
                                                     "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "add"}},
    }))
    assert [m.role for m in p.messages] == ["system", "user", "assistant", "tool"]
    assert p.messages[1].content == "one\ntwo"
    assert p.messages[2].tool_calls == [ToolCall(id="call_1", name="add", arguments="{\"a\":1}")]
    assert p.messages[3].tool_call_id == "call_1"
    assert [(t.name, t.description, t.parameters) for t in p.tools] == [("add", "adds", {"type": "object"})]
    assert p.tool_choice == {"type": "function", "function": {"name": "add"}}


# ---------------------------------------------------------------------------------------
# to_params: every invalid parameter is a 400 naming it
# ---------------------------------------------------------------------------------------

INVALID = {
    "model-missing": ({"messages": [USER]}, "model"),
    "model-empty": ({"model": " ", "messages": [USER]}, "model"),
    "messages-missing": ({"model": MODEL}, "messages"),
    "messages-empty": (body(messages=[]), "messages"),
    "messages-not-a-list": (body(messages="hi"), "messages"),
    "role-unknown": (body(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
    "role-missing": (body(messages=[{"content": "x"}]), "messages[0].role"),
    "content-number": (body(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    "content-audio": (body(messages=[USER, {"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {"data": "AAAA"}}]}]),
        "messages[1].content[1].type"),
    "content-image-unfetched": (body(messages=[USER, {"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "http://x"}}]}]),
        "messages[1].content[1].image_url.url"),
    "content-image-ftp": (body(messages=[USER, {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "ftp://x/a.png"}}]}]),
        "messages[1].content[0].image_url.url"),
    "content-image-detail": (body(messages=[USER, {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "high"}}]}]),
        "messages[1].content[0].image_url.detail"),
    "content-marker": (body(messages=[{"role": "user", "content": "see <|skulk-image|> here"}]),
        "messages[0].content"),
    "content-part-without-text": (body(messages=[{"role": "user", "content": [{"type": "text"}]}]),
                                  "messages[0].content[0].text"),
    "content-missing": (body(messages=[{"role": "user"}]), "messages[0].content"),
    "tool-without-call-id": (body(messages=[{"role": "tool", "content": "2"}]), "messages[0].tool_call_id"),
    "user-with-tool-calls": (body(messages=[{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]), "messages[0].tool_calls"),
    "temperature-high": (body(temperature=2.5), "temperature"),
    "temperature-negative": (body(temperature=-0.1), "temperature"),
    "temperature-text": (body(temperature="hot"), "temperature"),
    "top-p-high": (body(top_p=1.5), "top_p"),
    "top-p-negative": (body(top_p=-1), "top_p"),
    "top-k-negative": (body(top_k=-1), "top_k"),
    "n-above-the-bound": (body(n=9), "n"),
    "n-zero": (body(n=0), "n"),
    "max-tokens-zero": (body(max_tokens=0), "max_tokens"),
    "max-tokens-text": (body(max_tokens="many"), "max_tokens"),
    "max-completion-tokens-negative": (body(max_completion_tokens=-3), "max_completion_tokens"),
    "stop-too-many": (body(stop=["a", "b", "c", "d", "e"]), "stop"),
    "stop-empty": (body(stop=[""]), "stop"),
    "stop-number": (body(stop=5), "stop"),
    "seed-text": (body(seed="x"), "seed"),
    "stream-options-bad": (body(stream=True, stream_options={"include_usage": "sometimes"}),
                           "stream_options.include_usage"),
    "top-logprobs-high": (body(logprobs=True, top_logprobs=21), "top_logprobs"),
    "top-logprobs-without-logprobs": (body(top_logprobs=2), "top_logprobs"),
    "tools-not-function": (body(tools=[{"type": "code_interpreter", "function": {"name": "x"}}]), "tools[0].type"),
    "tools-without-function": (body(tools=[{"type": "function"}]), "tools[0].function"),
    "tool-choice-word": (body(tool_choice="always"), "tool_choice"),
    "tool-choice-required-without-tools": (body(tool_choice="required"), "tool_choice"),
    "tool-choice-unknown-function": (body(tools=[{"type": "function", "function": {"name": "a"}}],
                                          tool_choice={"type": "function", "function": {"name": "b"}}), "tool_choice"),
    "tool-choice-malformed": (body(tool_choice={"type": "function"}), "tool_choice"),
}


@pytest.mark.parametrize(("request_body", "param"), INVALID.values(), ids=INVALID.keys())
def test_invalid_parameters_are_400s_naming_the_parameter(request_body, param):
    with pytest.raises(InvalidRequest) as raised:
        to_params(parse_request(request_body))
    error = raised.value
    assert error.param == param
    assert openai_error_status(error) == 400
    wire = openai_error_body(error)["error"]
    assert wire["type"] == "invalid_request_error" and wire["param"] == param and wire["message"]


# ---------------------------------------------------------------------------------------
# SSE serialisation
# ---------------------------------------------------------------------------------------


def token(text: str, **fields) -> TokenChunk:
    return TokenChunk(command_id="c1", text=text, **fields)


def decode(events: list[str]) -> list[dict | str]:
    out = []
    for event in events:
        assert event.startswith("data: ") and event.endswith("\n\n")
        data = event[len("data: "):-2]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_of(encoder: ChatStreamEncoder, chunks: list[TokenChunk]) -> list[dict | str]:
    events = encoder.start()
    for chunk in chunks:
        events += encoder.chunk_to_sse(chunk)
    return decode(events + encoder.finish())


def test_sse_stream_shape():
    encoder = ChatStreamEncoder(command_id="c1", model=MODEL, created=123)
    objects = stream_of(encoder, [token("Hel"), token("lo", finish_reason="length")])
    assert objects[-1] == "[DONE]"
    chunks = objects[:-1]
    assert {(c["id"], c["object"], c["created"], c["model"]) for c in chunks} == {
        ("chatcmpl-c1", "chat.completion.chunk", 123, MODEL)}
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""}, {"content": "Hel"}, {"content": "lo"}, {}]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert all("usage" not in c for c in chunks)


def test_sse_usage_chunk_when_asked():
    encoder = ChatStreamEncoder(command_id="c1", model=MODEL, created=1, include_usage=True)
    usage = Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7)
    objects = stream_of(encoder, [token("a"), token("b", finish_reason="stop", usage=usage)])
    *chunks, usage_chunk, done = objects
    assert done == "[DONE]"
    assert all(c["usage"] is None for c in chunks)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0}}


def test_sse_usage_falls_back_to_counting_tokens():
    encoder = ChatStreamEncoder(command_id="c1", model=MODEL, created=1, include_usage=True)
    objects = stream_of(encoder, [token("a"), token("b")])
    assert objects[-2]["usage"]["completion_tokens"] == 2


def test_sse_tool_calls_reasoning_and_logprobs():
    encoder = ChatStreamEncoder(command_id="c1", model=MODEL, created=1, logprobs=True)
    objects = stream_of(encoder, [
        token("hmm", reasoning=True),
        token("", tool_calls=[ToolCall(id="t1", name="add", arguments="{}")]),
        token("", tool_calls=[ToolCall(id="t2", name="mul", arguments="{}")]),
        token("ok", logprob=-0.5, top_logprobs=[TopLogprob(token="ok", logprob=-0.5)], finish_reason="stop"),
    ])
    deltas = [c["choices"][0]["delta"] for c in objects[:-1]]
    assert deltas[1] == {"reasoning_content": "hmm"}
    assert [d["tool_calls"][0]["index"] for d in deltas[2:4]] == [0, 1]
    assert deltas[2]["tool_calls"][0] == {"index": 0, "id": "t1", "type": "function",
                                          "function": {"name": "add", "arguments": "{}"}}
    logprobs = objects[4]["choices"][0]["logprobs"]["content"][0]
    assert (logprobs["token"], logprobs["logprob"], logprobs["bytes"]) == ("ok", -0.5, [111, 107])
    assert objects[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_sse_error_event_then_done():
    events = sse_error(StreamFailed("RunnerCrashed", "segfault"))
    assert events[-1] == SSE_DONE
    error = decode(events)[0]["error"]
    assert error == {"message": "segfault", "type": "server_error", "param": None, "code": "RunnerCrashed"}


# ---------------------------------------------------------------------------------------
# Non-streaming collection
# ---------------------------------------------------------------------------------------


def test_collect_response_with_runner_usage():
    usage = Usage(prompt_tokens=4, completion_tokens=2, total_tokens=6)
    response = collect_response(
        [token("Hel"), token("lo", finish_reason="length", usage=usage)], command_id="c1", model=MODEL, created=9
    )
    assert response == {
        "id": "chatcmpl-c1", "object": "chat.completion", "created": 9, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "logprobs": None,
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
                  "prompt_tokens_details": {"cached_tokens": 0}},
    }


def test_collect_response_tool_calls_reasoning_and_fallback_usage():
    response = collect_response(
        [token("think", reasoning=True), token("", tool_calls=[ToolCall(id="t", name="f", arguments="{}")])],
        command_id="c1", model=MODEL, created=0,
    )
    choice = response["choices"][0]
    assert choice["message"] == {
        "role": "assistant", "content": None, "reasoning_content": "think",
        "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert choice["finish_reason"] == "tool_calls"
    assert response["usage"] == {"prompt_tokens": 0, "completion_tokens": 2, "total_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 0}}


def test_collect_response_logprobs():
    response = collect_response([token("a", logprob=-1.0)], command_id="c1", model=MODEL, created=0, logprobs=True)
    assert response["choices"][0]["logprobs"]["content"][0]["logprob"] == -1.0


def test_empty_completion_stops():
    response = collect_response([], command_id="c1", model=MODEL, created=0)
    assert response["choices"][0]["message"]["content"] == ""
    assert response["choices"][0]["finish_reason"] == "stop"


# ---------------------------------------------------------------------------------------
# Models, ids, error shapes
# ---------------------------------------------------------------------------------------


def instance(instance_id: str, model_id: str, context: int) -> Instance:
    shard = ShardAssignment(node_id="n1", runner_id=f"r-{instance_id}", rank=0, world_size=1, start_layer=0,
                            end_layer=4, backend="mlx-cpu")
    return Instance(instance_id=instance_id, model_id=model_id, sharding="Pipeline", shards=[shard],
                    context_token_limit=context)


def test_model_list_has_each_placed_model_once_with_its_context():
    listing = model_list([instance("i2", "b/m", 100), instance("i1", "a/m", 50), instance("i3", "b/m", 300)], 7)
    assert listing == {"object": "list", "data": [
        {"id": "a/m", "object": "model", "created": 7, "owned_by": "skulk", "context_length": 50},
        {"id": "b/m", "object": "model", "created": 7, "owned_by": "skulk", "context_length": 300},
    ]}


def test_model_list_shows_the_capacity_planners_view_of_the_listed_instance():
    capacity = InstanceCapacity(effective_context_tokens=300, hot_kv_tokens=256, planner_effective_context_tokens=900,
                                gpu_layers=0, num_layers=4)
    planned = instance("i3", "b/m", 300).model_copy(update={"capacity": capacity})
    listing = model_list([instance("i2", "b/m", 100), planned], 7)
    assert listing["data"] == [{
        "id": "b/m", "object": "model", "created": 7, "owned_by": "skulk", "context_length": 300,
        "effective_context_tokens": 300, "hot_kv_tokens": 256, "gpu_layers": 0, "num_layers": 4,
    }]


def test_command_ids_accept_completion_ids():
    assert command_id_from("chatcmpl-abc") == "abc"
    assert command_id_from("abc") == "abc"


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("body", "messages", 0, "content", "str"), "messages[0].content"),
        (("body", "messages", 0, "content", "list[ContentPart]", 1, "type"), "messages[0].content[1].type"),
        (("body", "stream_options", "include_usage"), "stream_options.include_usage"),
        (("body",), None),
        (("path", "command_id"), "command_id"),
        (("temperature",), "temperature"),
    ],
)
def test_param_from_loc(loc, param):
    assert param_from_loc(loc) == param


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions", "openai"), ("/v1/models", "openai"), ("/v1/unknown", "openai"),
     ("/v1/cluster", "native"), ("/v1/diagnostics/node", "native"), ("/state", "native"), ("/v1", "native"),
     ("/store/models/a/b", "openai"), ("/store/storage", "openai"), ("/storefront", "native")],
)
def test_wire_shape_by_path(path, shape):
    assert wire_shape_for(path) == shape


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (ModelNotFound("a/b"), 404, "model_not_found"),
        (Overloaded("full"), 503, "overloaded"),
        (StreamFailed("idle_timeout", "x", origin="api"), 504, "idle_timeout"),
        (StreamFailed("MasterFailover", "x", origin="api"), 503, "MasterFailover"),
        (StreamFailed("NodeLost", "x", origin="api"), 503, "NodeLost"),
        (StreamFailed("PlacementRefused", "x", origin="api"), 503, "PlacementRefused"),
        (StreamFailed("TaskFailed", "x", origin="api"), 503, "TaskFailed"),
        (StreamFailed("TaskCancelled", "x", outcome="cancelled", origin="api"), 499, "TaskCancelled"),
        (StreamFailed("protocol_violation", "x", origin="api"), 502, "protocol_violation"),
        (StreamFailed("RunnerCrashed", "x"), 500, "RunnerCrashed"),
        (StreamFailed("cancelled", "x", outcome="cancelled"), 499, "cancelled"),
    ],
)
def test_error_statuses(error, status, code):
    assert openai_error_status(error) == status
    assert openai_error_body(error)["error"]["code"] == code


def test_model_not_found_names_the_fix():
    message = openai_error_body(ModelNotFound("a/b"))["error"]["message"]
    assert 'POST /place_instance {"modelId": "a/b"}' in message
